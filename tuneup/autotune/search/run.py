"""The search's orchestration: the incumbent, measuring, comparing and adopting, in order."""

from __future__ import annotations

import math
from collections.abc import Callable

from tuneup.autotune import protocol
from tuneup.autotune.search import policy
from tuneup.autotune.search.budget import COMPILE_GUESS_S, Budget, Executor
from tuneup.autotune.search.confirm import confirm
from tuneup.autotune.search.judge import Judge, Options, Rejection
from tuneup.autotune.search.labels import complexity, consistent, describe
from tuneup.autotune.search.outcome import Change, Outcome
from tuneup.autotune.search.stages import (LOW_IMPACT_ROUNDS, RACE_ROUNDS, STAGES, CompileRace,
                                           SHOWN, change_shown, clearly_ahead, deepest_prefetch,
                                           measure_baseline, prediction, prefetch_to_try)
from tuneup.autotune.search.verdict import (interval_gain, is_look, paired_reason, verdict,
                                            window_noise)
from tuneup.autotune.space import GROUPS, ScriptFacts
from tuneup.autotune.trials import (Trial, TrialResult, log_ratio_interval, merge,
                                    paired_steps, typical_step)
from tuneup.settings import Knobs

RACE_REACH = 0.2  # candidates measured this much slower than the best are not raced
UNRACED_SPREADS = 2  # window-to-window spreads an unraced candidate's single window must clear


class Search:
    """One tuning run over an :class:`Executor`: stages from the registry in
    :mod:`tuneup.autotune.search.stages`, then the confirmation."""

    def __init__(self, executor: Executor, options: Options | None = None,
                 on_best: Callable[[float, float, str], None] | None = None,
                 on_stage: Callable[[str], None] | None = None) -> None:
        self.executor = executor
        self.options = options or Options()
        self.on_best = on_best or (lambda speed, speedup, label: None)
        self.on_stage = on_stage or (lambda name: None)
        self.judge = Judge(self.options)
        self.budget = Budget(executor)
        self.results: list[TrialResult] = []
        self.rejected: list[Rejection] = []
        self.notes: list[str] = []
        self.banned: set[tuple[str, object]] = set()  # (knob, value) that failed or drifted
        self.changes: list[Change] = []
        self.raced_out: dict[Knobs, list[TrialResult]] = {}  # the last race's losers' runs
        self.races: list[dict[Knobs, list[TrialResult]]] = []  # every race's rounds, by knobs
        self.incumbent = Knobs()
        self.baseline: TrialResult | None = None
        self.speedup = 1.0  # incumbent over baseline, chained through the stages
        self.stage_label = "baseline"
        self.compile_race: CompileRace | None = None  # for the confirmation to go on with
        self.compile_to_come = False  # races hold compile's share of the budget while True
        self.low_impact = False  # the stage's ceiling is below compile's: fewer race rounds
        self.more_to_come = False  # a stage still to run could gain more than a tie here
        self.stage_ceiling = 1.0  # the running stage's ceiling
        self.compile_fitted = False  # compile fitted the budget when this stage began
        self.stages_after = False  # stages are still to come after the running compile
        self._ids: dict[str, int] = {}
        self._compiled: set[Knobs] = set()  # compiled settings, for the cache check

    @property
    def facts(self) -> ScriptFacts:
        return self.judge.facts

    @property
    def baseline_knobs(self) -> Knobs:
        """What the pick must beat and the speed-up is measured against: PyTorch defaults,
        or the largest micro-batch that fits when the user's own batch does not (keeping
        the defaults then must not bring the out-of-memory back); nothing else."""
        return self.baseline.trial.knobs if self.baseline is not None else Knobs()

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
        fresh = not self.executor.live_process()
        results = self.executor.run(trials, stop)
        self.results.extend(results)
        if fresh:
            self._check_compile_cache(results)
        return results

    def _check_compile_cache(self, results: list[TrialResult]) -> None:
        """Say so when a fresh process compiled settings an earlier process compiled as
        slowly as that first compile: the run's inductor cache (in the children's shared
        TMPDIR, or the user's TORCHINDUCTOR_CACHE_DIR) was not hit, and every later
        compiled plan pays a cold compile."""
        first = next((r for r in results if r.ok and r.trial.knobs.compile_mode
                      and r.warmup_s is not None), None)
        eager = [r.warmup_s for r in self.results if r.ok and r.warmup_s is not None
                 and not r.trial.knobs.compile_mode]
        if first is not None and eager and self.budget.compile_s and \
                first.trial.knobs.without_loader() in self._compiled:
            again = first.warmup_s - min(eager)
            if again >= policy.CACHE_MISS_SHARE * self.budget.compile_s:
                self.note(f"compile: the run's inductor cache was not hit: a new process "
                          f"compiled again in {again:.0f} s (first compile "
                          f"{self.budget.compile_s:.0f} s)")
        self._compiled.update(r.trial.knobs.without_loader() for r in results
                              if r.ok and r.trial.knobs.compile_mode)

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
               ban: tuple[str, object] | None = None, on_speed: bool = False) -> None:
        self.rejected.append(Rejection(describe(result.trial.knobs), reason, on_speed))  # not "#3"
        if ban:
            self.banned.add(ban)

    # ---- comparing ----------------------------------------------------------------

    def candidates(self, changed: str, values: list[object], check: bool = False) -> list[Trial]:
        """Trials changing one knob of the incumbent; none for knobs the script fixes."""
        if changed in self.facts.fixed_knobs:
            return []
        points = [self.incumbent.replace(**{changed: v}) for v in values
                  if (changed, v) not in self.banned and v != getattr(self.incumbent, changed)]
        return [self.trial(k, check or self.judge.needs_check(k)) for k in points]

    def compare(self, stage: str, trials: list[Trial],
                stop: Callable[[TrialResult], bool] | None = None,
                beyond_noise: str | None = None, rounds: int | None = None
                ) -> TrialResult | None:
        """Measure the incumbent and ``trials`` in one plan and adopt the best.
        ``beyond_noise``: why this stage's change must be faster beyond noise (see
        :meth:`choose`), for stages whose ties go wrong later; ``rounds``: the race's at
        most (default: by the stage's impact).

        Without early stop the incumbent runs first and last (A B.. A) and counts with its
        faster run: interference on a shared machine only ever slows a trial down. Its
        first run is the one just measured where that was the last trial of the process
        that goes on with this plan (the same process, right before: like for like).
        """
        if not trials:
            return None
        fresh = self._fresh_incumbent_run() if stop is None else None
        head = 0 if fresh else 1  # the incumbent's first run still to measure
        fits = self.budget.affordable(len(trials) + head + 1)
        found = self.incumbent != self.baseline_knobs
        standing = self._find_standing() if fits < head + 1 and found else None
        if fits < head + 1 and policy.outweighs_confirmation(
                self.stage_ceiling, self.compile_ceiling(), found, standing is not None):
            # one sweep, no rounds: the gain comes first
            fits = self.budget.affordable(len(trials) + head + 1, confirmation=False)
            rounds = 0
            if fits >= head + 1:
                self.note(f"{self.stage_label}: measured with the confirmation's share of "
                          f"the budget (at most {self.stage_ceiling:.2f}x to find; "
                          f"{standing or 'nothing found yet to confirm'})")
        if fits < head + 1:
            self.note(f"{self.stage_label}: skipped, budget too small (needs ~"
                      f"{max(1, math.ceil(self.budget.shortfall(head + 1)))} s more: a "
                      "larger --budget)")
            return None
        repeat = stop is None and fits >= head + 2
        plan = [self.trial(self.incumbent)] * head + trials[:fits - head - repeat]
        results = self.measure(plan + [self.trial(self.incumbent)] * repeat, stop)
        if fresh is not None:
            results, plan = [fresh, *results], [fresh.trial, *plan]
        reference = merge(results[:1] + results[len(plan):])
        if reference is None:
            self.note(f"{stage}: the incumbent failed to re-run ({results[0].status})")
            return None
        return self.choose(reference, results[1:len(plan)], stage, beyond_noise, rounds)

    def _find_standing(self) -> str | None:
        """How far the find the confirmation would check already stands, in the words of a
        note (None: not beyond noise yet; see :func:`change_shown`, :func:`clearly_ahead`)."""
        if change_shown(self):
            return SHOWN
        if clearly_ahead(self):
            return "the find is clearly ahead of the defaults' windows, unconfirmed without a round"
        return None

    def _fresh_incumbent_run(self) -> TrialResult | None:
        """The incumbent's run that was the last trial measured, when the process that ran
        it waits for the next plan."""
        last = self.results[-1] if self.results else None
        if last is None or not last.ok or last.trial.knobs != self.incumbent or \
                not self.executor.live_process():
            return None
        return last

    def choose(self, reference: TrialResult, candidates: list[TrialResult], stage: str,
               beyond_noise: str | None = None, rounds: int | None = None) -> TrialResult:
        """The fastest acceptable result; ties (within ``min_gain``) go to the simpler.
        With ``beyond_noise`` (the reason), a change is kept only when its race rounds show
        it faster than the reference beyond the tie zone with 95 % confidence.

        Candidates within reach of the best, and always the fastest one, are raced against
        the reference (see
        :meth:`race`) until the slower ones are shown slower or the stage's budget is spent.
        """
        judge = self.judge
        accepted = [r for r in candidates if r.ran and self.acceptable(r)]
        best = max([reference, *accepted], key=judge.speed)
        reach = judge.speed(best) * (1 - RACE_REACH)
        fastest = max(accepted, key=judge.speed, default=None)  # raced however it measured
        raced = [r for r in accepted if judge.speed(r) >= reach or r is fastest]
        out_of_reach = [r for r in accepted if r not in raced]
        # the incumbent always: its sweep run is one window, often a fresh process's first
        # (left out when 20 % behind, train_mlp's loader stage twice took workers=2 on it,
        # which the plain harness measures 30 % slower there: 0.71 and 0.62 of the best)
        contenders = [reference, *raced]
        if rounds is None and self._clear_winner(reference, accepted):
            rounds = 0  # one window each already tells them apart: no rounds to spend
        if rounds is None:  # a close call is worth fewer rounds than a larger gain to come
            rounds = LOW_IMPACT_ROUNDS if self.low_impact or self.more_to_come else RACE_ROUNDS
        contenders, left_out = self._trim_to_fit(contenders, rounds)
        out_of_reach += left_out
        runs = self.race(contenders, rounds)
        merged = {knobs: merge(results) for knobs, results in runs.items()}
        survivors = {k: r for k, r in merged.items() if r is not None}
        reference = survivors.get(reference.trial.knobs, reference)
        typical = {k: typical_step(runs[k]) for k in survivors}  # the decision: medians
        fastest, gain = min(typical.values()), self._gain_needed(runs)
        near = [survivors[k] for k, step in typical.items() if step * (1 - gain) <= fastest]
        # among equal weights the faster, but one window each decides no tie: the reference
        unraced = not any(len(v) > 1 for v in runs.values())
        # fewer workers weigh less too: less memory and start-up for the same speed
        chosen = min(near, key=lambda r: (complexity(r.trial.knobs),
                                          unraced and r.trial.knobs != reference.trial.knobs,
                                          r.trial.knobs.num_workers or 0,
                                          typical[r.trial.knobs]))
        if self.compile_to_come:
            chosen = deepest_prefetch(chosen, near)
        held = None  # a change within noise where it must be beyond
        if beyond_noise and chosen.trial.knobs != reference.trial.knobs and \
                not self._faster_beyond_noise(runs, chosen, reference):
            held, chosen = chosen.trial.knobs, reference
        sweep = runs[chosen.trial.knobs][0]  # chosen's run in the sweep's process
        for knobs, result in survivors.items():
            if knobs not in (chosen.trial.knobs, reference.trial.knobs):
                paired = paired_reason(runs[knobs][1:], runs[chosen.trial.knobs][1:],
                                       self.options.tie, ", raced")
                reason = paired or judge.versus(runs[knobs][0], sweep)
                self.reject(result, f"{reason}; {beyond_noise}" if knobs == held else reason,
                            on_speed=True)
        for result in out_of_reach:  # against what won, not what it was swept beside
            self.reject(result, judge.versus(result, sweep), on_speed=True)
        ref_step, chosen_step = (typical.get(r.trial.knobs) for r in (reference, chosen))
        decided = ref_step / chosen_step if ref_step and chosen_step else None
        self.adopt(chosen, reference, stage, gain=decided)
        return chosen

    def _clear_winner(self, reference: TrialResult, accepted: list[TrialResult]) -> bool:
        """The fastest contender (a candidate or the reference) leads every other by a clear
        lead (:func:`policy.clear_lead`): rounds would not change the pick."""
        speed = self.judge.speed
        ranked = sorted([reference, *accepted], key=speed, reverse=True)
        if len(ranked) < 2:
            return False
        return policy.clear_lead(speed(ranked[0]) / speed(ranked[1]),
                                 max(r.noise for r in ranked[:2]), window_noise(self.results))

    def _faster_beyond_noise(self, runs: dict[Knobs, list[TrialResult]], chosen: TrialResult,
                             reference: TrialResult) -> bool:
        """Whether the race rounds put ``chosen`` faster than ``reference`` beyond the tie
        zone with 95 % confidence (a reference raced out was shown slower so)."""
        if reference.trial.knobs not in runs:
            return True
        interval = log_ratio_interval(*paired_steps(runs[chosen.trial.knobs][1:],
                                                    runs[reference.trial.knobs][1:]))
        return interval is not None and interval[1] < -self.options.tie

    def _gain_needed(self, runs: dict[Knobs, list[TrialResult]]) -> float:
        """The gain that decides a stage: ``min_gain`` once its race ran rounds; when the
        budget left it none (one window each), also twice the machine's window-to-window
        spread (on docs/examples/train_images.py one window each took micro_batch=64 at +6 %,
        7-8 % slower in the grid, with the incumbent's own windows 1438-1777 samples/s)."""
        if any(len(v) > 1 for v in runs.values()):
            return self.options.min_gain
        return max(self.options.min_gain, UNRACED_SPREADS * window_noise(self.results))

    def race(self, contenders: list[TrialResult], rounds: int = RACE_ROUNDS,
             tie: float | None = None, paired: dict[Knobs, list[TrialResult]] | None = None
             ) -> dict[Knobs, list[TrialResult]]:
        """Interleaved rounds of the contenders (A B C A B C ...), at most ``rounds`` of them
        and what the budget allows, in as few plans as possible (a plan pays a start-up when
        no process waits for it, and compiled contenders a compile when the process does
        not hold their graphs).

        The stop rule is per comparison, from the paired step-time ratios to the leader
        (each pair taken next to each other in time), looked at after 2, 3, 4, 6, 8, 12, ...
        rounds: a contender slower than the leader by more than ``tie`` (default
        ``min_gain``) with 95 % confidence is out; the race stops once every other
        contender is out or, with 95 % confidence, within ``tie`` of the leader (a tie,
        which the simpler settings win), or when its rounds are spent. ``paired``: rounds
        of the contenders already taken after their first runs (counted as the race's).
        """
        tie = self.options.tie if tie is None else math.log(1 + tie)
        runs = {r.trial.knobs: [r, *(paired or {}).get(r.trial.knobs, [])] for r in contenders}
        self.raced_out = {}
        done = min(len(v) - 1 for v in runs.values())
        if done >= 2 and not self._drop_slower(runs, tie):
            self._keep_rounds(runs)
            return runs  # decided by the rounds already taken
        while len(runs) >= 2 and done < rounds:
            fit = self._rounds_fit(runs, rounds - done)
            if fit < 2:
                break
            order = list(runs)
            seen: list[TrialResult] = []
            decided = [False]
            round_s = sum(self.budget.trial_seconds(merge(v)) for v in runs.values())

            def stop(result: TrialResult, order: list[Knobs] = order, fit: int = fit,
                     seen: list[TrialResult] = seen, decided: list[bool] = decided,
                     round_s: float = round_s) -> bool:
                if decided[0] or not result.ran:
                    return True
                seen.append(result)
                if len(seen) % len(order):
                    return False
                left = fit - len(seen) // len(order)
                if left and not self.budget.still_fits(left * round_s + self.compile_hold()):
                    return True
                if is_look(done + len(seen) // len(order)):
                    view = {k: v + [r for r in seen if r.trial.knobs == k]
                            for k, v in runs.items()}
                    slower, undecided = verdict(view, tie)
                    decided[0] = not undecided
                    return decided[0] or self._drop_pays(view, slower, left)
                return False

            results = self.measure([self.trial(k) for _ in range(fit) for k in order], stop)
            for result in results:  # failed runs too: the i-th of each stays one round
                if result.ran:
                    runs[result.trial.knobs].append(result)
            done += max(1, sum(r.ran for r in results) // len(order))
            undecided = self._drop_slower(runs, tie)
            if not undecided or decided[0] or any(r.status == protocol.BUDGET for r in results):
                break
        self._keep_rounds(runs)
        return runs

    def _trim_to_fit(self, contenders: list[TrialResult], rounds: int
                     ) -> tuple[list[TrialResult], list[TrialResult]]:
        """The contenders to race and those left out: where two of ``rounds`` rounds of all
        of them do not fit, the slowest candidates (never the reference, the first) leave on
        their one window until two rounds of the rest do, or the reference and the fastest
        are left. Where even those two get no rounds, one window each decides between them:
        the unraced tie zone (:meth:`_gain_needed`, two window spreads: 10-20 % on a noisy
        machine) holds slower candidates, and among all of them it took the simplest (in
        the replay, keeping them in the decision left 13 more landscapes over three seeds
        under 0.85 of the best at 60 s)."""
        kept = list(contenders)
        while rounds and len(kept) > 2 and \
                self._rounds_fit({r.trial.knobs: [r] for r in kept}, rounds) < 2:
            kept.remove(min(kept[1:], key=self.judge.speed))
        return kept, [r for r in contenders if r not in kept]

    def _rounds_fit(self, runs: dict[Knobs, list[TrialResult]], rounds: int) -> int:
        """How many of ``rounds`` interleaved rounds of the contenders of ``runs`` the budget
        holds (a fresh process's compile of a compiled one and compile's share included)."""
        extra_s = self.cold_start_seconds(runs) + self.compile_hold()
        return self.budget.affordable(rounds * len(runs), extra_s=extra_s) // len(runs)

    def _drop_pays(self, runs: dict[Knobs, list[TrialResult]], slower: dict[Knobs, object],
                   rounds_left: int) -> bool:
        """Whether to end the race's plan early to go on without the contenders already
        shown slower: their trials still planned in it cost more than the next plan's
        start-up (none while the process waits for it; a plan is fixed once handed over:
        the defaults, 30 % slower from the second round, ran all six rounds of a three-way
        race on train_images)."""
        if not slower or len(runs) - len(slower) < 2:
            return bool(slower)  # one left: nothing to race
        saved = sum(self.budget.trial_seconds(merge(runs[k])) for k in slower) * rounds_left
        return saved > self.budget.next_startup_seconds() + self.cold_start_seconds(
            {k: v for k, v in runs.items() if k not in slower})

    def _keep_rounds(self, runs: dict[Knobs, list[TrialResult]]) -> None:
        """The race's interleaved rounds (not the sweep's first runs), contenders raced out
        included: the confirmation decides on them and its own rounds together."""
        rounds = {k: v[1:] for k, v in {**runs, **self.raced_out}.items()}
        if sum(bool(v) for v in rounds.values()) >= 2:
            self.races.append(rounds)

    def _drop_slower(self, runs: dict[Knobs, list[TrialResult]], tie: float) -> bool:
        """Take the contenders slower beyond ``tie`` with confidence out of ``runs`` (into
        :attr:`raced_out`, rejected with their gain); whether any other is undecided."""
        slower, undecided = verdict(runs, tie)
        for knobs, interval in slower.items():
            self.raced_out[knobs] = runs.pop(knobs)
            loser = merge(self.raced_out[knobs])
            if loser is not None:
                self.reject(loser, f"slower ({interval_gain(interval):+.0%}, raced)",
                            on_speed=True)
        return undecided

    def compile_hold(self) -> float:
        """What a race before the compile stage leaves for it: extra rounds between settings
        already measured close are worth less than trying compile at all (a first sweep of
        a high-impact stage may still use it)."""
        if not self.compile_to_come or self.budget.reserve_s or not self.compile_fitted:
            return 0.0
        return self.budget.compile_seconds()

    def cold_start_seconds(self, runs: dict[Knobs, list[TrialResult]]) -> float:
        """What a fresh process pays beyond its start-up before the contenders run warm: the
        compile of a compiled contender from the run's cache (its slowest warm-up beyond the
        eager ones' was the cold compile)."""
        warmups = {k: max((r.warmup_s or 0.0) for r in v) for k, v in runs.items()}
        eager = [w for k, w in warmups.items() if not k.compile_mode]
        base = min(eager) if eager else 0.0
        cold = max([0.0] + [w - base for k, w in warmups.items() if k.compile_mode])
        return self.budget.warm_compile_seconds(cold) if cold else 0.0

    def adopt(self, chosen: TrialResult, reference: TrialResult, stage: str,
              gain: float | None = None) -> None:
        """Make ``chosen`` the incumbent; ``reference`` is the old one measured beside it.
        ``gain``: the speed-up the decision rested on (a race's typical steps), where it
        differs from the two results' own (the cleanest run of each, which can disagree:
        bfloat16 taken on its faster half of windows and noted as "measured 0.91x")."""
        gain = gain or self.judge.speed(chosen) / self.judge.speed(reference)
        if chosen.trial.knobs != self.incumbent:
            self.changes.append(Change(stage, self.incumbent, chosen.trial.knobs, gain - 1))
            self.incumbent = chosen.trial.knobs
            self.speedup *= gain
        self.budget.typical = chosen
        assert self.baseline is not None
        self.on_best(self.judge.speed(self.baseline) * self.speedup, self.speedup,
                     describe(self.incumbent))

    # ---- the run ------------------------------------------------------------------

    def run(self) -> Outcome:
        self.on_stage("baseline")
        baseline = measure_baseline(self)
        self.baseline = self.budget.baseline = self.budget.typical = baseline
        self.judge.reference_losses = [v for v in baseline.check_losses or []
                                       if math.isfinite(v)]
        self.on_best(self.judge.speed(baseline), 1.0, describe(self.incumbent))
        names = self.stage_names()
        self.compile_to_come = "compile" in names
        pending = list(names)
        if prediction(self) is not None:
            self.more_to_come = True
            self._run_with_ceiling("predict", self.ceiling("predict").factor)
        visited: dict[str, Knobs] = {}  # stage -> the incumbent it left
        again: set[str] = set()  # visited twice: once more where later stages moved it
        while True:
            # equal ceilings go to a stage visited again (the loader's workers before a
            # deeper prefetch, both at most removing the same wait)
            ready = [(s, True) for s, knobs in visited.items()
                     if s not in again and knobs != self.incumbent
                     and policy.revisit(s, self.incumbent)] + [
                (s, False) for s in pending]
            if not ready:
                break
            if self._compile_waits(pending):
                ready = [(s, a) for s, a in ready if s != "compile"] or ready
            scored = {s: self.ceiling(s) for s, _ in ready}
            name, is_again = max(ready, key=lambda item: scored[item[0]].factor)
            if not self.worth_trying(scored[name]):
                break
            if is_again:
                again.add(name)
            else:
                pending.remove(name)
            if name == "compile":
                if self._compile_before(pending):
                    break
                continue
            self.more_to_come = any(scored[s].factor >= policy.LARGE_GAIN
                                    for s, _ in ready if s != name)
            speedup, measured = self.speedup, len(self.results)
            self._run_with_ceiling(name, scored[name].factor, again=is_again)
            if len(self.results) > measured:  # it measured (not skipped for the budget)
                self.note(f"{self.stage_label}: ceiling {scored[name].factor:.2f}x "
                          f"({scored[name].why}); measured {self.speedup / speedup:.2f}x")
            visited[name] = self.incumbent
        last = "compile" in pending and self.worth_trying(self.ceiling("compile"))
        if last:  # after the stages, which held its share
            pending.remove("compile")
        for name in pending:  # never ran: below the noise, said why
            self.note(self.ceiling(name).skipped())
        if last:
            self._compile_before([])
        self.compile_to_come = self.more_to_come = False
        self.budget.reserve_s = 0.0
        return confirm(self)

    def _run_with_ceiling(self, name: str, factor: float, again: bool = False) -> None:
        """Run a stage with its ceiling at hand: whether it may take the confirmation's
        share reads it (:func:`policy.outweighs_confirmation`)."""
        self.stage_ceiling = factor
        try:
            self.run_stage(name, again=again)
        finally:
            self.stage_ceiling = 1.0

    def _compile_waits(self, pending: list[str]) -> bool:
        """Whether compile stays out of the ceiling order for now: while the budget holds
        its share (the stages of smaller ceilings hold it for compile, which comes last),
        and while a micro-batch for memory headroom is still to come (a change made for
        memory, not speed, whatever compile's ceiling)."""
        return self.budget.compile_fits(self.facts) or (
            "batch" in pending and self._needs_headroom())

    def _compile_before(self, pending: list[str]) -> bool:
        """Compile, then the loader after it, with the ``pending`` stages still to come
        (none when compile comes last): a budget may hold one cold compile, which stages
        of smaller ceilings must not take first. Once compiled, the stages end, each
        noted: one that changes what the graphs compute would compile them again, and the
        loader's are left to the stage after compile. Whether compile was adopted."""
        before = {name: self.ceiling(name) for name in pending}  # the eager incumbent's
        self.compile_to_come = self.more_to_come = False
        self.stages_after = bool(pending)
        try:
            self.run_stage("compile")
        finally:
            self.stages_after = False
        if not self.incumbent.compile_mode:
            return False
        if "loader" in self.options.groups:  # the compiled loop's wait bounds it
            self._run_with_ceiling("loader_after_compile", self.ceiling("loader").factor)
        for name, ceiling in before.items():
            if not self.worth_trying(ceiling):
                self.note(ceiling.skipped())
            elif policy.STAGE_GROUPS[name] == "loader":
                self.note(f"{name}: not tried after compile (at most {ceiling.factor:.2f}x "
                          "before it): the loader after compile measures what the compiled "
                          "loop waits for")
            else:
                self.note(f"{name}: not tried after compile (at most {ceiling.factor:.2f}x "
                          "before it): its trials would compile new graphs")
        pending.clear()
        return True

    def stage_names(self) -> list[str]:
        """The stages this run's groups and device allow (the order is the ceilings')."""
        names = [s for s, group in policy.STAGE_GROUPS.items() if group in self.options.groups]
        return [s for s in names if not (s in ("threads",) and self.facts.on_cuda)
                and not (s == "cudnn" and not self.facts.on_cuda)]

    def ceiling(self, name: str) -> policy.Ceiling:
        """``name``'s ceiling from the incumbent's latest run (see :mod:`policy`)."""
        if name == "predict":
            point = prediction(self)
            return policy.predicted_ceiling(self.budget.typical, self.incumbent,
                                            point or self.incumbent)
        alone = self._baseline_alone()
        return policy.ceiling(name, self.budget.typical, self.facts,
                              self.incumbent.num_workers or 0, self.options.expected_steps,
                              self.budget.compile_s or COMPILE_GUESS_S,
                              policy.split(alone)["data_wait"] if alone else None,
                              self.launch_s)

    def _baseline_alone(self) -> TrialResult | None:
        """The baseline where it ran without workers: its wait is the decoding, its host
        time the step's own."""
        base = self.baseline
        return base if base is not None and not base.trial.knobs.num_workers else None

    @property
    def launch_s(self) -> float | None:
        """The host time the incumbent's step launches by itself (see
        :func:`policy.launches`): the baseline's, where it ran without workers and its device
        time was measured, per micro-batch the incumbent runs; None otherwise."""
        base = self._baseline_alone()
        if base is None or base.device_s is None or not base.breakdown:
            return None
        return base.breakdown["host"] * self._splits(self.incumbent) / self._splits(
            base.trial.knobs)

    def _splits(self, knobs: Knobs) -> int:
        """Micro-batches a step of ``knobs`` runs (each launches the model's kernels)."""
        batch = self.facts.effective_batch
        return max(1, batch // (knobs.micro_batch_size or batch)) if batch else 1

    def compile_ceiling(self) -> float | None:
        """Compile's ceiling while it is still to come (None otherwise)."""
        return self.ceiling("compile").factor if self.compile_to_come else None

    def worth_trying(self, ceiling: policy.Ceiling) -> bool:
        """Whether a stage's ceiling clears the noise; a stage asked for by name (``--only``
        narrowing the groups) runs whatever its ceiling, as does a micro-batch for memory."""
        if ceiling.stage == "batch" and self._needs_headroom():
            return True  # a change made for memory, whatever its speed
        if self.options.groups != frozenset(GROUPS):
            return True
        return policy.worth_trying(ceiling, self.budget.typical, self.options.min_gain,
                                   self._resolvable_spread())

    def _resolvable_spread(self) -> float:
        """The machine's window-to-window spread as the rounds the budget holds see it:
        shrunk by the square root of their number (at most a stage's :data:`RACE_ROUNDS`;
        the noise of a mean over n rounds shrinks so), so a budget with room for a stage's
        race resolves gains below a single window's noise (a 17 % ceiling skipped beside a
        +19 % spread of the defaults, 98 s of 120 left unused: 0.85 of the best in the
        replay). A loose bar: the rounds are priced before the stage sets its reserves."""
        rounds = max(1, self.budget.affordable(2 * RACE_ROUNDS) // 2)
        return window_noise(self.results) / math.sqrt(rounds)

    def _needs_headroom(self) -> bool:
        cap, result = self.options.max_memory_bytes, self.incumbent_result
        return bool(cap and result and result.peak_memory_bytes
                    and result.peak_memory_bytes > cap * self.options.memory_headroom)

    def run_stage(self, name: str, again: bool = False) -> None:
        # a stage whose ceiling is below compile's, or visited again (a re-check), leaves
        # compile its share of the budget and races fewer rounds; a loop still waiting for
        # data makes its prefetch depth no low-impact knob on the first visit
        low_impact = (self.compile_to_come and self.budget.compile_fits(self.facts)
                      and name != "compile"
                      and (again or self.ceiling(name).factor < self.ceiling("compile").factor)
                      and not (name == "loader_extras" and not again
                               and prefetch_to_try(self, self.incumbent_result)))
        self.low_impact = low_impact or name == "loader_after_compile"
        # held through the stage once it fitted at its start: a sweep that leaves compile
        # short of its estimate must not free the rest for a race between close settings
        self.compile_fitted = self.compile_to_come and self.budget.compile_fits(self.facts)
        self.budget.reserve_s = self.budget.compile_seconds() if low_impact else 0.0
        self.stage_label = name + (" (again)" if again else "")
        self.on_stage(self.stage_label)
        STAGES[name](self)
