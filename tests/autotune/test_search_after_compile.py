"""The loader after compile: compile shortens the step, and the workers or the prefetch
depth that kept up with the eager step may not keep up with the compiled one."""

from __future__ import annotations

from dataclasses import replace

import pytest

from test_search import CUDA, compute_bound, record, search
from tuneup.autotune.search import Change, Options, describe
from tuneup.autotune.search.confirm import simpler_alternative
from tuneup.autotune.search.stages import _loader_reserve, loader_after_compile_trials
from tuneup.autotune.space import ScriptFacts
from tuneup.autotune.trials import Trial, TrialResult
from tuneup.settings import Knobs


def compile_outpaces_the_loader(knobs: Knobs, prefetched: float = 0.9) -> dict:
    """Two workers keep up with the eager step (0.08 s) but not the compiled one (0.05 s): a
    compiled loop waits for data, which a deeper prefetch smooths out (the step times
    ``prefetched``)."""
    workers = knobs.num_workers or 0
    compute = 0.05 if knobs.compile_mode else 0.08
    warmup = 0.5 + 0.3 * workers + (16.0 if knobs.compile_mode else 0.0)
    if not workers:
        return record(0.1 + compute, warmup, wait=0.6)
    data = 0.1 / workers
    waits = data >= compute
    step = max(data, compute) * (prefetched if waits and knobs.prefetch_factor else 1.0)
    return record(step, warmup, wait=0.25 if waits else 0.02)


def test_deeper_prefetch_tried_again_once_compile_leaves_the_loop_waiting():
    options = Options(groups=frozenset({"loader", "compile"}))
    tuner, recorded = search(compile_outpaces_the_loader, options, budget=240)
    outcome = tuner.run()
    assert outcome.knobs.compile_mode == "default" and outcome.knobs.num_workers == 2
    assert outcome.knobs.prefetch_factor == 4
    first_deeper = next(i for i, t in enumerate(recorded.ran) if t.knobs.prefetch_factor)
    assert recorded.ran[first_deeper].knobs.compile_mode  # tried once compile is in
    assert outcome.confirmed


def test_a_deeper_prefetch_after_compile_is_rechecked_beside_the_compiled_pick():
    """Its short race is the least certain comparison left: the confirmation re-runs the
    compiled pick without it (the same graphs: no second compile a round)."""
    options = Options(groups=frozenset({"loader", "compile"}))
    tuner, recorded = search(compile_outpaces_the_loader, options, budget=240)
    stages: list[str] = []
    tuner.on_stage = stages.append
    outcome = tuner.run()
    assert outcome.knobs.prefetch_factor == 4
    assert stages[-2:] == ["loader_after_compile", "confirm"]
    without = describe(outcome.knobs.replace(prefetch_factor=None)) + " #"
    assert any(trial.startswith(without) for trial in recorded.plans[-1])


@pytest.mark.parametrize("prefetched", [0.9, 1.0])
def test_after_a_deeper_prefetch_estimates_count_a_compiled_rerun_warm(prefetched):
    """Its stage's process compiled (warm) first; the confirmation's estimates must count
    the warm-up a re-run in the compiling process has (eager's, 1.1 s), not that warm
    compile (3.5 s), whether the deeper prefetch was taken or not."""
    options = Options(groups=frozenset({"loader", "compile"}))
    tuner, _ = search(lambda k: compile_outpaces_the_loader(k, prefetched), options, budget=240)
    warmups: dict[str, float] = {}
    tuner.on_stage = lambda name: warmups.update(
        {name: getattr(tuner.budget.typical, "warmup_s", None)})
    outcome = tuner.run()
    assert (outcome.knobs.prefetch_factor == 4) == (prefetched < 1)
    assert "loader_after_compile" in warmups
    assert warmups["confirm"] == pytest.approx(1.1)


@pytest.mark.parametrize("prefetched", [0.98, 1.02])
def test_a_deeper_prefetch_inside_the_tie_zone_is_kept_only_when_faster(prefetched):
    """A deeper prefetch costs two more batches per worker in shared memory and changes
    nothing the model sees, so it is no heavier than the default: 2 % faster (inside the 3 %
    tie zone, as on train_images after compile) it is kept, stage and confirmation alike;
    2 % slower, not."""
    options = Options(groups=frozenset({"loader", "compile"}))
    tuner, _ = search(lambda k: compile_outpaces_the_loader(k, prefetched), options, budget=240)
    outcome = tuner.run()
    assert outcome.knobs.compile_mode == "default" and outcome.confirmed
    assert (outcome.knobs.prefetch_factor == 4) == (prefetched < 1)


def prefetch_pays_once_compiled(knobs: Knobs, compiled: float = 0.98) -> dict:
    """One worker leaves the loop waiting; a deeper prefetch ties eagerly (1 % slower) and,
    once compile has shortened the step, makes it ``compiled`` as long (train_images,
    2026-11-26: 2-3 % faster)."""
    if not knobs.num_workers:
        return record(0.2, wait=0.6)
    step = 0.1 * (0.8 if knobs.compile_mode else 1.0)
    if knobs.prefetch_factor:
        step *= compiled if knobs.compile_mode else 1.01
    return record(step, 0.5 + (16.0 if knobs.compile_mode else 0.0), wait=0.3)


@pytest.mark.parametrize("groups", [{"loader", "compile"}, {"loader"}])
def test_a_tie_over_a_deeper_prefetch_goes_to_it_while_compile_is_to_come(groups):
    tuner, recorded = search(prefetch_pays_once_compiled, Options(groups=frozenset(groups)),
                             budget=240)
    outcome = tuner.run()
    assert outcome.knobs.num_workers == 1
    assert (outcome.knobs.prefetch_factor == 4) == ("compile" in groups)
    if "compile" in groups:
        assert outcome.knobs.compile_mode == "default"
        # taken in the loader stage, before compile: no trial needed after it
        deeper = [t.knobs for t in recorded.ran if t.knobs.prefetch_factor]
        assert not deeper[0].compile_mode


@pytest.mark.parametrize("compiled", [1.01, 1.06])
def test_the_confirmation_undoes_a_deeper_prefetch_only_beyond_noise(compiled):
    """Kept on a tie before compile, it is re-checked beside the compiled pick: 1 % slower
    there (inside the 3 % tie zone) it stays, 6 % slower it goes."""
    tuner, recorded = search(lambda k: prefetch_pays_once_compiled(k, compiled),
                             Options(groups=frozenset({"loader", "compile"})), budget=240)
    outcome = tuner.run()
    assert outcome.knobs.compile_mode == "default" and outcome.confirmed
    without = describe(outcome.knobs.replace(prefetch_factor=None)) + " #"
    assert any(trial.startswith(without) for trial in recorded.plans[-1])  # re-checked
    assert (outcome.knobs.prefetch_factor == 4) == (compiled < 1.03)


def test_the_confirmation_doubts_a_change_of_no_weight_last():
    """A deeper prefetch taken on a tie gained least, yet the change worth re-checking is
    the micro-batch chosen before compile (their interaction cost train_images 0.89)."""
    tuner, _ = search(compute_bound)
    base = Knobs(num_workers=2)
    micro = base.replace(micro_batch_size=64)
    compiled = micro.replace(compile_mode="default")
    deeper = compiled.replace(prefetch_factor=4)
    tuner.incumbent = deeper
    tuner.changes = [Change("batch", base, micro, 0.05), Change("compile", micro, compiled, 0.2),
                     Change("loader_after_compile", compiled, deeper, 0.001)]
    assert simpler_alternative(tuner) == deeper.replace(micro_batch_size=None)


def test_compile_holds_room_for_the_loader_after_it_on_a_hint_of_waiting():
    """One compiled window waiting 7 % of the step is a hint (train_images: 9 % in the
    first compiled window, 11-14 % in the race's, and the trial was then skipped for want
    of budget): the compile stage holds the stage's room on it, and the stage itself still
    waits for evidence (more than 10 %)."""
    tuner, _ = search(compile_outpaces_the_loader, Options(groups=frozenset({"loader", "compile"})))
    tuner.incumbent = Knobs(num_workers=2)
    compiled = Knobs(num_workers=2, compile_mode="default")

    def run(wait: float) -> TrialResult:
        return TrialResult.from_event(Trial(describe(compiled), compiled), record(0.05, wait=wait))

    assert _loader_reserve(tuner, run(0.07), run(0.07)) > 0
    assert not loader_after_compile_trials(tuner, run(0.07))
    assert loader_after_compile_trials(tuner, run(0.12))
    assert _loader_reserve(tuner, run(0.02), run(0.02)) == 0


def test_no_deeper_prefetch_after_compile_when_the_loader_keeps_up():
    def timing(knobs: Knobs) -> dict:  # four times the decoding speed: never waits
        return compile_outpaces_the_loader(replace(knobs, num_workers=(knobs.num_workers or 0)
                                                   * 4 or None, prefetch_factor=None))

    options = Options(groups=frozenset({"loader", "compile"}))
    tuner, recorded = search(timing, options, budget=240)
    outcome = tuner.run()
    assert outcome.knobs.compile_mode == "default"
    assert not any(t.knobs.prefetch_factor for t in recorded.ran)


def compile_outgrows_the_workers(knobs: Knobs, graphs: str = "default") -> dict:
    """A batch takes 0.12 s to decode in one process; the model 0.1 s a step eagerly and
    0.04 s compiled. Two workers keep up with the eager step, four with the compiled one."""
    workers = knobs.num_workers or 0
    compute = 0.04 if knobs.compile_mode == graphs else 0.1
    warmup = 0.5 + 0.2 * workers + (16.0 if knobs.compile_mode else 0.0)
    if not workers:
        return record(0.12 + compute, warmup, wait=0.12 / (0.12 + compute))
    supply = 0.12 / workers
    step = max(supply, compute)
    return record(step, warmup, wait=max(0.0, step - compute) / step)


def test_compile_that_outgrows_the_workers_gets_the_workers_its_step_needs():
    """The loader stage takes two workers for the eager step; compile leaves them a third
    of the compiled step behind: the stage after compile predicts four from the compiled
    run's split and measures them in the process that holds the graphs (no compile)."""
    options = Options(groups=frozenset({"loader", "compile"}))
    tuner, recorded = search(compile_outgrows_the_workers, options, facts=CUDA, budget=240,
                             reuse=True)
    stages: list[str] = []
    tuner.on_stage = stages.append
    outcome = tuner.run()
    assert outcome.knobs.compile_mode == "default" and outcome.knobs.num_workers == 4
    assert outcome.knobs.pin_memory and outcome.confirmed
    assert "loader_after_compile" in stages
    change = next(c for c in tuner.changes if c.stage == "loader_after_compile")
    assert change.before.num_workers == 2 and change.gain > 0.3


def test_a_compiled_loop_without_workers_gets_them_pinned_on_cuda():
    """A compiled incumbent without workers (its eager loop's wait was below the noise, so
    the loader stage never ran): the stage after compile proposes the count the compiled
    run's split predicts, with pinned memory, as the first prediction does."""
    options = Options(groups=frozenset({"loader", "compile"}))
    tuner, _ = search(compile_outgrows_the_workers, options, facts=CUDA)
    tuner.judge.facts = CUDA
    tuner.incumbent = Knobs(compile_mode="default")
    run = TrialResult.from_event(Trial("compiled", tuner.incumbent),
                                 compile_outgrows_the_workers(tuner.incumbent))
    trials = loader_after_compile_trials(tuner, run)
    assert [t.knobs for t in trials] == [Knobs(compile_mode="default", num_workers=4,
                                               pin_memory=True)]


def test_cuda_graphs_over_micro_batches_are_loss_checked_after_compile_too():
    """A candidate beside a CUDA-graphed incumbent that accumulates micro-batches is
    usable only loss-checked: unchecked, the stage's measurement would be thrown away."""
    options = Options(groups=frozenset({"loader", "compile"}))
    tuner, _ = search(compile_outgrows_the_workers, options, facts=CUDA)
    tuner.judge.facts = CUDA
    tuner.incumbent = Knobs(num_workers=2, micro_batch_size=128, compile_mode="reduce-overhead")
    run = TrialResult.from_event(Trial("graphs", tuner.incumbent),
                                 compile_outgrows_the_workers(tuner.incumbent, "reduce-overhead"))
    trials = loader_after_compile_trials(tuner, run)
    assert trials and all(t.check for t in trials)
    assert {t.knobs.num_workers for t in trials} == {4, 2}  # the workers; the prefetch


def test_a_cpu_gets_no_thread_count_after_compile():
    """The eager loader stage pairs each worker count with the threads it leaves; after
    compile that pair would compile new graphs (threads are no loader knob): workers only."""
    options = Options(groups=frozenset({"loader", "compile", "threads"}))
    facts = ScriptFacts(device="cpu", effective_batch=256, amp_dtypes=(), compile_available=True,
                        cpu_threads=16, usable_cores=16)
    tuner, _ = search(compile_outgrows_the_workers, options, facts=facts)
    tuner.judge.facts = facts
    tuner.incumbent = Knobs(num_workers=2, compile_mode="default")
    run = TrialResult.from_event(Trial("compiled", tuner.incumbent),
                                 compile_outgrows_the_workers(tuner.incumbent))
    trials = loader_after_compile_trials(tuner, run)
    assert [t.knobs for t in trials] == [tuner.incumbent.replace(num_workers=4),
                                         tuner.incumbent.replace(prefetch_factor=4)]


def test_the_confirmation_reserve_counts_no_compile_a_waiting_process_holds():
    """The confirmation of a compiled pick runs in the process that holds its graphs when
    one waits: the reserve the stages leave for it counts no warm compile then."""
    tuner, recorded = search(compile_outgrows_the_workers, Options(), facts=CUDA, reuse=True)
    compiled = Knobs(num_workers=2, compile_mode="default")
    (result,) = tuner.measure([tuner.trial(compiled)])
    tuner.budget.typical, tuner.budget.compile_s = result, 16.0
    held = tuner.budget.confirm_reserve()
    tuner.budget.typical = replace(result, trial=Trial("other", compiled.replace(
        compile_mode="reduce-overhead")))
    assert tuner.budget.confirm_reserve() == pytest.approx(
        held + tuner.budget.warm_compile_seconds())
