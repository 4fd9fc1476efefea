"""The search's stages: one small function per stage, chosen by name from :data:`STAGES`.

Each stage starts from the search's incumbent, measures it again beside its candidates
(:meth:`Search.compare`) and adopts the best.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tuneup.autotune import protocol, space
from tuneup.autotune.search import policy
from tuneup.autotune.search.budget import COMPILE_GUESS_S
from tuneup.autotune.search.judge import Rejection
from tuneup.autotune.search.outcome import SearchError
from tuneup.autotune.search.speedup import MIN_SPREAD, speedup_beyond_noise
from tuneup.autotune.search.verdict import window_noise
from tuneup.autotune.trials import Trial, TrialResult, merge, typical_step
from tuneup.settings import Knobs
from tuneup.settings.schema import knob_facts

if TYPE_CHECKING:
    from tuneup.autotune.search.run import Search

HEADROOM = "batch (memory headroom)"  # a change made for memory, kept whatever its speed
PREFETCH_WAIT_SHARE = 0.1  # data-wait share left that makes a deeper prefetch worth a trial
# the wait in compile's first compiled window that makes it hold budget for that trial: one
# window is a hint only (train_images' first compiled run waited 9 %, the race's 11-14 %,
# and the trial was then skipped for want of the budget the race had spent)
PREFETCH_HINT_SHARE = 0.05
DEEPER_PREFETCH = 4  # batches each worker keeps ready (PyTorch's default: 2)
PERSISTENT_STARTUP_SHARE = 0.01  # worker start-up per epoch worth keeping workers alive
# on a CPU a micro-batch gains at most cache effects, and a tie taken before compile tilts
# against it (its graphs differ): in 12 grids of four workloads the best micro-batched point
# was never 3 % ahead of the best whole batch, often 15-20 % behind; taken on a tie, it cost
# train_images 0.89 and 0.91 of the grid's best
CPU_MICRO_BATCH = "a micro-batch on a CPU is kept only when faster beyond noise"
RACE_ROUNDS = 6  # interleaved rounds of a stage's contenders at most
LOW_IMPACT_ROUNDS = 2  # a race's rounds in low-impact stages, and where a question comes again
# compile last: what the budget has left goes to its decision; in its ceiling's turn with
# stages still to come, a stage's race (RACE_ROUNDS), the rest is theirs
COMPILE_RACE_ROUNDS = 40
FIRST_COMPILE_ROUNDS = 6  # paired rounds in the process that compiles first

STAGES: dict[str, Callable[[Search], None]] = {}


def stage(name: str) -> Callable[[Callable[[Search], None]], Callable[[Search], None]]:
    def register(function: Callable[[Search], None]) -> Callable[[Search], None]:
        STAGES[name] = function
        return function
    return register


def measure_baseline(search: Search) -> TrialResult:
    """PyTorch's defaults, loss-checked. When the user's own batch does not fit in memory,
    the largest micro-batch that does is the baseline (the effective batch stays theirs)."""
    (baseline,) = search.measure([search.trial(Knobs(), check=True)])
    facts = search.executor.facts
    if facts is not None:
        search.judge.facts = facts
        for knob, reason in facts.fixed_reasons:
            search.note(f"{knob} left alone: {reason}")
    if baseline.status == protocol.OOM and facts is not None:
        baseline = _fitting_micro_batch(search, baseline)
    if baseline.status == protocol.OOM:
        raise _out_of_memory(search, baseline, tried=facts is not None)
    if baseline.status == protocol.BUDGET:
        raise _out_of_budget(search, baseline, started=facts is not None)
    if baseline.message == protocol.SCRIPT_TOO_SHORT:  # nothing failed: it ended too soon
        raise SearchError("the script's training ended before PyTorch's defaults could be "
                          "measured once: give it more steps through SCRIPT_ARGS (after --), "
                          "or more epochs or data")
    if not baseline.ok:
        raise SearchError(f"the script fails with PyTorch defaults ({baseline.status}: "
                          f"{baseline.message}); fix that before tuning")
    if baseline.micro_batch_blocked:
        search.note(f"batch: micro-batching left alone: {baseline.micro_batch_blocked}")
    return baseline


def _out_of_budget(search: Search, baseline: TrialResult, started: bool) -> SearchError:
    """The budget ran out before the defaults were measured once: nothing failed, so the
    script must not be told it does (a 60 s import was told to fix itself)."""
    if not started:
        return SearchError(f"start-up exceeded the budget ({baseline.message}): the script's "
                           "imports and data set-up must fit in --budget with room for the "
                           "trials; give a larger --budget")
    startup = search.executor.startup_s
    took = f" after a {startup:.0f} s start-up" if startup is not None else ""
    return SearchError(f"the budget ran out while the script was still training with "
                       f"PyTorch's defaults, in its first measured trial{took}: nothing "
                       "failed, the budget holds too little of it; give a larger --budget")


def _out_of_memory(search: Search, baseline: TrialResult, tried: bool) -> SearchError:
    """No micro-batch fits either (or the script cannot be micro-batched): what was
    tried, and the ways out."""
    sizes = ", ".join(map(str, space.micro_batches(search.facts))) if tried else ""
    if baseline.micro_batch_blocked:
        also = f"; micro-batches cannot help: {baseline.micro_batch_blocked}"
    else:
        also = f", and so do micro-batches of {sizes}" if sizes else ""
    cap = " or raise --max-memory" if search.options.max_memory_bytes else ""
    return SearchError(f"the script runs out of memory with PyTorch defaults "
                       f"({baseline.message}){also}; lower its batch size{cap} before tuning")


def _fitting_micro_batch(search: Search, failed: TrialResult) -> TrialResult:
    if failed.micro_batch_blocked:
        return failed
    for size in sorted(space.micro_batches(search.facts), reverse=True):
        (result,) = search.measure([search.trial(Knobs(micro_batch_size=size), check=True)])
        if result.ok:
            search.incumbent = result.trial.knobs
            search.note(f"baseline: the batch of {search.facts.effective_batch} does not fit "
                        f"in memory; micro-batches of {size} do (same effective batch)")
            return result
        if result.status != protocol.OOM or result.micro_batch_blocked:
            return result
    return failed


def prediction(search: Search) -> Knobs | None:
    """The point the incumbent's breakdown predicts (:func:`policy.predicted_point`) when
    it changes more than one thing (one change is its stage's business), none of them
    banned."""
    point = policy.predicted_point(search.incumbent_result, search.facts, search.incumbent,
                                   search.options.groups, search.options.min_gain)
    changed = [k for k, v in point.to_dict().items() if getattr(search.incumbent, k) != v]
    if len(changed) < 2 or any((k, getattr(point, k)) in search.banned for k in changed) \
            or any(k in search.facts.fixed_knobs for k in changed):
        return None
    return point


@stage("predict")
def predict(search: Search) -> None:
    """The predicted point measured beside the incumbent; the stages then verify each of
    its parts from there."""
    point = prediction(search)
    if point is not None:
        search.compare("predict", [search.trial(point, check=point.amp_dtype is not None)])


@stage("amp")
def amp(search: Search) -> None:
    """The hardware's first autocast dtype alone (bfloat16 where supported), the others and
    TF32 only where it loses or breaks the numerics: tensor cores run bfloat16 and float16
    at one rate (A100: 312 TFLOPS each, H100: 990) and TF32 at half of it, so racing them
    spends trials on a tie. A dtype taken on a prediction is verified against float32.
    On a CPU whose cores the workers share, a first dtype that loses is measured again with
    the threads the workers leave over: a reduced-precision kernel can lose on crowded
    cores and win on free ones (bfloat16 on 2 cores with 2 workers: -4 % at 2 threads, +20 % at
    1; docs/benchmarks.md), so the two are not decided one at a time."""
    if search.incumbent.amp_dtype is not None:  # taken on a prediction: float32 again
        search.compare("amp", search.candidates("amp_dtype", [None], check=True))
        return
    dtypes: list[object] = list(space.amp_dtypes(search.facts))
    trials = search.candidates("amp_dtype", dtypes, check=True) + search.candidates(
        "float32_matmul_precision", list(space.matmul_precisions(search.facts)), check=True)
    before = search.incumbent
    search.compare("amp", trials[:1])
    if search.incumbent == before and trials and search.incumbent.num_workers \
            and _shares_cores(search) and ("amp_dtype", trials[0].knobs.amp_dtype) \
            not in search.banned:  # lost on crowded cores: its gain may need them back
        search.compare("amp", _leftover_threads(search, trials[0]))
    if search.incumbent == before and trials[1:]:
        search.compare("amp", trials[1:])
    if search.incumbent == before:
        _amp_with_the_workers_it_needs(search, {t.knobs for t in trials})


def _amp_with_the_workers_it_needs(search: Search, tried: set[Knobs]) -> None:
    """A dtype that shortened the compute until the loop waits for data has its gain
    hidden by the loader: measured once more with the workers its own breakdown predicts
    (workers and amp move together where each alone gains little)."""
    if "loader" not in search.options.groups or "num_workers" in search.facts.fixed_knobs:
        return
    reference = search.incumbent_result
    runs = [r for r in search.results if r.trial.knobs in tried and r.ok
            and r.trial.knobs.amp_dtype and search.judge.problem(r) is None]
    waiting = [r for r in runs if (r.data_wait_share or 0) >= policy.HIDDEN_BY_WAIT]
    if not waiting or reference is None:
        return
    best = max(waiting, key=search.judge.speed)
    workers = best.trial.knobs.num_workers or 0
    counts = policy.predicted_workers(best, search.facts, workers)
    if not counts or counts[0] <= workers:
        return
    knobs = best.trial.knobs.replace(num_workers=counts[0])
    search.compare("amp", [search.trial(knobs, check=True)])


@stage("batch")
def batch(search: Search) -> None:
    baseline = search.baseline
    if baseline is not None and baseline.micro_batch_blocked:
        return
    trials = search.candidates("micro_batch_size", list(space.micro_batches(search.facts)),
                               check=True)
    reference, options = search.incumbent_result, search.options
    cap = options.max_memory_bytes
    if cap and reference and reference.peak_memory_bytes and \
            reference.peak_memory_bytes > cap * options.memory_headroom:
        _batch_for_headroom(search, trials)
        return
    search.compare("batch", trials, stop=stop_when_flat(search),
                   beyond_noise=None if search.facts.on_cuda else CPU_MICRO_BATCH)


def _batch_for_headroom(search: Search, trials: list[Trial]) -> None:
    """The incumbent's micro-batch leaves no memory headroom: take the largest that does."""
    cap = (search.options.max_memory_bytes or 0) * search.options.memory_headroom
    for result in search.measure(trials):
        if search.acceptable(result) and (result.peak_memory_bytes or 0) <= cap:
            search.note(f"batch: micro-batch {result.trial.knobs.micro_batch_size} "
                        "chosen for memory headroom")
            assert search.incumbent_result is not None
            search.adopt(result, search.incumbent_result, HEADROOM)
            return
    search.note("batch: no micro-batch keeps the memory headroom")


def stop_when_flat(search: Search, patience: int = 1) -> Callable[[TrialResult], bool]:
    """Early stop for a monotone sweep (the reference comes first): stop at a failure or
    after ``patience`` steps in a row that do not beat the best so far."""
    best: list[TrialResult] = []
    flat = [0]

    def stop(result: TrialResult) -> bool:
        if not best:
            best.append(result)
            return not result.ok
        if not result.ok:
            return True
        if search.judge.better(result, best[0]):
            best[0], flat[0] = result, 0
            return False
        flat[0] += 1
        return flat[0] >= patience

    return stop


@stage("loader")
def loader(search: Search) -> None:
    """The predicted worker count first, then its neighbours (see
    :func:`policy.predicted_workers`), measured beside the incumbent and raced."""
    current = search.incumbent.num_workers or 0
    workers = policy.predicted_workers(search.incumbent_result, search.facts, current)
    trials = search.candidates("num_workers", workers)
    if _shares_cores(search):  # each count also with the threads the workers leave over
        trials = [t for trial in trials for t in (trial, *_leftover_threads(search, trial))]
    if trials:
        search.compare("loader", trials)
    if search.incumbent.num_workers and search.incumbent_result is not None:
        _decide_persistent_workers(search)


@stage("loader_extras")
def loader_extras(search: Search) -> None:
    """``pin_memory`` on CUDA, a deeper prefetch while the loop still waits for data."""
    reference = search.incumbent_result
    if not search.incumbent.num_workers or reference is None:
        return
    pin = []
    if policy.may_pin(search.facts, search.incumbent):
        pin = search.candidates("pin_memory", [True])
    prefetch = (search.candidates("prefetch_factor", [DEEPER_PREFETCH])
                if prefetch_to_try(search, reference) else [])
    # a deeper prefetch is asked again after compile, where it matters (compile shortens
    # the step the workers must keep up with): before it, two rounds (on train_images an
    # eager race of prefetch=4 ran five, 20 s, within noise, and left that stage 1 s short)
    prefetch_only = search.compile_to_come and not pin
    search.compare("loader", pin + prefetch, rounds=LOW_IMPACT_ROUNDS if prefetch_only else None)


@stage("loader_after_compile")
def loader_after_compile(search: Search) -> None:
    """After compile, the loader again where the compiled loop waits for data: compile
    shortens the step, and workers that kept up with the eager step may not keep up with
    the compiled one. The workers the compiled run's breakdown predicts, a deeper prefetch,
    or both, beside the compiled incumbent: loader knobs leave its graphs alone, so the
    process that holds them compiles nothing for these trials."""
    before = search.budget.typical
    trials = loader_after_compile_trials(search, before)
    if not trials:
        return
    search.compare("loader_after_compile", trials)
    # where the plan began in a fresh process its first run compiled (warm): later
    # estimates keep the warm-up of a re-run in a process that holds the graphs
    after = search.budget.typical
    if after is not None and before is not None:
        search.budget.typical = replace(after, warmup_s=before.warmup_s)


def loader_after_compile_trials(search: Search, result: TrialResult | None,
                                share: float = PREFETCH_WAIT_SHARE) -> list[Trial]:
    """The loader's candidates beside ``result``, a compiled run of the incumbent waiting
    for data more than ``share`` of the step: the workers its breakdown predicts where more
    than the incumbent's (pinned on CUDA where pinning was never measured), and a deeper
    prefetch (see :func:`prefetch_to_try`). Loader knobs only: a CPU's threads, which the
    eager loader stage pairs with its workers, would compile new graphs."""
    knobs, facts = search.incumbent, search.facts
    if result is None or "loader" not in search.options.groups \
            or (result.data_wait_share or 0) <= share:
        return []
    trials = []
    current = knobs.num_workers or 0
    more = [n for n in policy.predicted_workers(result, facts, current) if n > current][:1]
    if more and "num_workers" not in facts.fixed_knobs and \
            ("num_workers", more[0]) not in search.banned:
        point = knobs.replace(num_workers=more[0])
        pinned = any(r.trial.knobs.pin_memory for r in search.results)
        if policy.may_pin(facts, knobs) and not pinned and \
                ("pin_memory", True) not in search.banned:
            point = point.replace(pin_memory=True)
        trials.append(search.trial(point, check=search.judge.needs_check(point)))
    if prefetch_to_try(search, result, share):
        trials += search.candidates("prefetch_factor", [DEEPER_PREFETCH])
    return trials


def deepest_prefetch(chosen: TrialResult, near: list[TrialResult]) -> TrialResult:
    """Of ``chosen`` and the settings tied with it that differ from it only in a deeper
    prefetch, the deepest: while compile is to come, for compile shortens the step the
    workers must keep up with (on train_images the grid's best added prefetch_factor=4 to
    the compiled pick in every grid of 2026-11-26, 1-3 % faster, while the eager loader
    stage measured it within noise and the stage after compile did not fit the budget)."""
    default = knob_facts("prefetch_factor").pytorch_default
    rest = chosen.trial.knobs.replace(prefetch_factor=None)
    same = [r for r in near if r.trial.knobs.replace(prefetch_factor=None) == rest]
    return max(same, key=lambda r: r.trial.knobs.prefetch_factor or default)


def prefetch_to_try(search: Search, result: TrialResult | None,
                    share: float = PREFETCH_WAIT_SHARE) -> bool:
    """A deeper prefetch is worth a trial beside ``result`` (a run of the incumbent, or of
    it compiled): the incumbent has workers at the default depth, and that run's loop waits
    for data more than ``share`` of the step."""
    knobs = search.incumbent
    return (result is not None and bool(knobs.num_workers) and knobs.prefetch_factor is None
            and "loader" in search.options.groups
            and "prefetch_factor" not in search.facts.fixed_knobs
            and ("prefetch_factor", DEEPER_PREFETCH) not in search.banned
            and (result.data_wait_share or 0) > share)


def _shares_cores(search: Search) -> bool:
    """A CPU run tuning threads too: workers and intra-op threads compete for the cores."""
    return (not search.facts.on_cuda and "threads" in search.options.groups
            and "cpu_threads" not in search.facts.fixed_knobs)


def _leftover_threads(search: Search, trial: Trial) -> list[Trial]:
    """The trial with ``cores - workers`` intra-op threads, when that differs from now."""
    threads = max(1, search.facts.usable_cores - (trial.knobs.num_workers or 0))
    current = trial.knobs.cpu_threads or search.facts.cpu_threads
    if threads == current or ("cpu_threads", threads) in search.banned:
        return []
    return [search.trial(trial.knobs.replace(cpu_threads=threads), trial.check)]


def _decide_persistent_workers(search: Search) -> None:
    """Keep workers alive across epochs when their start-up is a visible share of an epoch
    and the loader does not shuffle (persistent workers change a seeded shuffle's order)."""
    result, base, facts = search.incumbent_result, search.baseline, search.facts
    if (search.incumbent.persistent_workers is not None or result is None or base is None
            or not facts.dataset_size or result.warmup_s is None or base.warmup_s is None
            or "persistent_workers" in facts.fixed_knobs):
        return
    startup = max(0.0, result.warmup_s - base.warmup_s)
    steps_per_epoch = max(1, facts.dataset_size // facts.samples_per_step)  # ranks share it
    epoch_s = steps_per_epoch * (result.step_time or 0)
    if not epoch_s or startup / epoch_s <= PERSISTENT_STARTUP_SHARE:
        return
    if facts.shuffles:
        search.note(f"loader: persistent_workers would save a {startup:.2f} s worker start-up "
                    "per epoch but changes the shuffle order from the second epoch on; "
                    "not applied (set persistent_workers=True yourself if that is fine)")
        return
    search.incumbent = search.incumbent.replace(persistent_workers=True)
    search.note(f"loader: persistent_workers (worker start-up {startup:.2f} s "
                f"per {epoch_s:.1f} s epoch)")


@stage("threads")
def threads(search: Search) -> None:
    if search.facts.on_cuda:
        return
    counts = space.thread_counts(search.facts, search.incumbent.num_workers or 0)
    search.compare("threads", search.candidates("cpu_threads", list(counts)))


@dataclass
class CompileRace:
    """The compile stage's race, kept for the confirmation: when compile was adopted or
    left within reach (not shown slower), the confirmation re-runs the other side beside
    the pick and decides again on all these rounds together. ``rejection``: the stage's,
    withdrawn if the pooled rounds adopt compile."""

    eager: Knobs
    compiled: Knobs
    runs: dict[Knobs, list[TrialResult]]
    rejection: Rejection | None = None


@stage("cudnn")
def cudnn(search: Search) -> None:
    """cuDNN's autotuner, where the model has convolutions (its ceiling is 1 otherwise)."""
    search.compare("cudnn", search.candidates("cudnn_benchmark", [True]))


@stage("compile")
def compile_(search: Search) -> None:
    modes = list(space.compile_modes(search.facts))
    if "reduce-overhead" in modes and not policy.host_bound(search.budget.typical,
                                                            search.launch_s):
        modes.remove("reduce-overhead")  # CUDA graphs remove host time: none to remove
        parts = policy.split(search.budget.typical)
        search.note("compile: reduce-overhead not tried: "
                    + policy.host_why(parts, search.launch_s))
    elif policy.graphs_first(search.budget.typical, search.launch_s):
        modes.reverse()  # the budget may hold one compile: the mode that removes the host
    for trial in search.candidates("compile_mode", modes, check=True):
        search.budget.reserve_s = _loader_reserve(search, search.budget.typical)
        if not _compile_fits(search):
            needed = search.budget.shortfall(2, extra_s=COMPILE_GUESS_S)
            search.note(f"compile: {trial.knobs.compile_mode} skipped, "
                        f"needs ~{math.ceil(needed)} s more budget")
            continue
        first = _first_compile_process(search, trial)
        if first is None:
            continue
        reference, result, paired = first
        # a compiled pick's confirmation compiles once more: the race leaves room for it
        search.budget.compile_s = max(search.budget.compile_s,
                                      _compile_seconds([result], [reference]))
        # compile shortens the step and can leave the loop waiting for data: the loader is
        # tried again after this stage, and the race leaves room for it
        search.budget.reserve_s = max(search.budget.reserve_s,
                                      _loader_reserve(search, result, reference))
        # gains are often within noise; the race decides against the gain that repays the
        # compile (or min_gain, the larger), the figure the decision below needs
        rounds = RACE_ROUNDS if search.stages_after else COMPILE_RACE_ROUNDS
        runs = search.race([reference, result], rounds,
                           tie=max(search.options.min_gain, _break_even(search, reference, result)),
                           paired=paired)
        compiled_runs = runs.get(result.trial.knobs, [])
        compiled = merge(compiled_runs)
        if compiled is None:
            continue  # raced out: slower
        # eager raced out means compile is faster with confidence; its runs still count
        eager_runs = (runs.get(reference.trial.knobs)
                      or search.raced_out.get(reference.trial.knobs) or [reference])
        eager = merge(eager_runs) or reference
        search.budget.compile_s = max(search.budget.compile_s,
                                      _compile_seconds(compiled_runs, eager_runs))
        reason = compile_verdict(search, eager_runs, compiled_runs)
        race = CompileRace(eager.trial.knobs, compiled.trial.knobs,
                           {eager.trial.knobs: eager_runs, compiled.trial.knobs: compiled_runs})
        if reason is None:
            search.adopt(compiled, eager, "compile")
            search.budget.typical = replace(compiled, warmup_s=_warm_warmup(
                compiled_runs, eager_runs, search.budget.compile_s))
        else:
            search.reject(compiled, reason)
            race.rejection = search.rejected[-1]
        if reason is None or not reason.startswith("slower"):
            search.compile_race = race


FirstProcess = tuple[TrialResult, TrialResult, dict[Knobs, list[TrialResult]]]


SHOWN = "the speed-up found is beyond noise of the defaults already"  # a note's words


def change_shown(search: Search) -> bool:
    """Whether the incumbent is a change the search's runs of it and of the defaults already
    put beyond noise of them (:func:`speedup.speedup_beyond_noise`): the claim the
    confirmation would check is made."""
    return speedup_beyond_noise(search.results, search.incumbent, search.baseline_knobs,
                                search.options.min_gain) is not None


def clearly_ahead(search: Search) -> bool:
    """Whether the incumbent's slowest usable window beats the defaults' fastest by the lead
    that lets a sweep skip its race (:func:`policy.clear_lead`), the window spread taken as
    no less than :data:`MIN_SPREAD` (none or one degree of freedom can put it near 0): a
    find no interval is needed to tell from noise
    (a compiled pick 4.7x ahead on one window a side), reported unconfirmed where it has
    one window."""
    if search.incumbent == search.baseline_knobs:
        return False
    usable = [r for r in search.results if search.judge.problem(r) is None]
    mine = [r for r in usable if r.trial.knobs == search.incumbent]
    defaults = [r for r in usable if r.trial.knobs == search.baseline_knobs]
    if not mine or not defaults:
        return False
    speed = search.judge.speed
    slowest, fastest = min(mine, key=speed), max(defaults, key=speed)
    return policy.clear_lead(speed(slowest) / speed(fastest), max(slowest.noise, fastest.noise),
                             max(window_noise(usable), MIN_SPREAD))


def _compile_fits(search: Search) -> bool:
    """Whether the eager incumbent and a mode's first compiled trial fit on the compile
    guess: beside the confirmation's reserve, or in it where compile's ceiling outweighs the
    confirmation (:func:`policy.compile_outweighs_confirmation`; said in a note; a second
    mode may take what the first left of it)."""
    budget = search.budget
    if budget.affordable(2, extra_s=COMPILE_GUESS_S) >= 2:
        return True
    ceiling = search.ceiling("compile").factor
    if not policy.compile_outweighs_confirmation(ceiling, change_shown(search)) \
            or budget.affordable(2, extra_s=COMPILE_GUESS_S, confirmation=False) < 2:
        return False
    search.note(f"compile: measured with the confirmation's share of the budget (at most "
                f"{ceiling:.2f}x to find; {SHOWN})")
    return True


def _first_compile_process(search: Search, trial: Trial) -> FirstProcess | None:
    """The incumbent and the compiled trial (loss-checked), then interleaved rounds of both
    in the same process, so the race's first rounds pay no second start-up and compile.
    The process stops right after a compiled trial that fails or drifts. None when either
    of the first pair cannot be used."""
    eager = search.trial(search.incumbent)
    # this process compiles, and so will the confirmation's (warm): before compile_s is
    # measured the budget's confirmation reserve cannot hold the second one
    extra_s = COMPILE_GUESS_S + search.budget.warm_compile_seconds()
    rounds = min(FIRST_COMPILE_ROUNDS, max(0, search.budget.affordable(
        2 * FIRST_COMPILE_ROUNDS + 2, extra_s=extra_s) // 2 - 1))

    seen: list[TrialResult] = []

    def stop(result: TrialResult) -> bool:
        """A compiled trial that fails or drifts, or rounds left that no longer fit: the
        first compiled trial measures what compiling costs, and a compile slower than the
        guess must not take the confirmation's share."""
        if not result.ok or search.judge.problem(result) is not None:
            return True
        seen.append(result)
        if len(seen) == 2:
            search.budget.compile_s = max(search.budget.compile_s,
                                          _compile_seconds(seen[1:], seen[:1]))
        left = rounds + 1 - len(seen) // 2
        return not len(seen) % 2 and left > 0 and not search.budget.still_fits(
            left * 2 * search.budget.trial_seconds(seen[0]))

    results = search.measure([eager, trial] + [search.trial(k) for _ in range(rounds)
                                               for k in (eager.knobs, trial.knobs)], stop)
    reference, result = results[0], results[1]
    if not reference.ok or not search.acceptable(result):
        return None
    paired: dict[Knobs, list[TrialResult]] = {eager.knobs: [], trial.knobs: []}
    for extra in results[2:]:  # failed runs too: the i-th of each stays one round
        if extra.ran:
            paired[extra.trial.knobs].append(extra)
    return reference, result, paired


def _loader_reserve(search: Search, compiled: TrialResult | None,
                    like: TrialResult | None = None) -> float:
    """What the compile stage holds for :func:`loader_after_compile` (0 when ``compiled``,
    a compiled run, hints at no wait or the incumbent is not compiled): a process that
    compiles from the run's cache, then three trials like ``like`` (default: the
    incumbent's run): the compiled incumbent, its first candidate and the incumbent again
    (a second candidate runs where the budget has room beyond this). Held on a hint, it
    returns to the confirmation when the stage is not called for."""
    if compiled is None or not compiled.trial.knobs.compile_mode \
            or not loader_after_compile_trials(search, compiled, PREFETCH_HINT_SHARE):
        return 0.0
    budget = search.budget
    return (budget.plan_startup_seconds() + budget.warm_compile_seconds()
            + 3 * budget.trial_seconds(like))


def _warm_warmup(compiled: list[TrialResult], eager: list[TrialResult], compile_s: float
                 ) -> float | None:
    """The warm-up later estimates should count for a compiled trial: a re-run's in the
    process that compiled (the compile itself is ``compile_s``, paid once a process); the
    eager warm-up when every compiled run paid a cold compile."""
    eager_warmups = [r.warmup_s for r in eager if r.warmup_s is not None]
    floor = min(eager_warmups, default=0.0)
    warm = [r.warmup_s for r in compiled
            if r.warmup_s is not None and r.warmup_s < floor + compile_s / 2]
    return min(warm, default=floor)


def _break_even(search: Search, eager: TrialResult, compiled: TrialResult) -> float:
    """The relative gain at which compiling repays its compile time over the expected steps,
    from a first eager and compiled pair."""
    compile_s = _compile_seconds([compiled], [eager])
    steps = search.options.expected_steps * (eager.step_time or 0.0)
    return compile_s / steps if steps > 0 else 0.0


def _compile_seconds(compiled: list[TrialResult], eager: list[TrialResult]) -> float:
    """What compiling costs a run: the cold warm-up (the longest; re-runs in the same process
    reuse the graphs) beyond eager's."""
    cold = max((r.warmup_s or 0.0) for r in compiled)
    return max(0.0, cold - min((r.warmup_s or 0.0) for r in eager))


def compile_verdict(search: Search, eager_runs: list[TrialResult],
                    compiled_runs: list[TrialResult]) -> str | None:
    """Why compile is not kept (None: it is): it must be faster by at least ``min_gain``
    (the mean of each side's faster half), and (eager step - compiled step) x expected
    steps must exceed the compile time measured on these runs."""
    eager_step, compiled_step = typical_step(eager_runs), typical_step(compiled_runs)
    compile_s = _compile_seconds(compiled_runs, eager_runs)
    steps = search.options.expected_steps
    saved = (eager_step - compiled_step) * steps
    if compiled_step * (1 + search.options.min_gain) > eager_step:
        gain = eager_step / compiled_step - 1
        return (f"within noise ({gain:+.1%})" if gain > -search.options.min_gain
                else f"slower ({gain:+.0%})")
    if saved <= compile_s:
        return (f"compile time {compile_s:.1f} s not repaid: saves "
                f"{(eager_step - compiled_step) * 1e3:.1f} ms/step x {steps} steps = "
                f"{saved:.1f} s")
    return None
