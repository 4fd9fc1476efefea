"""The search's decisions on recorded timings (no processes, simulated clock)."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

import pytest

from tuneup.autotune.trials import Trial, TrialResult
from tuneup.autotune.search.confirm import simpler_alternative
from tuneup.autotune.search import policy
from tuneup.autotune.search import Change, Options, Search, SearchError, describe, loss_drift
from tuneup.autotune.space import GROUPS, ScriptFacts
from tuneup.settings import Knobs

CPU = ScriptFacts(device="cpu", effective_batch=256, dataset_size=8192, amp_dtypes=("bfloat16",),
               compile_available=True, cpu_threads=2, usable_cores=2)
FP32_LOSSES = [2.30, 2.25, 2.20]
JITTER = [1.0, 1.01, 0.99, 1.005, 0.995, 1.0, 1.01, 0.99]


def record(step_s: float, warmup_s: float = 0.5, wait: float = 0.0, losses=FP32_LOSSES,
           status: str = "ok") -> dict:
    return {"status": status, "step_s_all": [step_s * j for j in JITTER], "warmup_s": warmup_s,
            "data_wait_share": wait, "check_losses": losses, "peak_memory_bytes": 2**30,
            "message": "" if status == "ok" else "out of memory"}


class Recorded:
    """An executor that answers trials from recorded timings and advances a simulated clock."""

    def __init__(self, timing: Callable[[Knobs], dict], facts: ScriptFacts = CPU,
                 budget: float = 300.0, startup_s: float = 2.0,
                 warm_compile_share: float = 0.15, reuse: bool = False) -> None:
        self.timing = timing
        self.reuse = reuse  # one process goes on from plan to plan, as the runner's
        self.facts = facts
        self.startup_s = startup_s
        self.budget = budget
        self.warm_compile_share = warm_compile_share
        self.clock = 0.0
        self.ran: list[Trial] = []
        self.plans: list[list[str]] = []
        self.cache: set[Knobs] = set()  # compiled knobs in the run's inductor cache
        self.compiled: Knobs | None = None  # the knobs the live process holds graphs for

    def time_left(self) -> float:
        return self.budget - self.clock

    def live_process(self) -> bool:
        return self.reuse and bool(self.plans)

    def held_graphs(self) -> Knobs | None:
        return self.compiled if self.live_process() else None

    def run(self, trials, stop=None):
        """One process: as the child, it keeps the graphs of the compiled knobs it ran last,
        so a re-run of them (or of them with other loader knobs) pays no compile time; knobs
        compiled in an earlier process compile from the run's cache in
        ``warm_compile_share`` of the time (1.4 s of 11.4 s measured on
        docs/examples/train_images.py)."""
        if not self.live_process():
            self.clock += self.startup_s
            self.compiled = None
        self.plans.append([t.id for t in trials])
        results = []
        for trial in trials:
            if results and stop and stop(results[-1]):
                results.append(TrialResult(trial, "skipped"))
                continue
            data = self.timing(trial.knobs)
            if trial.knobs.compile_mode:
                eager = self.timing(replace(trial.knobs, compile_mode=None))["warmup_s"]
                graphs = trial.knobs.without_loader()  # loader knobs share the graphs
                if graphs == self.compiled:
                    data = {**data, "warmup_s": eager}
                elif graphs in self.cache:
                    share = self.warm_compile_share
                    data = {**data, "warmup_s": eager + share * (data["warmup_s"] - eager)}
                self.compiled = graphs
                self.cache.add(graphs)
            if not trial.check:
                data = {**data, "check_losses": None}
            self.ran.append(trial)
            self.clock += data["warmup_s"] + 12 * data["step_s_all"][0]
            results.append(TrialResult.from_event(trial, data))
        return results


def compute_bound(knobs: Knobs, compile_s: float = 16.0) -> dict:
    step = 0.10
    if knobs.amp_dtype == "bfloat16":
        step *= 0.5
    if knobs.cpu_threads == 1:
        step *= 1.8
    warmup = 0.5
    if knobs.compile_mode:
        step *= 0.8
        warmup += compile_s
    return record(step, warmup)


def search(timing, options: Options | None = None, **executor) -> tuple[Search, Recorded]:
    recorded = Recorded(timing, **executor)
    return Search(recorded, options or Options()), recorded


def test_compute_bound_takes_bf16_and_compile_when_it_pays_off():
    tuner, recorded = search(compute_bound)
    outcome = tuner.run()
    assert outcome.knobs.amp_dtype == "bfloat16"
    assert outcome.knobs.compile_mode == "default"
    assert outcome.knobs.num_workers is None and outcome.knobs.cpu_threads is None
    assert outcome.speedup == pytest.approx(1 / (0.5 * 0.8), rel=0.05)


def test_compile_rejected_when_its_compile_time_is_not_repaid():
    # saves 0.2 * 50 ms = 10 ms/step; 1000 steps repay 10 s, less than 16 s of compiling
    options = Options(expected_steps=1000, groups=frozenset({"amp", "compile"}))
    tuner, _ = search(compute_bound, options)
    outcome = tuner.run()
    assert outcome.knobs.compile_mode is None
    reasons = [r.reason for r in outcome.rejected if "compile" in r.trial_id]
    assert reasons and "not repaid" in reasons[0] and "1000 steps" in reasons[0]


def test_compile_skipped_when_it_does_not_fit_the_budget():
    tuner, recorded = search(compute_bound, budget=40)
    outcome = tuner.run()
    assert outcome.knobs.compile_mode is None
    assert not any(t.knobs.compile_mode for t in recorded.ran)
    assert any("compile" in note and "budget" in note for note in outcome.notes)


def test_compile_skipped_says_how_much_more_budget_it_needs():
    tuner, _ = search(compute_bound, budget=40)
    (note,) = [n for n in tuner.run().notes if n.startswith("compile:")]
    needed = float(note.split("needs ~")[1].split(" s more")[0])
    assert 0 < needed < 60  # what is missing, not the stage's whole cost
    tuner, recorded = search(compute_bound, budget=40 + needed + 1)
    tuner.run()
    assert any(t.knobs.compile_mode for t in recorded.ran)


def test_a_process_that_lives_on_from_plan_to_plan_is_priced_no_start_up():
    """With the child waiting for its next plan only the first plan pays a start-up, and
    the budget knows it: a budget whose start-ups leave compile out holds it then (on
    train_images a 120 s search started eight processes of 3.5-4.4 s each)."""
    tuner, recorded = search(compute_bound, budget=50, startup_s=4.0)
    tuner.run()
    assert not any(t.knobs.compile_mode for t in recorded.ran)
    tuner, recorded = search(compute_bound, budget=50, startup_s=4.0, reuse=True)
    outcome = tuner.run()
    assert outcome.knobs.compile_mode == "default" and outcome.confirmed
    assert recorded.clock <= 50


def test_a_compile_slower_than_guessed_ends_its_first_process_for_the_confirmation():
    """The first compile process plans its rounds before a compile has been measured; a
    compile that takes 30 s (the guess before one is measured is 20 s) ends it early, so
    the confirmation still fits in the budget."""
    tuner, recorded = search(lambda knobs: compute_bound(knobs, compile_s=30.0), budget=90)
    outcome = tuner.run()
    first = next(p for p in recorded.plans if any("compile" in t for t in p))
    assert len(ran_of(recorded, first)) < len(first)
    assert outcome.confirmed and recorded.clock <= 90


def test_a_budget_that_holds_one_confirmation_round_re_runs_compile_beside_eager():
    """Two rounds do not fit after a slow compile, one does: it re-runs the compiled pick
    beside its eager side (compile is the change decided on the fewest runs) and the
    result says the confirmation had one round."""
    tuner, recorded = search(lambda knobs: compute_bound(knobs, compile_s=30.0), budget=90)
    outcome = tuner.run()
    assert outcome.confirmed and recorded.clock <= 90
    assert sorted(t.split(" #")[0] for t in recorded.plans[-1]) == [
        "amp=bfloat16", "amp=bfloat16,compile=default"]
    assert any(n.startswith("confirm: one round") for n in outcome.notes)
    assert outcome.knobs.compile_mode == "default"


def test_a_stage_visited_again_holds_compile_s_share():
    """bfloat16 pays off only once workers feed the model, and then shortens the step of an
    input-bound loop after the loader stages: the prefetch stage's second visit only
    re-checks, and leaves compile its share (on docs/examples/train_images.py a 30 s
    prefetch race left compile no room). A deeper prefetch is 5 % slower before bfloat16,
    so the first visit does not take it on a tie."""
    def timing(knobs: Knobs) -> dict:
        data = input_bound(knobs)
        if knobs.amp_dtype and knobs.num_workers:
            data = {**data, "step_s_all": [s * 0.6 for s in data["step_s_all"]],
                    "data_wait_share": 0.3}
        elif knobs.prefetch_factor:
            data = {**data, "step_s_all": [s * 1.05 for s in data["step_s_all"]]}
        return data

    tuner, recorded = search(timing, budget=150)
    reserves: dict[str, float] = {}
    tuner.on_stage = lambda name: reserves.update({name: tuner.budget.reserve_s})
    tuner.run()
    assert reserves.get("loader_extras (again)", 0.0) > 0
    assert any(t.knobs.compile_mode for t in recorded.ran)


@pytest.mark.parametrize("losses, reason", [
    ([2.30, 2.60, 2.90], "left the fp32 trajectory by 31.8%"),
    ([2.30, math.nan, 2.2], "non-finite"),
])
def test_dtype_rejected_when_its_losses_drift_or_blow_up(losses, reason):
    def timing(knobs: Knobs) -> dict:
        data = compute_bound(knobs)
        return {**data, "check_losses": losses} if knobs.amp_dtype else data

    tuner, recorded = search(timing, Options(groups=frozenset({"amp"})))
    outcome = tuner.run()
    assert outcome.knobs.amp_dtype is None
    assert any(reason in r.reason for r in outcome.rejected if "amp=bfloat16" in r.trial_id)


def test_dtype_kept_within_the_loss_tolerance():
    def timing(knobs: Knobs) -> dict:
        data = compute_bound(knobs)
        return {**data, "check_losses": [2.31, 2.26, 2.19]} if knobs.amp_dtype else data

    outcome = search(timing, Options(groups=frozenset({"amp"})))[0].run()
    assert outcome.knobs.amp_dtype == "bfloat16"


def input_bound(knobs: Knobs) -> dict:
    """Decoding costs 0.12 s of CPU per batch, the model 0.04 s."""
    workers = knobs.num_workers or 0
    data = 0.12 / workers if workers else 0.12
    step = max(data, 0.04) if workers else data + 0.04
    step *= 1.6 if workers >= 4 else 1.0  # more workers than pay off: contention
    return record(step, warmup_s=0.5 + 0.3 * workers, wait=0.7 if step > 0.05 else 0.05)


MANY_CORES = replace(CPU, usable_cores=16, cpu_threads=16)


@pytest.mark.parametrize("shuffles", [False, True])
def test_workers_start_at_the_predicted_count_then_its_neighbours(shuffles):
    """The baseline waits 0.112 of its 0.16 s step: hiding that behind the 0.048 s left
    takes 0.112 / 0.048 x 1.25 (headroom) -> 3 workers, tried first, then 6 and 1; not a
    ladder from 1 (16 never runs)."""
    tuner, recorded = search(input_bound, Options(groups=frozenset({"loader"})),
                             facts=replace(MANY_CORES, shuffles=shuffles))
    outcome = tuner.run()
    tried = [t.knobs.num_workers for t in recorded.ran if t.knobs.num_workers]
    assert tried[0] == 3 and sorted(set(tried)) == [1, 3, 6]
    assert outcome.knobs.num_workers == 3
    if shuffles:  # persistent workers would change a seeded shuffle's order: said, not done
        assert outcome.knobs.persistent_workers is None
        assert any("changes the shuffle order" in note for note in outcome.notes)
    else:
        assert outcome.knobs.persistent_workers is True  # 0.9 s start-up per 1.3 s epoch


def test_stages_run_in_order_of_their_ceilings():
    """Input-bound (the loop waits 70 % of the step): the loader can gain up to 3.3x, amp
    at most 1.25x on the 30 % left (bfloat16 at most 3x on a CPU), so the loader goes
    first; the micro-batch's ceiling (1.03x) is within the noise: skipped, with the reason."""
    stages: list[str] = []
    tuner = Search(Recorded(input_bound, facts=MANY_CORES), Options(), on_stage=stages.append)
    outcome = tuner.run()
    assert stages[:2] == ["baseline", "loader"]
    assert stages.index("amp") > stages.index("loader")
    assert "batch" not in stages
    assert "batch: at most 1.03x here, a CPU micro-batch gains at most cache effects; " \
        "skipped" in outcome.notes


def test_without_amp_an_input_bound_baseline_visits_the_loader_first():
    stages: list[str] = []
    options = Options(groups=frozenset({"loader", "threads", "batch"}))
    Search(Recorded(input_bound, facts=MANY_CORES), options, on_stage=stages.append).run()
    assert stages[:2] == ["baseline", "loader"]


def test_a_stage_whose_ceiling_is_within_noise_is_skipped_with_why():
    """The H200 images case on a CPU: the loop waits for data 88 % of the step; amp can at
    most shrink the 12 % of compute, so it is not measured at all."""
    def timing(knobs: Knobs) -> dict:
        if knobs.num_workers:
            return record(0.03, wait=0.05)
        return record(0.25, wait=0.88)

    options = Options(groups=frozenset(GROUPS))
    tuner, recorded = search(timing, options, facts=MANY_CORES, budget=60)
    outcome = tuner.run()
    assert outcome.knobs.num_workers
    assert not any(t.knobs.amp_dtype for t in recorded.ran[:4])


def test_a_ceiling_below_one_window_s_spread_is_tried_where_the_budget_holds_rounds():
    """The defaults' windows swing by 20 %: one window each cannot show a 9 % gain, six
    paired rounds can (their mean varies by 1/sqrt(6) of a window's spread). A budget with
    room for them tries the stage; one without skips it."""
    ceiling = policy.Ceiling("cudnn", 1.09, "the device takes 70% of the step")
    tried = {}
    for budget in (300.0, 12.0):
        tuner, _ = search(lambda knobs: record(0.1), budget=budget)
        tuner.results = [TrialResult.from_event(Trial("defaults", Knobs()), record(step))
                         for step in (0.1, 0.12, 0.1, 0.12)]
        tuner.budget.typical = tuner.results[0]
        tried[budget] = tuner.worth_trying(ceiling)
    assert tried == {300.0: True, 12.0: False}


def test_tie_keeps_the_simpler_settings():
    def timing(knobs: Knobs) -> dict:  # one thread is 1% faster: within noise
        return record(0.099 if knobs.cpu_threads == 1 else 0.1)

    outcome = search(timing, Options(groups=frozenset({"threads"})))[0].run()
    assert outcome.knobs == Knobs()
    assert any(r.reason.startswith("within noise (") for r in outcome.rejected)


def oom_above(size: int, timing: Callable[[Knobs], dict]) -> Callable[[Knobs], dict]:
    """``timing``, except that micro-batches above ``size`` samples run out of memory."""
    def fits(knobs: Knobs) -> dict:
        too_big = (knobs.micro_batch_size or CPU.effective_batch) > size
        return record(0.1, status="oom") if too_big else timing(knobs)
    return fits


def test_a_baseline_that_does_not_fit_is_tuned_and_confirmed_on_a_micro_batch_that_does():
    """The user's batch of 256 runs out of memory: the largest micro-batch that fits is the
    baseline, every later setting keeps it, and the confirmation measures the pick against
    it (not against the defaults, which cannot run)."""
    outcome = search(oom_above(64, compute_bound))[0].run()
    assert outcome.knobs.micro_batch_size == 64 and outcome.knobs.amp_dtype == "bfloat16"
    assert outcome.confirmed and outcome.speedup_interval is not None
    assert any(n.startswith("baseline: the batch of 256 does not fit in memory; "
                            "micro-batches of 64 do") for n in outcome.notes)


def test_keeping_the_baseline_keeps_the_micro_batch_that_fits():
    """Nothing beats the fitting micro-batch: what is kept is it, not PyTorch defaults (the
    user's next run would run out of memory again)."""
    outcome = search(oom_above(64, lambda knobs: record(0.1)))[0].run()
    assert outcome.knobs == outcome.baseline_knobs == Knobs(micro_batch_size=64)
    assert outcome.confirmed and outcome.speedup is None  # no speed-up claimed for it
    assert "confirm: nothing beat micro_batch=64 (the largest micro-batch that fits) beyond " \
        "noise; keeping it" in outcome.notes
    assert not any(r.trial_id == "micro_batch=64" for r in outcome.rejected)  # not against itself


def test_defaults_no_stage_moved_from_are_never_rejected_against_themselves():
    outcome = search(lambda knobs: record(0.1))[0].run()
    assert outcome.knobs == Knobs() and outcome.confirmed
    assert not any(r.trial_id == "defaults" for r in outcome.rejected)


def test_failed_candidate_is_rejected_with_its_cause():
    def timing(knobs: Knobs) -> dict:
        if knobs.micro_batch_size == 128:
            return record(0.05, status="oom")
        return compute_bound(knobs)

    outcome = search(timing, Options(groups=frozenset({"batch"})))[0].run()
    assert outcome.knobs.micro_batch_size is None
    assert outcome.rejected[0].reason == "oom: out of memory"


def test_smaller_micro_batch_with_accumulation_when_faster():
    def timing(knobs: Knobs) -> dict:
        return record({None: 0.1, 128: 0.07, 64: 0.08, 32: 0.09}[knobs.micro_batch_size])

    tuner, recorded = search(timing, Options(groups=frozenset({"batch"})))
    outcome = tuner.run()
    assert outcome.knobs.micro_batch_size == 128
    assert 32 not in {t.knobs.micro_batch_size for t in recorded.ran}  # stopped after 64


def test_nothing_better_keeps_defaults():
    outcome = search(lambda knobs: record(0.1))[0].run()
    assert outcome.knobs == Knobs()
    assert outcome.speedup is None


def test_failing_baseline_is_an_error():
    with pytest.raises(SearchError, match="fails with PyTorch defaults"):
        search(lambda knobs: record(0.1, status="error"))[0].run()


def test_helpers():
    assert describe(Knobs(num_workers=2, amp_dtype="bfloat16")) == "workers=2,amp=bfloat16"
    assert describe(Knobs()) == "defaults"
    assert loss_drift([2.3, 2.2], [2.3, 2.2]) == 0
    assert loss_drift(None, [2.3]) == math.inf


def noisy_then_clean(gain_step: float) -> Callable[[Knobs], dict]:
    """bf16 measured first in a disturbed window, then cleanly at ``gain_step`` s per step."""
    calls = {"amp": 0}

    def timing(knobs: Knobs) -> dict:
        if knobs.amp_dtype is None:
            return record(0.1)
        calls["amp"] += 1
        if calls["amp"] == 1:
            data = record(0.09)
            return {**data, "step_s_all": [0.06] * 3 + [0.12] * 3 + [0.09] * 3}
        return record(gain_step)

    return timing


def test_uncertain_candidate_is_rerun_interleaved_and_kept_when_it_holds():
    tuner, recorded = search(noisy_then_clean(0.09), Options(groups=frozenset({"amp"})))
    outcome = tuner.run()
    rerun = recorded.plans[2]
    assert [trial_id.split(" #")[0] for trial_id in rerun] == \
        ["defaults", "amp=bfloat16"] * (len(rerun) // 2)
    assert ran_of(recorded, rerun) == rerun[:4]  # decided after two rounds: the rest skipped
    assert outcome.knobs.amp_dtype == "bfloat16"


def ran_of(recorded: Recorded, plan: list[str]) -> list[str]:
    ran = {t.id for t in recorded.ran}
    return [trial_id for trial_id in plan if trial_id in ran]


def test_uncertain_candidate_dropped_when_the_rerun_shows_no_gain():
    tuner, recorded = search(noisy_then_clean(0.099), Options(groups=frozenset({"amp"})))
    outcome = tuner.run()
    assert [t.split(" #")[0] for t in ran_of(recorded, recorded.plans[2])] == \
        ["defaults", "amp=bfloat16"] * 2  # raced: R C R C, a tie after two rounds
    assert outcome.knobs.amp_dtype is None  # by the race, or at the latest by the confirmation
    assert any(r.reason.startswith("within noise (") for r in outcome.rejected) or \
        "confirm: nothing beat PyTorch defaults beyond noise; keeping defaults" in outcome.notes


CUDA = ScriptFacts(device="cuda", effective_batch=256, dataset_size=8192,
                amp_dtypes=("bfloat16", "float16"), compile_available=True, cpu_threads=16,
                usable_cores=16)


def host_bound(knobs: Knobs) -> dict:
    """compute_bound with the device busy 70 % of each step: the rest is host time."""
    data = compute_bound(knobs)
    return {**data, "device_s": 0.7 * data["step_s_all"][0]}


def test_cuda_run_tries_its_own_knobs_and_never_threads():
    tuner, recorded = search(host_bound, facts=CUDA, budget=600)
    outcome = tuner.run()
    tried = {k for t in recorded.ran for k, v in t.knobs.to_dict().items() if v is not None}
    assert {"amp_dtype", "cudnn_benchmark", "compile_mode"} <= tried
    assert "cpu_threads" not in tried
    modes = {t.knobs.compile_mode for t in recorded.ran if t.knobs.compile_mode}
    assert modes == {"default", "reduce-overhead"}
    assert outcome.knobs.compile_mode is not None
    # bfloat16 won: float16 and TF32 run at its tensor-core rate or below, not raced
    assert {t.knobs.amp_dtype for t in recorded.ran} == {None, "bfloat16"}
    assert "float32_matmul_precision" not in tried


def test_float16_and_tf32_are_tried_where_bfloat16_breaks_the_numerics():
    def drifting_bfloat16(knobs: Knobs) -> dict:
        data = host_bound(knobs)
        if knobs.amp_dtype == "bfloat16":
            data["check_losses"] = [2.30, 2.9, 3.6]
        return data

    tuner, recorded = search(drifting_bfloat16, facts=CUDA, budget=600)
    tuner.run()
    tried = [t.knobs for t in recorded.ran]
    assert tried.index(Knobs(amp_dtype="bfloat16")) < tried.index(Knobs(amp_dtype="float16"))
    assert Knobs(float32_matmul_precision="high") in tried


def test_cuda_graphs_are_tried_only_where_the_host_takes_time():
    """reduce-overhead (CUDA graphs) can only remove host time: a step the device keeps
    busy throughout compiles in the default mode alone, and the result says why."""
    tuner, recorded = search(compute_bound, facts=CUDA, budget=600)
    outcome = tuner.run()
    modes = {t.knobs.compile_mode for t in recorded.ran if t.knobs.compile_mode}
    assert modes == {"default"}
    assert "compile: reduce-overhead not tried: the host takes 0% of the step" in outcome.notes


def test_cuda_graphs_are_not_tried_on_host_time_the_workers_brought():
    """As on the H200 images: the step alone launches 0.2 ms of host work; beside 16
    workers the main process, short of a core, idles the device 65 % of the step. Graphs
    remove launches, not that: compile's ceiling is below 1 (its cost spread over the run)
    and the stage is skipped with why."""
    def timing(knobs: Knobs) -> dict:
        if not knobs.num_workers:  # decoding in the loop: 0.170 s of a 0.1742 s step
            return {**record(0.1742, wait=0.976), "device_s": 0.004}
        step = 0.040 * (0.9 if knobs.compile_mode else 1.0)
        return {**record(step, wait=0.25), "device_s": 0.004}

    tuner, recorded = search(timing, facts=CUDA, budget=600)
    outcome = tuner.run()
    assert not any(t.knobs.compile_mode for t in recorded.ran)
    assert ("compile: at most 0.95x here, the step's own launches take 1% of it, the rest of "
            "the host's 65% came with the workers; skipped") in outcome.notes


def test_the_step_s_own_launches_come_from_a_measured_baseline_without_workers():
    tuner = Search(Recorded(compute_bound, facts=CUDA))
    tuner.judge.facts = CUDA  # (a run reads them from the script)
    timed = {**record(0.1, wait=0.5), "device_s": 0.04}  # host: 0.1 - 0.05 - 0.04
    tuner.baseline = TrialResult.from_event(Trial("defaults", Knobs()), timed)
    assert tuner.launch_s == pytest.approx(0.01, rel=0.05)
    tuner.incumbent = Knobs(micro_batch_size=64)  # four micro-batches: four times the launches
    assert tuner.launch_s == pytest.approx(0.04, rel=0.05)
    tuner.baseline = TrialResult.from_event(Trial("defaults", Knobs()), record(0.1, wait=0.5))
    assert tuner.launch_s is None  # no device time measured: its host time is unknown
    tuner.baseline = TrialResult.from_event(Trial("workers=2", Knobs(num_workers=2)), timed)
    assert tuner.launch_s is None  # workers beside it: not the step's own


def test_cuda_graphs_with_accumulation_need_the_loss_check():
    tuner = Search(Recorded(compute_bound, facts=CUDA))
    tuner.judge.facts = CUDA
    knobs = Knobs(micro_batch_size=64, compile_mode="reduce-overhead")
    unchecked = TrialResult.from_event(Trial("graphs", knobs, check=False), record(0.05))
    assert not tuner.acceptable(unchecked)
    assert tuner.rejected[-1].reason == "CUDA graphs with accumulation need the loss check"


def test_micro_batch_shrinks_for_memory_headroom_under_max_memory():
    def timing(knobs: Knobs) -> dict:
        micro = knobs.micro_batch_size or 256
        return {**record(0.1 if micro == 256 else 0.11), "peak_memory_bytes": micro * 4 * 2**20}

    options = Options(groups=frozenset({"batch"}), max_memory_bytes=1100 * 2**20)
    outcome = search(timing, options)[0].run()
    assert outcome.knobs.micro_batch_size == 128  # 1 GiB at 256 leaves under 15 % headroom
    assert any("memory headroom" in note for note in outcome.notes)


def test_simpler_alternative_undoes_only_the_least_certain_change():
    tuner = Search(Recorded(compute_bound))
    workers = Knobs(num_workers=2)
    both = workers.replace(amp_dtype="bfloat16")
    tuner.incumbent = both.replace(persistent_workers=True)  # set by rule, not by a trial
    tuner.changes = [Change("loader", Knobs(), workers, 0.04), Change("amp", workers, both, 0.6)]
    assert simpler_alternative(tuner) == Knobs(amp_dtype="bfloat16", persistent_workers=True)
    trial = tuner.trial(simpler_alternative(tuner))
    assert trial.knobs == Knobs(amp_dtype="bfloat16")  # no worker knobs without workers
    trial.knobs.validate()


def test_cpu_loader_sweep_pairs_workers_with_the_threads_they_leave():
    def timing(knobs: Knobs) -> dict:  # 2 cores: decoding 0.12 s, model 0.05 s per batch
        workers, threads = knobs.num_workers or 0, knobs.cpu_threads or 2
        if not workers:
            return record(0.17, wait=0.7)
        step = max(0.12 / workers, 0.05 * (2 / threads) ** 0.5)
        oversubscribed = threads > max(1, 2 - workers)
        return record(step * (1.5 if oversubscribed else 1.0), wait=0.1)

    tuner, recorded = search(timing, Options(groups=frozenset({"loader", "threads"})))
    outcome = tuner.run()
    # the prediction (0.119 s of data over 0.051 s of the rest: 3, bounded by 2 cores) first
    assert recorded.plans[1] == ["defaults #2", "workers=2", "workers=2,threads=1", "workers=1",
                                 "workers=1,threads=1", "defaults #3"]
    assert (outcome.knobs.num_workers, outcome.knobs.cpu_threads) == (2, 1)


def test_cpu_amp_that_loses_on_crowded_cores_is_measured_with_the_threads_left():
    # measured on 2 cores with 2 workers (docs/benchmarks.md): threads alone tie, bfloat16
    # loses at 2 threads and wins at 1, so neither knob alone would find the pair
    speed = {(None, None): 935, (None, 1): 940, ("bfloat16", None): 899, ("bfloat16", 1): 1127}

    def timing(knobs: Knobs) -> dict:
        if not knobs.num_workers:
            return record(0.5, wait=0.6)
        if knobs.num_workers == 1:  # one worker cannot keep up: the loop waits for data
            return record(0.45, wait=0.4)
        return record(256 / speed[knobs.amp_dtype, knobs.cpu_threads], wait=0.05)

    tuner, recorded = search(timing, Options(groups=frozenset({"loader", "amp", "threads"})),
                             budget=600.0)
    outcome = tuner.run()
    def first_plan(trial: str) -> int:
        return next(i for i, plan in enumerate(recorded.plans) if trial in plan)

    assert first_plan("workers=2,amp=bfloat16") < first_plan("workers=2,amp=bfloat16,threads=1")
    assert (outcome.knobs.num_workers, outcome.knobs.amp_dtype, outcome.knobs.cpu_threads) \
        == (2, "bfloat16", 1)


def test_cpu_amp_that_breaks_the_numerics_is_not_measured_again():
    def timing(knobs: Knobs) -> dict:
        if not knobs.num_workers:
            return record(0.5, wait=0.6)
        losses = [2.30, 2.9, 3.6] if knobs.amp_dtype else FP32_LOSSES
        return record(0.2 if knobs.num_workers == 2 else 0.45, wait=0.05, losses=losses)

    tuner, recorded = search(timing, Options(groups=frozenset({"loader", "amp", "threads"})),
                             budget=600.0)
    tuner.run()
    assert not [t for t in recorded.ran if t.knobs.amp_dtype and t.knobs.cpu_threads]


def test_deeper_prefetch_tried_only_while_the_loop_still_waits_for_data():
    def timing(knobs: Knobs) -> dict:
        if not knobs.num_workers:
            return record(0.2, wait=0.6)
        return record(0.08 if knobs.prefetch_factor else 0.1, wait=0.3)

    tuner, recorded = search(timing, Options(groups=frozenset({"loader"})))
    outcome = tuner.run()
    assert outcome.knobs.prefetch_factor == 4 and outcome.knobs.num_workers == 1
    quiet_tuner, quiet = search(lambda k: record(0.1 if k.num_workers else 0.2, wait=0.01),
                                Options(groups=frozenset({"loader"})))
    quiet_tuner.run()
    assert quiet.ran and not any(t.knobs.prefetch_factor for t in quiet.ran)


def test_a_noisy_machine_is_named_with_advice():
    rng = random.Random(3)

    def noisy(knobs: Knobs) -> dict:
        return record(compute_bound(knobs)["step_s_all"][0] * (1 + abs(rng.gauss(0, 0.3))))

    tuner, _ = search(noisy)
    notes = tuner.run().notes
    assert any(n.startswith("machine: noisy") and "--budget" in n for n in notes), notes
    quiet, _ = search(compute_bound)
    assert not any(n.startswith("machine: noisy") for n in quiet.run().notes)


def test_compile_race_goes_on_in_the_process_that_compiled():
    """The first compiled trial's process pays the compile; the race's first rounds run in
    it (eager, compiled, eager, compiled, ...) instead of in a new process compiling again."""
    tuner, recorded = search(compute_bound)
    outcome = tuner.run()
    plan = next(p for p in recorded.plans if any("compile" in t for t in p))
    kinds = ["compile" in t for t in plan]
    assert kinds == [False, True] * (len(plan) // 2) and len(plan) > 2
    compiled = [t for t in recorded.ran if t.knobs.compile_mode]
    assert compiled[0].check and not any(t.check for t in compiled[1:])
    assert outcome.knobs.compile_mode == "default"


def test_race_stops_when_the_interval_excludes_a_tie():
    """A clear gain (21 %) is decided after two rounds; the race's other rounds are skipped."""
    def timing(knobs: Knobs) -> dict:
        return record(0.07 if knobs.num_workers else 0.085)

    tuner, recorded = search(timing, Options(groups=frozenset({"loader"})))
    before_confirm: set[str] = set()  # the confirmation re-words what it re-runs
    tuner.on_stage = lambda name: name == "confirm" and before_confirm.update(
        r.reason for r in tuner.rejected)
    outcome = tuner.run()
    assert outcome.knobs.num_workers
    race = recorded.plans[2]  # after the baseline and the loader stage's sweep
    contenders = len({t.split(" #")[0] for t in race})
    assert len(race) > 2 * contenders and len(ran_of(recorded, race)) == 2 * contenders
    # the loser's speed against the leader's: 0.07 / 0.085 of it is 18 % slower
    assert "slower (-18%, raced)" in before_confirm
    assert "slower (-18%, confirmed)" in {r.reason for r in outcome.rejected}


def test_a_pick_the_confirmation_finds_within_noise_is_listed_as_rejected():
    """bf16 wins its stage's race (2 rounds), then measures as the defaults in the many
    rounds a noisier confirmation needs: over all the rounds they ran side by side the two
    are within noise, the defaults are kept and the result says why the pick went, with the
    confirmed figure."""
    stage = {"name": ""}
    wobble = itertools.cycle([1.0, 1.0, 1.03, 0.97])  # pick, defaults, pick, defaults, ...

    def timing(knobs: Knobs) -> dict:
        if stage["name"] == "confirm":
            return record(0.1 * next(wobble))
        return record(0.09 if knobs.amp_dtype is not None else 0.1)

    tuner, _ = search(timing, Options(groups=frozenset({"amp"})))
    tuner.on_stage = lambda name: stage.update(name=name)
    outcome = tuner.run()
    assert outcome.knobs.amp_dtype is None and outcome.confirmed
    (reason,) = [r.reason for r in outcome.rejected if r.trial_id.startswith("amp=bfloat16")
                 and "confirmed" in r.reason]
    assert reason.startswith("within noise of the defaults when confirmed (")


def test_a_stage_the_budget_cannot_hold_says_how_much_more_it_needs():
    tuner, _ = search(lambda knobs: record(0.1, warmup_s=0.5), Options(groups=frozenset({"loader"})),
                      budget=14.0)
    outcome = tuner.run()
    (note,) = [n for n in outcome.notes if "budget too small" in n]
    needed = float(note.split("needs ~")[1].split(" s more")[0])
    assert note.startswith("loader: skipped") and needed > 0
    # that much more budget is enough for the stage
    tuner, recorded = search(lambda knobs: record(0.1, warmup_s=0.5),
                             Options(groups=frozenset({"loader"})), budget=14.0 + needed + 1)
    outcome = tuner.run()
    assert not [n for n in outcome.notes if "budget too small" in n]
    assert any("workers" in t.id for t in recorded.ran)


def test_a_candidate_swept_out_of_reach_is_slower_than_what_won_not_within_noise():
    """Workers=1 is 38 % faster than the defaults it was swept beside but 31 % slower than
    the pick (never raced, out of reach, not re-run): it lost to the pick, and says so."""
    def timing(knobs: Knobs) -> dict:  # predicted: 2 workers, then 4 and 1
        if not knobs.num_workers:
            return record(0.1, wait=0.6)
        return record(0.0725 if knobs.num_workers == 1 else 0.05 if knobs.num_workers == 2
                      else 0.06)

    tuner, recorded = search(timing, Options(groups=frozenset({"loader"})), facts=MANY_CORES)
    outcome = tuner.run()
    assert outcome.knobs == Knobs(num_workers=2)
    assert Knobs(num_workers=1) not in {t.knobs for t in recorded.ran[-3:]}  # not confirmed
    (reason,) = [r.reason for r in outcome.rejected if r.trial_id == "workers=1"]
    assert reason == "slower (-31%)"


def test_a_baseline_no_micro_batch_fits_names_what_was_tried_and_the_fix():
    with pytest.raises(SearchError) as error:
        search(oom_above(16, compute_bound))[0].run()
    assert str(error.value) == (
        "the script runs out of memory with PyTorch defaults (out of memory), and so do "
        "micro-batches of 128, 64, 32; lower its batch size before tuning")


def test_a_baseline_out_of_memory_that_micro_batches_cannot_help_stops_at_once():
    """The script computes its loss outside loop.train_step: the first micro-batch trial
    says it cannot split the batch, and the error says why instead of trying the rest."""
    blocked = "the script computes its loss outside loop.train_step"

    def timing(knobs: Knobs) -> dict:
        return {**record(0.1, status="oom"),
                "micro_batch_blocked": blocked if knobs.micro_batch_size else None}

    tuner, recorded = search(timing)
    with pytest.raises(SearchError) as error:
        tuner.run()
    assert str(error.value) == ("the script runs out of memory with PyTorch defaults (out of "
                                f"memory); micro-batches cannot help: {blocked}; lower its batch "
                                "size before tuning")
    assert [t.id for t in recorded.ran] == ["defaults", "micro_batch=128"]


def test_a_contender_shown_slower_stops_running_in_the_race():
    """A race's process runs a fixed plan: once the defaults are out (15 % slower) while two
    worker counts are still a near-tie, the process ends and the race goes on without them,
    instead of running them in every round left (four trials more than a start-up)."""
    rng = random.Random(4)

    def timing(knobs: Knobs) -> dict:
        step = {0: 0.118, 1: 0.1, 2: 0.099}[knobs.num_workers or 0]
        step *= 1.3 if knobs.num_workers and knobs.cpu_threads != 1 else 1.0
        return {**record(step, warmup_s=2.0),
                "step_s_all": [step * rng.gauss(1, 0.08) for _ in range(9)]}

    options = Options(groups=frozenset({"loader", "threads"}))
    tuner, recorded = search(timing, options, budget=300, startup_s=1.0)
    tuner.run()
    ran = [t.id.split(" #")[0] for t in recorded.ran]
    race = [plan for plan in recorded.plans if any(i.startswith("defaults #") for i in plan)
            and any(i.startswith("workers=2,threads=1 #") for i in plan)][0]
    rounds_planned = len(race) // 3
    defaults_ran = sum(1 for i in race if i.startswith("defaults") and
                       i in {t.id for t in recorded.ran})
    assert defaults_ran < rounds_planned
    after = recorded.plans[recorded.plans.index(race) + 1]
    assert after and not any(i.startswith("defaults") for i in after)
    assert ran.count("workers=1,threads=1") > defaults_ran + 1


def test_a_run_that_fails_mid_race_keeps_the_rounds_paired():
    """Paired ratios pair the i-th run of each contender: a failed run keeps its place (and
    its pair is left out), or every later round would be paired with the wrong one."""
    calls = {"n": 0}

    def timing(knobs: Knobs) -> dict:
        if knobs.num_workers == 1:
            calls["n"] += 1
            if calls["n"] == 3:  # its second race round fails
                return record(0.1, status="error")
        return record(0.1 * (1.0 + 0.02 * (calls["n"] % 2)))

    tuner, _ = search(timing, Options(groups=frozenset({"loader"})), budget=300)
    tuner.run()
    (race,) = tuner.races
    statuses = {k.num_workers: [r.status for r in v] for k, v in race.items()}
    assert statuses[1][1] == "error"  # in its round, not dropped
    assert len({len(v) for v in statuses.values()}) == 1  # every round paired with its own


def test_a_cpu_micro_batch_is_kept_only_when_faster_beyond_noise():
    """Micro-batches of 128 swing from 10 % faster to 10 % slower, round by round: the faster
    half of their windows looks 10 % faster, but on a CPU that tie is not taken (it would go
    wrong under compile); a steady 20 % gain is."""
    for gains, kept in (((0.90, 1.10), None), ((0.80, 0.80), 128)):
        swings = itertools.cycle(gains)

        def timing(knobs: Knobs, swings=swings) -> dict:
            return record(0.1 * (next(swings) if knobs.micro_batch_size == 128 else 1.0))

        tuner, _ = search(timing, Options(groups=frozenset({"batch"})))
        staged: list[str] = []  # the stage's words, before the confirmation restates them
        tuner.on_stage = lambda name: name == "confirm" and staged.extend(
            r.reason for r in tuner.rejected if r.trial_id == "micro_batch=128")
        outcome = tuner.run()
        assert outcome.knobs.micro_batch_size == kept
        if kept is None:
            assert staged == ["within noise (+0.5%, raced); a micro-batch on a CPU is kept "
                              "only when faster beyond noise"]


@pytest.mark.parametrize("share", [0.15, 1.0])
def test_a_compile_the_run_s_cache_does_not_serve_is_named(share):
    """A later process compiles the same settings from the run's inductor cache (0.15 of
    the cold compile); where it compiles as long as the first time, the result says so."""
    tuner, _ = search(compute_bound, budget=240, warm_compile_share=share)
    outcome = tuner.run()
    missed = [n for n in outcome.notes if "inductor cache was not hit" in n]
    assert bool(missed) == (share == 1.0)


def test_a_budget_too_small_to_confirm_still_measures_a_large_ceiling():
    """Nothing found yet and a 2x ceiling: the one sweep the budget holds is worth more than
    a confirmation of the defaults; the result says it is unconfirmed and why. With more
    budget the confirmation keeps its share (the pick is confirmed)."""
    def input_bound(knobs: Knobs) -> dict:
        return record(0.05 if knobs.num_workers else 0.10, wait=0.0 if knobs.num_workers else 0.5)

    tuner, recorded = search(input_bound, Options(), budget=16)
    outcome = tuner.run()
    assert outcome.knobs.num_workers and not outcome.confirmed and recorded.clock <= 16
    assert any(n.startswith("loader: measured with the confirmation's share of the budget")
               and n.endswith("nothing found yet to confirm)") for n in outcome.notes)
    tuner, recorded = search(input_bound, Options(), budget=22)
    outcome = tuner.run()
    assert outcome.knobs.num_workers and outcome.confirmed



def test_a_reference_far_ahead_of_every_candidate_takes_no_race_rounds():
    """Rounds only tell close settings apart: bfloat16 at half the speed, one window each."""
    def slow_bfloat16(knobs: Knobs) -> dict:
        return record(0.10 * (2.0 if knobs.amp_dtype else 1.0))

    tuner, recorded = search(slow_bfloat16, Options(groups=frozenset({"amp"})), budget=300)
    before_confirm: list[int] = []
    tuner.on_stage = lambda name: before_confirm.append(len(recorded.ran)) \
        if name == "confirm" else None
    outcome = tuner.run()
    assert outcome.knobs.amp_dtype is None
    stage_runs = [t for t in recorded.ran[:before_confirm[0]] if t.knobs.amp_dtype]
    assert len(stage_runs) == 1  # one window; the confirmation re-runs it on its own


def feed_bound(knobs: Knobs) -> dict:
    """A GPU fed by one process: decoding takes 0.12 s a batch, the device 0.04 s (bfloat16
    0.012 s)."""
    workers = knobs.num_workers or 0
    device = 0.04 * (0.3 if knobs.amp_dtype else 1.0)
    data = 0.12 / workers if workers else 0.12
    step = max(data, device) if workers else data + device
    wait = max(0.0, (step - device) / step)
    return {**record(step, 0.5 + 0.05 * workers, wait=wait), "device_s": device}


def test_a_budget_too_small_to_confirm_still_measures_the_predicted_point():
    """The prediction (workers, pinned memory and bfloat16 at once) is the run's largest
    ceiling: where nothing is found yet it takes the confirmation's share, as a stage
    would (before, its ceiling counted as none and a tight budget skipped it)."""
    tuner, recorded = search(feed_bound, facts=CUDA, budget=14, reuse=True)
    outcome = tuner.run()
    predicted = Knobs(num_workers=16, pin_memory=True, amp_dtype="bfloat16")
    assert recorded.ran[1].knobs == predicted and outcome.knobs == predicted
    assert any(n.startswith("predict: measured with the confirmation's share") and "32.00x"
               in n for n in outcome.notes)


def graphs_bound(knobs: Knobs) -> dict:
    """The device busy half of a 0.1 s step, launches the rest: CUDA graphs remove nine
    tenths of those, the default mode four tenths and a fifth of the compute."""
    device, host, warmup = 0.05, 0.05, 0.5
    if knobs.amp_dtype:
        device *= 0.5
    if knobs.compile_mode == "reduce-overhead":
        host, warmup = host * 0.1, warmup + 16
    elif knobs.compile_mode:
        host, device, warmup = host * 0.6, device * 0.8, warmup + 16
    if knobs.cudnn_benchmark:
        device *= 0.9
    return {**record(device + host, warmup), "device_s": device}


def test_compile_takes_its_ceiling_s_turn_when_the_budget_holds_it_no_later():
    """compile's ceiling (3x: the launches) leads amp's (1.8x): while the budget holds its
    share after the other stages it still waits for them (a budget may hold one compile
    and amp changes the graphs); where it would not, it goes in its turn and the stages
    left are noted, not measured (each would compile again)."""
    stages: list[str] = []
    outcome = Search(Recorded(graphs_bound, facts=CUDA, budget=40, reuse=True), Options(),
                     on_stage=stages.append).run()
    assert stages[:2] == ["baseline", "compile"] and "amp" not in stages
    assert outcome.knobs.compile_mode == "reduce-overhead"
    assert any(n.startswith("amp: not tried after compile") and "new graphs" in n
               for n in outcome.notes)
    assert not any(n.startswith("loader: not tried") for n in outcome.notes)  # below noise
    stages.clear()
    outcome = Search(Recorded(graphs_bound, facts=CUDA, budget=58, reuse=True), Options(),
                     on_stage=stages.append).run()
    assert stages.index("amp") < stages.index("compile")
    assert outcome.knobs.compile_mode == "reduce-overhead" and outcome.knobs.amp_dtype
    # compile last, adopted: the stages below the noise keep their own notes
    assert "batch: at most 1.00x here, smaller micro-batches add launches and host time; " \
        "skipped" in outcome.notes
    assert not any("not tried after compile" in n for n in outcome.notes)


def close_workers(knobs: Knobs) -> dict:
    """An input-bound loop (the defaults wait half the step) whose worker counts 1, 2 and 4
    run within 4 % of each other."""
    workers = knobs.num_workers or 0
    step = {0: 0.06, 1: 0.052, 2: 0.05, 4: 0.051}[workers]
    return record(step, 0.5 + 0.05 * workers, wait=0.5 if not workers else 0.02)


def test_a_race_the_budget_cannot_hold_whole_races_its_fastest_contenders():
    """Three worker counts within reach of each other and the incumbent: two rounds of all
    four do not fit, two of the incumbent and the fastest do. The slower candidates leave
    the race on their one window each (said so, not "raced") instead of the race not
    running at all (before: one window each decided)."""
    tuner, recorded = search(close_workers, Options(groups=frozenset({"loader"})),
                             facts=MANY_CORES, budget=28, reuse=True)
    outcome = tuner.run()
    runs = Counter(t.knobs.num_workers for t in recorded.ran)
    assert outcome.knobs.num_workers == 2 and runs[2] >= 5 and runs[1] == runs[4] == 1
    rejected = Counter(r.trial_id for r in outcome.rejected)
    assert rejected["workers=1"] == rejected["workers=4"] == 1
    assert not any("raced" in r.reason for r in outcome.rejected)


def test_a_race_is_trimmed_slowest_first_down_to_the_fastest_and_the_reference():
    """The slowest leave first, the reference never; where not even two rounds of the
    incumbent and the fastest fit, one window each decides between those two (the
    unraced tie zone is too wide to prefer a simpler, slower candidate inside it)."""
    tuner, recorded = search(close_workers, Options(groups=frozenset({"loader"})),
                             facts=MANY_CORES, budget=28, reuse=True)
    tuner.budget.baseline = tuner.budget.typical = TrialResult.from_event(
        tuner.trial(Knobs()), close_workers(Knobs()))
    contenders = [TrialResult.from_event(tuner.trial(Knobs(num_workers=n)), close_workers(
        Knobs(num_workers=n))) for n in (0, 2, 4, 1)]
    recorded.clock = 27.0  # one second left: no round fits
    assert tuner._trim_to_fit(contenders, 6) == (contenders[:2], contenders[2:])
    assert tuner._trim_to_fit(contenders, 0) == (contenders, [])  # no race asked for
    recorded.clock = 5.0  # 23 s left: two rounds of two fit, of four not
    assert tuner._trim_to_fit(contenders, 6) == (contenders[:2], contenders[2:])
    recorded.clock = 1.0  # 27 s: of three
    assert tuner._trim_to_fit(contenders, 6) == (contenders[:3], contenders[3:])


def test_an_adopted_change_is_credited_with_the_gain_its_race_decided_on():
    """bfloat16's runs alternate clean at 0.097 s and erratic at 0.08 s (windows 0.03-0.13
    s) against a clean 0.10 s: the race decides on each side's faster half of runs (about
    1.19x). The change's gain and the stage's note say that figure, not the ratio of each
    side's cleanest run (1.03x), which told the report "measured 0.91x" for a dtype the
    race had taken on train_images."""
    runs = itertools.count()

    def erratic_bfloat16(knobs: Knobs) -> dict:
        if not knobs.amp_dtype:
            return record(0.10)
        if next(runs) % 2:
            return {**record(0.08), "step_s_all": [0.03, 0.13, 0.04, 0.12, 0.05, 0.11, 0.06, 0.1]}
        return record(0.097)

    tuner, _ = search(erratic_bfloat16, Options(groups=frozenset({"amp"})), budget=120,
                      reuse=True)
    outcome = tuner.run()
    (change,) = tuner.changes
    assert change.after == Knobs(amp_dtype="bfloat16") and 0.15 < change.gain < 0.25
    assert any(n.startswith("amp: ceiling") and n.endswith(f"measured {1 + change.gain:.2f}x")
               for n in outcome.notes)
