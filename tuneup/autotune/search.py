"""The budgeted, staged search: which knobs to try, in what order, and what to keep.

Not a grid. After one baseline trial (plain PyTorch), stages run in order of expected
impact, each starting from the best settings so far (the *incumbent*) and measuring it
again in the same process as its candidates, so every comparison is like for like:

* ``amp``      autocast dtypes the device supports (CUDA also TF32 matmuls), loss-checked;
* ``batch``    smaller micro-batches with accumulation (same effective batch), early stop;
* ``loader``   ``num_workers`` upwards with early stop, then ``prefetch_factor`` /
               ``pin_memory`` where they matter and ``persistent_workers`` from the
               measured worker start-up;
* ``threads``  intra-op threads on a CPU run, where workers and threads share the cores;
* ``compile``  last and amortised: kept only when the saved step time times the expected
               steps exceeds the measured compile time, and its losses match eager.

An input-bound baseline (waiting for data a large share of the time) visits ``loader`` and
``threads`` first. A stage that found nothing is visited again once if later stages moved
the incumbent. Finally the winner, the defaults and the least certain simplification are
re-run interleaved in one process; within noise the simpler settings win.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from tuneup.autotune import space
from tuneup.autotune.runner import BUDGET, OK, PLAN_DEFAULTS, SKIPPED, Trial, TrialResult
from tuneup.autotune.space import CUDA_GRAPH_MODES, GROUPS, Hardware
from tuneup.settings import Knobs

# Stages that must leave room for compile. Threads too: the loader stage already tries the
# threads the workers leave over, where workers and threads compete for the cores.
LOW_IMPACT = ("batch", "threads", "loader_extras")
HEADROOM = "batch (memory headroom)"  # a change made for memory, kept whatever its speed  # stages that must leave room for compile
INPUT_BOUND_SHARE = 0.3  # baseline data-wait share above which the loader goes first
PREFETCH_WAIT_SHARE = 0.1  # data-wait share left that makes a deeper prefetch worth a trial
PERSISTENT_STARTUP_SHARE = 0.01  # worker start-up per epoch worth keeping workers alive
COMPILE_GUESS_S = 20.0  # compile-trial overhead assumed before one has been measured
DEFAULT_STARTUP_S = 5.0
MAX_CONFIRM_ROUNDS = 3
# Weight of each knob in "simpler": fewer and lighter changes win ties.
COMPLEXITY = {"compile_mode": 4, "amp_dtype": 3, "micro_batch_size": 3, "num_workers": 1,
              "cpu_threads": 1, "prefetch_factor": 1, "pin_memory": 1, "persistent_workers": 1,
              "cudnn_benchmark": 1, "float32_matmul_precision": 2}


class SearchError(Exception):
    """Nothing to tune: the script fails with PyTorch defaults, or no time to measure it."""


class Executor(Protocol):
    """Runs trials (the :class:`~tuneup.autotune.runner.Runner`, or recorded timings in tests)."""

    hardware: Hardware | None
    startup_s: float | None

    def run(self, trials: list[Trial],
            stop: Callable[[TrialResult], bool] | None = None) -> list[TrialResult]: ...

    def time_left(self) -> float: ...


@dataclass
class Options:
    groups: frozenset[str] = frozenset(GROUPS)
    expected_steps: int = 5000
    loss_tolerance: float = 0.05  # relative distance from the fp32 losses that is accepted
    min_gain: float = 0.03  # smallest speed-up worth a change, even on a quiet machine
    max_memory_bytes: int | None = None
    memory_headroom: float = 0.85  # share of --max-memory a chosen micro-batch may use


@dataclass
class Rejection:
    trial_id: str
    reason: str


@dataclass(frozen=True)
class Change:
    """One move of the incumbent: which stage, from what, to what, and its measured gain."""

    stage: str
    before: Knobs
    after: Knobs
    gain: float


@dataclass
class Outcome:
    """The search's answer."""

    hardware: Hardware
    knobs: Knobs
    baseline_samples_per_s: float
    tuned_samples_per_s: float
    results: list[TrialResult]
    rejected: list[Rejection]
    notes: list[str] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        return self.tuned_samples_per_s / self.baseline_samples_per_s


def complexity(knobs: Knobs) -> int:
    return sum(w for name, w in COMPLEXITY.items() if getattr(knobs, name) is not None)


def describe(knobs: Knobs) -> str:
    """Short label of the knobs that differ from PyTorch defaults: ``amp=bfloat16,workers=2``."""
    short = {"num_workers": "workers", "amp_dtype": "amp", "compile_mode": "compile",
             "micro_batch_size": "micro_batch", "cpu_threads": "threads",
             "prefetch_factor": "prefetch", "persistent_workers": "persistent",
             "float32_matmul_precision": "matmul", "cudnn_benchmark": "cudnn_benchmark",
             "pin_memory": "pin_memory"}
    parts = [f"{short[k]}={v}" for k, v in knobs.to_dict().items() if v is not None]
    return ",".join(parts) or "defaults"


def consistent(knobs: Knobs) -> Knobs:
    """Drop the worker-only knobs when there are no workers (the schema refuses them)."""
    if knobs.num_workers:
        return knobs
    return knobs.replace(prefetch_factor=None, persistent_workers=None)


def _key(knobs: Knobs) -> str:
    return json.dumps(knobs.to_dict(), sort_keys=True)


def loss_drift(losses: list[float] | None, reference: list[float]) -> float:
    """Largest relative distance of ``losses`` from the reference trajectory (inf if unusable)."""
    if not losses or len(losses) < len(reference) or not all(map(math.isfinite, losses)):
        return math.inf
    return max(abs(a - b) / max(abs(b), 1e-3) for a, b in zip(losses, reference))


class Search:
    """One tuning run over an :class:`Executor`."""

    def __init__(self, executor: Executor, options: Options | None = None,
                 on_best: Callable[[float, float], None] | None = None,
                 on_stage: Callable[[str], None] | None = None) -> None:
        self.executor = executor
        self.options = options or Options()
        self.on_best = on_best or (lambda speed, speedup: None)
        self.on_stage = on_stage or (lambda name: None)
        self.results: list[TrialResult] = []
        self.rejected: list[Rejection] = []
        self.notes: list[str] = []
        self.banned: set[tuple[str, object]] = set()  # (knob, value) that failed or drifted
        self.changes: list[Change] = []
        self.hw = Hardware()
        self.reference_losses: list[float] = []
        self.incumbent = Knobs()
        self.incumbent_result: TrialResult | None = None
        self.baseline: TrialResult | None = None
        self.speedup = 1.0  # incumbent over baseline, chained through the stages
        self.reserve_s = 0.0  # budget the current stage must leave for later ones
        self.stage_label = "baseline"
        self._ids: dict[str, int] = {}

    # ---- measuring ----------------------------------------------------------------

    def speed(self, result: TrialResult) -> float:
        """Samples per second of the effective batch."""
        if result.step_time:
            return self.hw.effective_batch / result.step_time
        return result.samples_per_s or 0.0

    def margin(self, a: TrialResult, b: TrialResult) -> float:
        """Relative difference that counts as real between two measurements."""
        return max(self.options.min_gain, 2 * math.hypot(a.noise, b.noise))

    def better(self, candidate: TrialResult, reference: TrialResult) -> bool:
        threshold = self.speed(reference) * (1 + self.margin(candidate, reference))
        return self.speed(candidate) > threshold

    def within_noise(self, a: TrialResult, b: TrialResult) -> bool:
        return not self.better(a, b) and not self.better(b, a)

    def trial(self, knobs: Knobs, check: bool = False) -> Trial:
        knobs = consistent(knobs)
        label = describe(knobs)
        self._ids[label] = self._ids.get(label, 0) + 1
        n = self._ids[label]
        return Trial(label if n == 1 else f"{label} #{n}", knobs, check)

    def measure(self, trials: list[Trial],
                stop: Callable[[TrialResult], bool] | None = None) -> list[TrialResult]:
        results = self.executor.run(trials, stop)
        self.results.extend(results)
        return results

    def trial_seconds(self, like: TrialResult | None = None) -> float:
        """Expected wall time of one trial like ``like`` (default: the incumbent's last one)."""
        base = like or self.incumbent_result or self.baseline
        step = base.step_time if base and base.step_time else 0.5
        warmup = base.warmup_s if base and base.warmup_s is not None else 2 * step
        window = max(PLAN_DEFAULTS["min_measure_seconds"], PLAN_DEFAULTS["measure_steps"] * step)
        return warmup + window + (PLAN_DEFAULTS["check_steps"] + 1) * step + 0.5

    def timeout(self, trial: Trial) -> float:
        """Per-trial timeout for the runner: generous, and longer for compile trials."""
        if self.baseline is None:
            return 300.0
        seconds = max(60.0, 10 * self.trial_seconds())
        return seconds + (600.0 if trial.knobs.compile_mode else 0.0)

    def startup_seconds(self) -> float:
        return self.executor.startup_s or DEFAULT_STARTUP_S

    def compile_seconds(self) -> float:
        """Expected cost of one compile stage: a process, two trials and a first compile."""
        return self.startup_seconds() + 2 * self.trial_seconds() + COMPILE_GUESS_S

    def compile_fits(self) -> bool:
        """Whether a compile stage fits in what is left (it is worth keeping room for)."""
        left = self.executor.time_left() - self.confirm_reserve() - self.compile_seconds()
        return bool(space.compile_modes(self.hw)) and left >= 0

    def confirm_reserve(self) -> float:
        return self.startup_seconds() + 2 * self.trial_seconds()

    def affordable(self, trials: int, extra_s: float = 0.0) -> int:
        """How many of ``trials`` fit in the budget after a reserve for one confirmation round
        (and, in low-impact stages, for the compile stage still to come)."""
        reserve = self.confirm_reserve() + self.reserve_s
        left = self.executor.time_left() - reserve - self.startup_seconds() - extra_s
        return max(0, min(trials, int(left // self.trial_seconds())))

    # ---- judging ------------------------------------------------------------------

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def reject(self, result: TrialResult, reason: str,
               ban: tuple[str, object] | None = None) -> None:
        self.rejected.append(Rejection(result.trial.id, reason))
        if ban:
            self.banned.add(ban)

    def acceptable(self, result: TrialResult) -> bool:
        """Failures, non-finite or drifting losses and memory over the cap are rejected.

        A rejected knob value (the one the trial changed) is not tried again.
        """
        knobs = result.trial.knobs
        changed = [(k, v) for k, v in knobs.to_dict().items() if getattr(self.incumbent, k) != v]
        ban = changed[0] if len(changed) == 1 else None
        if result.status != OK or result.step_time is None and not result.samples_per_s:
            self.reject(result, f"{result.status}: {result.message}".rstrip(": "), ban)
            return False
        if result.trial.check:
            drift = loss_drift(result.check_losses, self.reference_losses)
            if drift > self.options.loss_tolerance:
                why = ("loss went non-finite" if result.check_losses and
                       not all(map(math.isfinite, result.check_losses)) else
                       "no comparable check losses" if drift == math.inf else
                       f"loss left the fp32 trajectory by {drift:.1%} "
                       f"(tolerance {self.options.loss_tolerance:.0%})")
                self.reject(result, why, ban)
                return False
        accumulating = (knobs.micro_batch_size or self.hw.effective_batch) < self.hw.effective_batch
        if knobs.compile_mode in CUDA_GRAPH_MODES and accumulating and not result.trial.check:
            self.reject(result, "CUDA graphs with accumulation need the loss check", ban)
            return False
        cap = self.options.max_memory_bytes
        if cap and result.peak_memory_bytes and result.peak_memory_bytes > cap:
            self.reject(result, f"peak memory {result.peak_memory_bytes / 2**30:.2f} GiB "
                                f"above --max-memory", ban)
            return False
        return True

    def choose(self, reference: TrialResult, candidates: list[TrialResult], stage: str
               ) -> TrialResult:
        """The fastest acceptable result beyond noise of ``reference``; ties go to the simpler.

        The best candidate that looks faster but not beyond noise is re-run interleaved
        with the reference before it is given up.
        """
        accepted = [r for r in candidates
                    if r.status not in (SKIPPED, BUDGET) and self.acceptable(r)]
        winners = [r for r in accepted if self.better(r, reference)]
        promising = [r for r in accepted if r not in winners
                     and self.speed(r) > self.speed(reference) * (1 + self.options.min_gain)
                     and all(self.speed(r) > self.speed(w) for w in winners)]
        if promising:
            rerun = self.rerun(reference, max(promising, key=self.speed))
            if rerun is not None:
                reference, candidate = rerun
                accepted = [candidate if _key(r.trial.knobs) == _key(candidate.trial.knobs) else r
                            for r in accepted]
                winners = [w for w in accepted if self.better(w, reference)]
        for result in accepted:
            if not any(_key(w.trial.knobs) == _key(result.trial.knobs) for w in winners):
                gain = self.speed(result) / self.speed(reference) - 1
                self.reject(result, f"no gain beyond noise ({gain:+.1%})")
        pool = [reference, *winners]
        best = max(pool, key=self.speed)
        near = [r for r in pool if r is best or self.within_noise(r, best)]
        chosen = min(near, key=lambda r: (complexity(r.trial.knobs), -self.speed(r)))
        self.adopt(chosen, reference, stage)
        return chosen

    def rerun(self, reference: TrialResult, candidate: TrialResult
              ) -> tuple[TrialResult, TrialResult] | None:
        """Interleaved re-runs (R C R C) of an uncertain candidate; both pooled, or None."""
        if self.affordable(4) < 4:
            return None
        knobs = (reference.trial.knobs, candidate.trial.knobs)
        results = self.measure([self.trial(k) for _ in range(2) for k in knobs])
        again_reference = pool([reference, *results[0::2]])
        again_candidate = pool([candidate, *results[1::2]])
        if again_reference is None or again_candidate is None:
            return None
        return again_reference, again_candidate

    def adopt(self, chosen: TrialResult, reference: TrialResult, stage: str) -> None:
        """Make ``chosen`` the incumbent; ``reference`` is the old one measured beside it."""
        gain = self.speed(chosen) / self.speed(reference)
        if _key(chosen.trial.knobs) != _key(self.incumbent):
            self.changes.append(Change(stage, self.incumbent, chosen.trial.knobs, gain - 1))
            self.incumbent = chosen.trial.knobs
            self.speedup *= gain
        self.incumbent_result = chosen
        assert self.baseline is not None
        self.on_best(self.speed(self.baseline) * self.speedup, self.speedup)

    # ---- the stages ---------------------------------------------------------------

    def run(self) -> Outcome:
        self.on_stage("baseline")
        (baseline,) = self.measure([self.trial(Knobs(), check=True)])
        if not baseline.ok:
            raise SearchError(f"the script fails with PyTorch defaults ({baseline.status}: "
                              f"{baseline.message}); fix that before tuning")
        self.baseline = self.incumbent_result = baseline
        self.hw = self.executor.hardware or Hardware()
        self.reference_losses = [v for v in baseline.check_losses or [] if math.isfinite(v)]
        self.on_best(self.speed(baseline), 1.0)

        stages = self.stage_order(baseline)
        with_compile = "compile" in stages
        visited: list[tuple[str, str]] = []  # (stage, incumbent key when it found nothing)
        for name in [s for s in stages if s != "compile"]:
            before = _key(self.incumbent)
            low_impact = name in LOW_IMPACT and with_compile and self.compile_fits()
            self.reserve_s = self.compile_seconds() if low_impact else 0.0
            self.run_stage(name)
            if _key(self.incumbent) == before:
                visited.append((name, before))
        for name, key in visited:  # once more where later stages moved the incumbent
            low_impact = name in LOW_IMPACT and with_compile and self.compile_fits()
            self.reserve_s = self.compile_seconds() if low_impact else 0.0
            if _key(self.incumbent) != key:
                self.run_stage(name, again=True)
        self.reserve_s = 0.0
        if with_compile:
            self.run_stage("compile")
        return self.confirm()

    def stage_order(self, baseline: TrialResult) -> list[str]:
        """Stages by expected impact on this run; low-impact ones late, compile always last.

        CUDA: amp, batch (memory headroom), loader, loader extras, compile.
        CPU: amp, loader (with the threads workers leave over), threads, batch (rarely more
        than cache effects), loader extras, compile. Input-bound (waiting for data >= 30 %
        of the step): the loader first.
        """
        order = (("amp", "batch", "loader", "loader_extras", "compile") if self.hw.on_cuda
                 else ("amp", "loader", "threads", "batch", "loader_extras", "compile"))
        stages = [s for s in order if s.split("_")[0] in self.options.groups]
        if (baseline.data_wait_share or 0) >= INPUT_BOUND_SHARE and "loader" in stages:
            stages = ["loader"] + [s for s in stages if s != "loader"]
        return stages

    def run_stage(self, name: str, again: bool = False) -> None:
        self.stage_label = name + (" (again)" if again else "")
        self.on_stage(self.stage_label)
        getattr(self, f"stage_{name}")()

    def candidates(self, changed: str, values: list[object], check: bool = False) -> list[Trial]:
        """Trials changing one knob of the incumbent; none for knobs the script fixes itself."""
        if changed in self.hw.fixed_knobs:
            return []
        return [self.trial(self.incumbent.replace(**{changed: v}), check)
                for v in values if (changed, v) not in self.banned
                and v != getattr(self.incumbent, changed)]

    def compare(self, stage: str, trials: list[Trial],
                stop: Callable[[TrialResult], bool] | None = None) -> TrialResult | None:
        """Measure the incumbent and ``trials`` in one process and adopt the best.

        Without early stop the incumbent runs first and last (A B.. A) and counts with its
        faster run: interference on a shared machine only ever slows a trial down.
        """
        if not trials:
            return None
        fits = self.affordable(len(trials) + 2)
        if fits < 2:
            self.note(f"{self.stage_label}: skipped, budget too small")
            return None
        repeat = stop is None and fits >= 3
        plan = [self.trial(self.incumbent)] + trials[:fits - 1 - repeat]
        results = self.measure(plan + [self.trial(self.incumbent)] * repeat, stop)
        reference = pool(results[:1] + results[len(plan):])
        if reference is None:
            self.note(f"{stage}: the incumbent failed to re-run ({results[0].status})")
            return None
        return self.choose(reference, results[1:len(plan)], stage)

    def stage_amp(self) -> None:
        trials = self.candidates("amp_dtype", list(space.amp_dtypes(self.hw)), check=True)
        if self.incumbent.amp_dtype is None:
            trials += self.candidates("float32_matmul_precision",
                                      list(space.matmul_precisions(self.hw)), check=True)
        if trials:
            self.compare("amp", trials)

    def stage_batch(self) -> None:
        trials = self.candidates("micro_batch_size", list(space.micro_batches(self.hw)), check=True)
        reference = self.incumbent_result
        cap = self.options.max_memory_bytes
        over = bool(cap and reference and reference.peak_memory_bytes and
                    reference.peak_memory_bytes > cap * self.options.memory_headroom)
        if over:
            self.stage_batch_headroom(trials)
            return
        self.compare("batch", trials, stop=self.stop_when_flat())

    def stage_batch_headroom(self, trials: list[Trial]) -> None:
        """The incumbent's micro-batch leaves no memory headroom: take the largest that does."""
        cap = (self.options.max_memory_bytes or 0) * self.options.memory_headroom
        for result in self.measure(trials):
            if self.acceptable(result) and (result.peak_memory_bytes or 0) <= cap:
                self.note(f"batch: micro-batch {result.trial.knobs.micro_batch_size} "
                          "chosen for memory headroom")
                assert self.incumbent_result is not None
                self.adopt(result, self.incumbent_result, HEADROOM)
                return
        self.note("batch: no micro-batch keeps the memory headroom")

    def stop_when_flat(self, patience: int = 1) -> Callable[[TrialResult], bool]:
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
            if self.better(result, best[0]):
                best[0], flat[0] = result, 0
                return False
            flat[0] += 1
            return flat[0] >= patience

        return stop

    def stage_loader(self) -> None:
        workers = [n for n in space.worker_counts(self.hw) if n > (self.incumbent.num_workers or 0)]
        trials = self.candidates("num_workers", workers)
        shares_cores = self.shares_cores()
        if shares_cores:  # each count also with the threads the workers leave over
            trials = [t for trial in trials for t in (trial, *self.leftover_threads(trial))]
        reference = self.incumbent_result
        if trials:
            patience = 4 if shares_cores else 2  # two worker counts in a row without gain
            chosen = self.compare("loader", trials, stop=self.stop_when_flat(patience))
            reference = chosen or reference
        if self.incumbent.num_workers and reference is not None:
            self.decide_persistent_workers()

    def stage_loader_extras(self) -> None:
        """``pin_memory`` on CUDA, a deeper prefetch while the loop still waits for data."""
        reference = self.incumbent_result
        if not self.incumbent.num_workers or reference is None:
            return
        extra = []
        if self.hw.on_cuda and self.incumbent.pin_memory is None:
            extra += self.candidates("pin_memory", [True])
        still_waiting = (reference.data_wait_share or 0) > PREFETCH_WAIT_SHARE
        if still_waiting and self.incumbent.prefetch_factor is None:
            extra += self.candidates("prefetch_factor", [4])
        if extra:
            self.compare("loader", extra)

    def shares_cores(self) -> bool:
        """A CPU run tuning threads too: workers and intra-op threads compete for the cores."""
        return (not self.hw.on_cuda and "threads" in self.options.groups
                and "cpu_threads" not in self.hw.fixed_knobs)

    def leftover_threads(self, trial: Trial) -> list[Trial]:
        """The trial with ``cores - workers`` intra-op threads, when that differs from now."""
        threads = max(1, self.hw.usable_cores - (trial.knobs.num_workers or 0))
        current = trial.knobs.cpu_threads or self.hw.cpu_threads
        if threads == current or ("cpu_threads", threads) in self.banned:
            return []
        return [self.trial(trial.knobs.replace(cpu_threads=threads))]

    def decide_persistent_workers(self) -> None:
        """Keep workers alive across epochs when their start-up is a visible share of an epoch."""
        result, base = self.incumbent_result, self.baseline
        if (self.incumbent.persistent_workers is not None or result is None or base is None
                or not self.hw.dataset_size or result.warmup_s is None or base.warmup_s is None):
            return
        startup = max(0.0, result.warmup_s - base.warmup_s)
        steps_per_epoch = max(1, self.hw.dataset_size // self.hw.effective_batch)
        epoch_s = steps_per_epoch * (result.step_time or 0)
        if epoch_s and startup / epoch_s > PERSISTENT_STARTUP_SHARE:
            self.incumbent = self.incumbent.replace(persistent_workers=True)
            self.note(f"loader: persistent_workers (worker start-up {startup:.2f} s "
                      f"per {epoch_s:.1f} s epoch)")

    def stage_threads(self) -> None:
        if self.hw.on_cuda:
            return
        counts = space.thread_counts(self.hw, self.incumbent.num_workers or 0)
        self.compare("threads", self.candidates("cpu_threads", list(counts)))

    def stage_compile(self) -> None:
        if self.hw.on_cuda and self.incumbent.cudnn_benchmark is None:
            self.compare("compile", self.candidates("cudnn_benchmark", [True]))
        modes = list(space.compile_modes(self.hw))
        for trial in self.candidates("compile_mode", modes, check=True):
            if self.affordable(2, extra_s=COMPILE_GUESS_S) < 2:
                needed = COMPILE_GUESS_S + 2 * self.trial_seconds()
                self.note(f"compile: {trial.knobs.compile_mode} skipped, "
                          f"needs ~{needed:.0f} s more budget")
                continue
            reference, result = self.measure([self.trial(self.incumbent), trial])
            if reference.ok and self.acceptable(result) and self.amortised(reference, result):
                self.adopt(result, reference, "compile")

    def amortised(self, eager: TrialResult, compiled: TrialResult) -> bool:
        """(eager step - compiled step) x expected steps must exceed the compile time."""
        assert eager.step_time and compiled.step_time
        compile_s = max(0.0, (compiled.warmup_s or 0) - (eager.warmup_s or 0))
        saved = (eager.step_time - compiled.step_time) * self.options.expected_steps
        if not self.better(compiled, eager):
            gain = self.speed(compiled) / self.speed(eager) - 1
            self.reject(compiled, f"no gain beyond noise ({gain:+.1%})")
            return False
        if saved <= compile_s:
            self.reject(compiled, f"compile time {compile_s:.1f} s not repaid: saves "
                                  f"{(eager.step_time - compiled.step_time) * 1e3:.1f} ms/step x "
                                  f"{self.options.expected_steps} steps = {saved:.1f} s")
            return False
        return True

    # ---- confirmation -------------------------------------------------------------

    def simpler_alternative(self) -> Knobs | None:
        """The incumbent without its least certain change (the one with the smallest gain)."""
        uncertain = [c for c in self.changes if c.stage not in ("compile", HEADROOM)
                     and c.gain < 2 * self.options.min_gain + 0.05]
        if not uncertain:
            return None
        change = min(uncertain, key=lambda c: c.gain)
        undone = {k: getattr(change.before, k) for k, v in change.after.to_dict().items()
                  if getattr(change.before, k) != v}
        alternative = self.incumbent.replace(**undone)
        return None if _key(alternative) == _key(self.incumbent) else alternative

    def confirm(self) -> Outcome:
        """Interleaved re-runs of the winner, the defaults and a simpler alternative."""
        assert self.baseline is not None and self.incumbent_result is not None
        self.on_stage("confirm")
        tuned, default = self.incumbent, Knobs()
        outcome = Outcome(self.hw, tuned, self.speed(self.baseline),
                          self.speed(self.incumbent_result), self.results, self.rejected,
                          self.notes)
        if _key(tuned) == _key(default):
            outcome.tuned_samples_per_s = outcome.baseline_samples_per_s
            return outcome
        configs = [tuned, default]
        alternative = self.simpler_alternative()
        if alternative is not None and _key(alternative) != _key(default):
            configs.append(alternative)
        plain = self.trial_seconds(self.baseline)
        per_round = self.trial_seconds() + (len(configs) - 1) * plain
        left = self.executor.time_left() - self.startup_seconds()
        rounds = min(MAX_CONFIRM_ROUNDS, int(left // per_round))
        if rounds <= 0:
            self.note("confirm: skipped, budget exhausted; numbers from the stages")
            return outcome
        results = self.measure([self.trial(k) for _ in range(rounds) for k in configs])
        pooled = {_key(k): pool([r for r in results if _key(r.trial.knobs) == _key(k)])
                  for k in configs}
        tuned_run, default_run = pooled[_key(tuned)], pooled[_key(default)]
        if tuned_run is None or default_run is None:
            self.note("confirm: re-runs failed; numbers from the stages")
            return outcome
        winner = tuned_run
        alt_run = pooled.get(_key(alternative)) if alternative is not None else None
        if alt_run is not None and not self.better(tuned_run, alt_run):
            self.note(f"confirm: {describe(alternative)} is as fast within noise; "
                      "keeping the simpler settings")
            winner = alt_run
        needs_headroom = any(c.stage == HEADROOM for c in self.changes)
        if not self.better(winner, default_run) and not needs_headroom:
            self.note("confirm: nothing beat PyTorch defaults beyond noise; "
                      "keeping defaults")
            winner = default_run
        outcome.knobs = winner.trial.knobs
        outcome.tuned_samples_per_s = self.speed(winner)
        outcome.baseline_samples_per_s = self.speed(default_run)
        return outcome


def pool(results: list[TrialResult]) -> TrialResult | None:
    """One result from re-runs of the same knobs: the fastest window, counting its noise.

    Interference on a shared machine only ever slows a window down, so the fastest run is
    the closest to the machine's own speed. "Fastest" is judged by the upper end of each
    run's step time (mean + 2 standard errors): a clean run beats an erratic one.
    """
    ok = [r for r in results if r.ok]
    return min(ok, key=lambda r: (r.step_time or math.inf) * (1 + 2 * r.noise)) if ok else None
