"""The search's orchestration: the incumbent, measuring, comparing and adopting, in order."""

from __future__ import annotations

import math
from collections.abc import Callable

from tuneup.autotune import protocol
from tuneup.autotune.search.budget import Budget, Executor
from tuneup.autotune.search.confirm import confirm
from tuneup.autotune.search.judge import Judge, Options, Rejection
from tuneup.autotune.search.labels import complexity, consistent, describe
from tuneup.autotune.search.outcome import Change, Outcome
from tuneup.autotune.search.stages import STAGES, measure_baseline
from tuneup.autotune.space import ScriptFacts
from tuneup.autotune.trials import (
    Trial,
    TrialResult,
    log_ratio_interval,
    merge,
    typical_step,
)
from tuneup.settings import Knobs

RACE_REACH = 0.2  # candidates measured this much slower than the best are not raced
MAX_RACE_CALLS = 3  # each: two interleaved rounds of the contenders, in one process


# Stages that must leave room for compile. Threads too: the loader stage already tries the
# threads the workers leave over, where workers and threads compete for the cores.
LOW_IMPACT = ("batch", "threads", "loader_extras")
INPUT_BOUND_SHARE = 0.3  # baseline data-wait share above which the loader goes first


class Search:
    """One tuning run over an :class:`Executor`: stages from the registry in
    :mod:`tuneup.autotune.search.stages`, then the confirmation."""

    def __init__(self, executor: Executor, options: Options | None = None,
                 on_best: Callable[[float, float], None] | None = None,
                 on_stage: Callable[[str], None] | None = None) -> None:
        self.executor = executor
        self.options = options or Options()
        self.on_best = on_best or (lambda speed, speedup: None)
        self.on_stage = on_stage or (lambda name: None)
        self.judge = Judge(self.options)
        self.budget = Budget(executor)
        self.results: list[TrialResult] = []
        self.rejected: list[Rejection] = []
        self.notes: list[str] = []
        self.banned: set[tuple[str, object]] = set()  # (knob, value) that failed or drifted
        self.changes: list[Change] = []
        self.raced_out: dict[Knobs, list[TrialResult]] = {}  # the last race's losers' runs
        self.incumbent = Knobs()
        self.baseline: TrialResult | None = None
        self.speedup = 1.0  # incumbent over baseline, chained through the stages
        self.stage_label = "baseline"
        self._ids: dict[str, int] = {}

    @property
    def facts(self) -> ScriptFacts:
        return self.judge.facts

    @property
    def incumbent_result(self) -> TrialResult | None:
        return self.budget.typical

    # ---- measuring ----------------------------------------------------------------

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

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def acceptable(self, result: TrialResult) -> bool:
        """Records a rejection (and bans the one knob value the trial changed) when the
        judge finds a problem with ``result``."""
        problem = self.judge.problem(result)
        if problem is None:
            return True
        changed = [(k, v) for k, v in result.trial.knobs.to_dict().items()
                   if getattr(self.incumbent, k) != v]
        self.reject(result, problem, changed[0] if len(changed) == 1 else None)
        return False

    def reject(self, result: TrialResult, reason: str,
               ban: tuple[str, object] | None = None) -> None:
        self.rejected.append(Rejection(result.trial.id, reason))
        if ban:
            self.banned.add(ban)

    # ---- comparing ----------------------------------------------------------------

    def candidates(self, changed: str, values: list[object], check: bool = False) -> list[Trial]:
        """Trials changing one knob of the incumbent; none for knobs the script fixes."""
        if changed in self.facts.fixed_knobs:
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
        fits = self.budget.affordable(len(trials) + 2)
        if fits < 2:
            self.note(f"{self.stage_label}: skipped, budget too small")
            return None
        repeat = stop is None and fits >= 3
        plan = [self.trial(self.incumbent)] + trials[:fits - 1 - repeat]
        results = self.measure(plan + [self.trial(self.incumbent)] * repeat, stop)
        reference = merge(results[:1] + results[len(plan):])
        if reference is None:
            self.note(f"{stage}: the incumbent failed to re-run ({results[0].status})")
            return None
        return self.choose(reference, results[1:len(plan)], stage)

    def choose(self, reference: TrialResult, candidates: list[TrialResult], stage: str
               ) -> TrialResult:
        """The fastest acceptable result; ties (within ``min_gain``) go to the simpler.

        Candidates within reach of the best are raced against the reference (see
        :meth:`race`) until the slower ones are shown slower or the stage's budget is spent.
        """
        judge = self.judge
        accepted = [r for r in candidates if r.status not in (protocol.SKIPPED, protocol.BUDGET)
                    and self.acceptable(r)]
        best = max([reference, *accepted], key=judge.speed)
        reach = judge.speed(best) * (1 - RACE_REACH)
        for result in accepted:
            if judge.speed(result) < reach:
                self.reject(result, judge.versus(result, reference))
        contenders = [reference, *(r for r in accepted if judge.speed(r) >= reach)]
        runs = self.race(contenders, 1 if stage in LOW_IMPACT else MAX_RACE_CALLS)
        merged = {knobs: merge(results) for knobs, results in runs.items()}
        survivors = {k: r for k, r in merged.items() if r is not None}
        reference = survivors.get(reference.trial.knobs, reference)
        typical = {k: typical_step(runs[k]) for k in survivors}  # the decision: medians
        fastest = min(typical.values())
        near = [survivors[k] for k, step in typical.items()
                if step * (1 - self.options.min_gain) <= fastest]
        chosen = min(near, key=lambda r: (complexity(r.trial.knobs), typical[r.trial.knobs]))
        for knobs, result in survivors.items():
            if knobs not in (chosen.trial.knobs, reference.trial.knobs):
                self.reject(result, judge.versus(result, chosen))
        self.adopt(chosen, reference, stage)
        return chosen

    def race(self, contenders: list[TrialResult], calls: int = MAX_RACE_CALLS
             ) -> dict[Knobs, list[TrialResult]]:
        """Interleaved rounds of the contenders (A B C A B C ...) while the budget allows.

        After each pair of rounds, from the paired step-time ratios to the leader: a
        contender slower by more than ``min_gain`` with 95 % confidence is out, and the race
        stops early when every other contender is, with 95 % confidence, within ``min_gain``
        of the leader (a tie, which the simpler settings win) or out.
        """
        tie = math.log(1 + self.options.min_gain)
        runs = {r.trial.knobs: [r] for r in contenders}
        self.raced_out = {}
        for _ in range(calls):
            if len(runs) < 2 or self.budget.affordable(2 * len(runs)) < 2 * len(runs):
                break
            results = self.measure([self.trial(k) for _ in range(2) for k in runs])
            for result in results:
                if result.ok:
                    runs[result.trial.knobs].append(result)
            leader = min(runs, key=lambda k: typical_step(runs[k]))
            undecided = False
            for knobs in [k for k in runs if k != leader]:
                interval = log_ratio_interval([r.step_time for r in runs[knobs][1:]],
                                              [r.step_time for r in runs[leader][1:]])
                if interval is None:
                    undecided = True
                elif interval[0] > tie:
                    self.raced_out[knobs] = runs.pop(knobs)
                    slower = merge(self.raced_out[knobs])
                    if slower is not None:
                        gain = 1 - math.exp(sum(interval) / 2)
                        self.reject(slower, f"slower ({-abs(gain):+.0%}, raced)")
                elif interval[1] >= tie:
                    undecided = True
            if not undecided:
                break
        return runs

    def adopt(self, chosen: TrialResult, reference: TrialResult, stage: str) -> None:
        """Make ``chosen`` the incumbent; ``reference`` is the old one measured beside it."""
        gain = self.judge.speed(chosen) / self.judge.speed(reference)
        if chosen.trial.knobs != self.incumbent:
            self.changes.append(Change(stage, self.incumbent, chosen.trial.knobs, gain - 1))
            self.incumbent = chosen.trial.knobs
            self.speedup *= gain
        self.budget.typical = chosen
        assert self.baseline is not None
        self.on_best(self.judge.speed(self.baseline) * self.speedup, self.speedup)

    # ---- the run ------------------------------------------------------------------

    def run(self) -> Outcome:
        self.on_stage("baseline")
        baseline = measure_baseline(self)
        self.baseline = self.budget.baseline = self.budget.typical = baseline
        self.judge.reference_losses = [v for v in baseline.check_losses or []
                                       if math.isfinite(v)]
        self.on_best(self.judge.speed(baseline), 1.0)
        names = self.stage_order(baseline)
        with_compile = "compile" in names
        visited: list[tuple[str, Knobs]] = []  # (stage, incumbent when it found nothing)
        for name in [s for s in names if s != "compile"]:
            before = self.incumbent
            self.run_stage(name, with_compile)
            if self.incumbent == before:
                visited.append((name, before))
        for name, knobs in visited:  # once more where later stages moved the incumbent
            if self.incumbent != knobs:
                self.run_stage(name, with_compile, again=True)
        self.budget.reserve_s = 0.0
        if with_compile:
            self.run_stage("compile", with_compile)
        return confirm(self)

    def stage_order(self, baseline: TrialResult) -> list[str]:
        """Stages by expected impact on this run; low-impact ones late, compile always last.

        CUDA: amp, batch (memory headroom), loader, loader extras, compile.
        CPU: amp, loader (with the threads workers leave over), threads, batch (rarely more
        than cache effects), loader extras, compile. Input-bound (waiting for data >= 30 %
        of the step): the loader first.
        """
        order = (("amp", "batch", "loader", "loader_extras", "compile") if self.facts.on_cuda
                 else ("amp", "loader", "threads", "batch", "loader_extras", "compile"))
        names = [s for s in order if s.split("_")[0] in self.options.groups]
        if (baseline.data_wait_share or 0) >= INPUT_BOUND_SHARE and "loader" in names:
            names = ["loader"] + [s for s in names if s != "loader"]
        return names

    def run_stage(self, name: str, with_compile: bool, again: bool = False) -> None:
        low_impact = name in LOW_IMPACT and with_compile and self.budget.compile_fits(self.facts)
        self.budget.reserve_s = self.budget.compile_seconds() if low_impact else 0.0
        self.stage_label = name + (" (again)" if again else "")
        self.on_stage(self.stage_label)
        STAGES[name](self)
