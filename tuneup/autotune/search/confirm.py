"""The last step: the pick, the defaults and one rival re-run interleaved in one process,
as many rounds as the budget left allows.

The rival is a setting the stages measured faster than the pick but left undecided, where
there is one. Otherwise a simplification: it undoes the least certain change, or a change
measured before a later one it interacts with (a micro-batch picked eagerly, then compile;
threads picked beside other workers): that pair is re-checked jointly here, not only stage
by stage. With no such change it undoes the smallest gain: the pick's closest rival, its
runner-up. When that is the defaults (a pick of one change), the rival is the fastest other
setting the stages measured."""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING

from tuneup.autotune.search.labels import describe, weightless_change
from tuneup.autotune.search.outcome import Change, Outcome, RunnerUp
from tuneup.autotune.search.speedup import (
    Comparison,
    compare,
    disturbed_note,
    speedup_beyond_noise,
    steady_step,
)
from tuneup.autotune.search.stages import HEADROOM, compile_verdict
from tuneup.autotune.search.verdict import interval_reason, is_look, paired_reason, verdict
from tuneup.autotune.trials import (
    TrialResult,
    confidence_faster,
    merge,
    paired_steps,
    typical_step,
)
from tuneup.settings import Knobs

if TYPE_CHECKING:
    from tuneup.autotune.search.run import Search

MIN_ROUNDS = 2
SLACK = 0.05  # of the budget left: windows run longer than the typical step the estimate uses
MAX_ROUNDS = 32  # a tie that stays undecided does not take a large budget's every second


def confirm(search: Search) -> Outcome:
    """Re-run the winner, the defaults and a rival; within noise the simpler settings win.
    The speed-up is the ratio of geometric-mean speeds over every steady run of the pick
    and the defaults, with its 95 % interval (``speedup.compare``); none when the baseline
    is kept."""
    outcome = _confirm(search)
    if outcome.kept_baseline:  # one speed, from every run of it: no speed-up to claim
        step = steady_step(search.results, outcome.baseline_knobs)
        speed = (search.facts.samples_per_step / step if step
                 else outcome.baseline_samples_per_s)
        outcome.baseline_samples_per_s = outcome.tuned_samples_per_s = speed
        outcome.speedup_interval = None
        outcome.measured_by = f"{_name(outcome.baseline_knobs)} kept: no speed-up to claim"
    return outcome


def _confirm(search: Search) -> Outcome:
    assert search.baseline is not None and search.incumbent_result is not None
    search.on_stage("confirm")
    _name_a_noisy_machine(search)
    judge = search.judge
    tuned, default = search.incumbent, search.baseline_knobs
    outcome = Outcome(search.facts, tuned, judge.speed(search.baseline),
                      judge.speed(search.incumbent_result), search.results, search.rejected,
                      search.notes, baseline_knobs=default)
    alternative, compile_rival = simpler_alternative(search), _compile_rival(search)
    # a setting measured faster than the pick is the open question: it goes first
    ahead = faster_contender(search)
    rival = ahead or alternative or compile_rival or closest_rival(search)
    contender = ahead if ahead != alternative else None  # the simpler wins its ties
    if rival in (None, default):  # the rival the pick's changes give is no rival: the defaults
        rival = contender = closest_contender(search)
    configs = list(dict.fromkeys(k for k in (tuned, default, rival) if k is not None))
    if len(configs) < 2:  # the defaults, and nothing left within reach of them
        if default.changed():  # no stage beat the micro-batch that fits
            _note_kept(search, default)
        return outcome
    rounds = _affordable_rounds(search, configs)
    if rounds < MIN_ROUNDS and len(configs) > 2:  # the rival's compile does not fit
        doubt = rival if rival in (alternative, compile_rival, ahead) else None
        configs = _two_to_rerun(search, configs, doubt)
        rounds = _affordable_rounds(search, configs)
    if rounds < MIN_ROUNDS:
        configs = _one_round(search, tuned, default, rival)
        rounds = min(1, _affordable_rounds(search, configs))
        if rounds:
            search.note("confirm: one round, all the budget left holds; decided on it and "
                        "the stages' rounds together (a larger --budget confirms with more)")
    if not rounds:
        return _from_the_stages(search, outcome)
    stop = StopRule(search, configs)
    results = search.measure([search.trial(k) for _ in range(rounds) for k in configs], stop)
    taken = [r for r in results if r.ran]
    runs = {k: [r for r in taken if r.trial.knobs == k] for k in configs}
    if stop.settled_after:
        search.note(f"confirm: settled after {stop.settled_after} of {rounds} rounds, "
                    f"{search.budget.time_left():.0f} s of the budget unused: each setting "
                    "beside the pick is slower beyond noise, or within it, with 95 % confidence")
    elif len(taken) < len(results):
        search.note(f"confirm: the budget ran out after {len(taken) // len(configs)} of "
                    f"{rounds} full rounds; decided on them and the stages' runs together")
    if any(merge(runs[k]) is None for k in (tuned, default) if k in runs):
        search.note("confirm: re-runs failed; the speed-up is UNCONFIRMED "
                    "(single trials of the stages)")
        return outcome
    step = {k: typical_step(v) for k, v in runs.items()}  # medians over the rounds decide
    if default not in step:  # not re-run: the stages' runs of the defaults
        step[default] = typical_step([r for r in search.results if r.trial.knobs == default])
    # within noise the simpler side wins, unless the two differ in compile (decided on the
    # compile race's rounds and these together, by the compile stage's own rule)
    simpler = rival if rival not in (None, default, contender) and \
        rival.compile_mode == tuned.compile_mode else None
    pick = _decide(search, runs, step, simpler, contender)
    headline = compare(search.results, pick, default)
    _restate_rejections(search, runs, pick, headline)
    outcome.knobs = pick
    outcome.runner_up = runner_up(pick, runs, step, default, headline)
    if headline is None:  # the pick's runs failed after all: the stages' figures stand
        return outcome
    return _take_headline(search, outcome, runs, headline)


def _take_headline(search: Search, outcome: Outcome, runs: dict[Knobs, list[TrialResult]],
                   headline: Comparison) -> Outcome:
    """``outcome``'s figures from ``headline`` (every steady run of its pick and baseline),
    said as measured over the confirmation's ``runs`` (none: the stages' runs alone)."""
    pick, default = outcome.knobs, outcome.baseline_knobs
    batch = search.facts.samples_per_step
    outcome.tuned_samples_per_s = batch / headline.pick_step_s
    outcome.baseline_samples_per_s = batch / headline.other_step_s
    # the baseline kept is confirmed by the re-runs; a speed-up only by its interval
    outcome.confirmed = pick == default or headline.confirmed
    outcome.speedup_interval = headline.interval
    outcome.measured_by = _how_measured(runs, headline, pick, default)
    disturbed = disturbed_note(headline.disturbed, batch, _name_any)
    if disturbed and pick != default:
        search.note(disturbed)
    return outcome


def _from_the_stages(search: Search, outcome: Outcome) -> Outcome:
    """No round fits: the speed-up over every steady run the stages made of the pick and
    the defaults, with its interval where each has two (confirmed, as the confirmation's,
    only where it excludes 1; the defaults' rejection restated in its words); from single
    trials, UNCONFIRMED, where they give no interval."""
    pick, default = outcome.knobs, outcome.baseline_knobs
    headline = compare(search.results, pick, default)
    if pick == default or headline is None or headline.log_interval is None:
        search.note("confirm: skipped, budget exhausted; the speed-up is UNCONFIRMED "
                    "(single trials of the stages)")
        return outcome
    _restate_rejections(search, {default: [], pick: []}, pick, headline)
    search.note("confirm: skipped, budget exhausted; the speed-up and its interval come "
                "from the stages' runs of the pick and the defaults")
    return _take_headline(search, outcome, {}, headline)


def _how_measured(runs: dict[Knobs, list[TrialResult]], headline: Comparison, pick: Knobs,
                  default: Knobs) -> str:
    """How the speed-up was measured, said beside it: the confirmation's interleaved rounds
    (none in ``runs``: the stages' runs alone), which runs the figure pools, and whether its
    interval excludes 1 (only then is it called confirmed: never "3.02x [0.67, 13.69]
    (confirmed)")."""
    rounds = len(runs.get(pick, []))
    beside = [_name(k) if k == default else describe(k) for k in runs if k != pick]
    where = f" beside {' and '.join(beside)}" if beside else ""
    stages = "" if default in runs else " (the defaults' from the stages)"
    pooled = "the ratio of geometric-mean speeds over every steady run of both"
    how = (f"re-measured in {rounds} interleaved round(s){where}; {pooled} in the "
           f"search{stages}, 95 % interval" if runs else
           f"from the stages' runs (no confirmation round fit the budget): {pooled}, "
           "95 % interval")
    if headline.confirmed:  # a slower pick (kept for memory headroom) is said to be slower
        slower = headline.log_interval is not None and headline.log_interval[1] < 0
        return f"confirmed{' slower' if slower else ''}: {how}"
    why = ("too few steady runs for an interval" if headline.log_interval is None
           else "the interval includes 1: no speed-up shown beyond noise")
    return (f"not confirmed: {how}; {why} (tune again when the machine is quieter, or with a "
            "larger --budget)")


def _two_to_rerun(search: Search, configs: list[Knobs], doubt: Knobs | None
                  ) -> list[Knobs]:
    """When the budget holds two settings a round, not three: the pick and the defaults,
    unless the stages already beat the defaults beyond noise (95 % interval of the speed-up
    above the tie zone) and the third, ``doubt``, is a comparison that can still be wrong:
    a setting the stages measured faster than the pick and left undecided, the pick's
    simpler alternative (bfloat16 chosen eagerly, then compiled: slower than
    compile alone on a CPU where bfloat16 gains nothing) or the other side of the compile
    race (a slow compile can leave that race no rounds: a held-out spectrogram model took
    compile on one pair of windows 3 % apart, 12 % slower in the grid). Against the
    defaults the pick can hardly be wrong. Without the defaults' slower trials in each
    round, the estimate has no cushion: hence the slack."""
    tuned, default = configs[0], configs[1]
    beaten = speedup_beyond_noise(search.results, tuned, default, search.options.min_gain)
    if doubt is None or beaten is None \
            or _affordable_rounds(search, [tuned, doubt], slack=SLACK) < MIN_ROUNDS:
        return [tuned, default]
    low, high = beaten
    search.note(f"confirm: {_name(default)} not re-run (the stages beat them beyond noise, "
                f"{low:.2f}x to {high:.2f}x): the budget holds the pick beside "
                f"{describe(doubt)} instead")
    return [tuned, doubt]


def _one_round(search: Search, tuned: Knobs, default: Knobs, rival: Knobs | None
               ) -> list[Knobs]:
    """What one round, all the budget left holds, re-runs: a compiled pick beside its eager
    side (compile, decided on its stage's runs and this round together, is the change most
    often in doubt when a slow compile left its race no rounds; the speed-up over the
    defaults then rests on every run of the search), otherwise the pick and the defaults,
    or its rival where the pick is the defaults (not the defaults twice)."""
    eager = _compile_rival(search)
    if eager is not None and tuned.compile_mode:
        return [tuned, eager]
    return [tuned, rival if tuned == default and rival is not None else default]


class StopRule:
    """The confirmation's stop rule: at the looks (after 2, 3, 4, 6, 8, ... rounds, never
    after 1), stop once every setting is decided against the fastest, as in the stages'
    races, and the speed-up the result will claim over the defaults is decided too (its
    interval, ``speedup.compare`` over every run of the search, excludes 1 or lies within
    the tie zone: a settled confirmation never reports an unconfirmed speed-up); remember
    the round (``settled_after``). A trial the budget cut stops it too, unsettled (that is
    not "settled after 1 of 5 rounds")."""

    def __init__(self, search: Search, configs: list[Knobs]) -> None:
        self.tie = search.options.tie
        self.configs = configs
        self.earlier = list(search.results)
        self.default = search.baseline_knobs
        self.seen: list[TrialResult] = []
        self.settled_after = 0

    def _claim_decided(self) -> bool:
        if self.default not in self.configs:  # not re-run: these rounds barely move it
            return True
        for knobs in self.configs:
            against = compare(self.earlier + self.seen, knobs, self.default)
            if knobs == self.default or against is None:
                continue
            low, high = against.log_interval or (-math.inf, math.inf)
            if not (low > 0 or high < 0 or (low > -self.tie and high < self.tie)):
                return False
        return True

    def __call__(self, result: TrialResult) -> bool:
        if not result.ran:
            return True
        self.seen.append(result)
        rounds, partial = divmod(len(self.seen), len(self.configs))
        if partial or not is_look(rounds):
            return False
        runs = {k: [r for r in self.seen if r.trial.knobs == k] for k in self.configs}
        if verdict(runs, self.tie, first_round=0)[1] or not self._claim_decided():
            return False
        self.settled_after = rounds
        return True


def _decide(search: Search, runs: dict[Knobs, list[TrialResult]], step: dict[Knobs, float],
            alternative: Knobs | None, contender: Knobs | None = None) -> Knobs:
    """The pick after the confirmation's rounds: compile decided again on its race's and
    these rounds together, the simpler alternative when as fast, a contender only when
    faster beyond noise, the defaults unless beaten beyond noise (a micro-batch for memory
    headroom stays)."""
    gain = 1 + search.options.min_gain
    pick = _redecide_compile(search, runs, search.incumbent)

    def as_fast(a: Knobs, b: Knobs, within: float = gain) -> bool:
        """``a`` is within ``within`` - 1 of ``b`` or faster: by the median of their paired
        ratios over these rounds and any stage race's that ran both, or (never raced side by
        side, or differing in compile) by their typical steps here."""
        logs = paired_logs(search, runs, a, b) if a.compile_mode == b.compile_mode else []
        if not logs:  # compile is decided by its own rule (_redecide_compile)
            return step[a] < step[b] * within
        return statistics.median(logs) < math.log(within)

    # the pick without a change of no weight (a deeper prefetch) is not the simpler: the
    # stages kept it faster or on a tie while compile was to come, and it is undone only
    # when the pick without it is faster beyond the tie zone (a few rounds' median flipped a
    # 3 % gain on train_images: 0.939 of the grid's best, 2026-11-26)
    weightless = alternative is not None and weightless_change(alternative, pick)
    if alternative is not None and merge(runs.get(alternative, [])) is not None and \
            as_fast(alternative, pick, 1 / gain if weightless else gain):
        why = (f"is faster by more than the tie zone ({gain - 1:.0%}); taking it" if weightless
               else "is as fast within noise, or faster; keeping the simpler settings")
        search.note(f"confirm: {describe(alternative)} {why}")
        pick = alternative
    overtaken = None
    if contender is not None and merge(runs.get(contender, [])) is not None and \
            not as_fast(pick, contender):
        overtaken, pick = pick, contender
    default = search.baseline_knobs
    needs_headroom = any(c.stage == HEADROOM for c in search.changes)
    kept_defaults = (pick != default and default in runs and as_fast(default, pick)
                     and not needs_headroom)
    if overtaken is not None:
        search.note(f"confirm: {describe(pick)} is faster beyond noise when re-run beside "
                    f"{describe(overtaken)}; "
                    + ("but not than the defaults" if kept_defaults else "taking it"))
    if kept_defaults:
        _note_kept(search, default)
        measured = step[default] / step[pick] - 1
        loser = merge(runs[pick])
        assert loser is not None
        search.reject(loser, f"within noise of the defaults when confirmed ({measured:+.1%} "
                             f"over {len(runs[default])} interleaved rounds)")
        pick = default
    elif pick == default and default.changed():  # no stage beat the micro-batch that fits
        _note_kept(search, default)
    return pick


def paired_logs(search: Search, runs: dict[Knobs, list[TrialResult]], a: Knobs, b: Knobs
                ) -> list[float]:
    """log(step of ``a`` / step of ``b``) for each round the two ran next to each other in
    time: the confirmation's and those of every stage race that ran both. Each pair shares
    the machine's state of the moment, so a slow stretch of it cancels out; the median
    sets aside a single disturbed window. Two confirmation rounds alone turned bfloat16 down
    on docs/examples/train_images.py (1339 and 1292 samples/s against 1347 and 1119 without
    it) after four race rounds had each measured it 13-48 % faster."""
    logs = []
    for rounds in [runs, *search.races]:
        if rounds.get(a) and rounds.get(b):
            mine, theirs = paired_steps(rounds[a], rounds[b])
            logs += [math.log(x / y) for x, y in zip(mine, theirs)]
    return logs


def _note_kept(search: Search, default: Knobs) -> None:
    search.note(f"confirm: nothing beat {_name(default)} beyond noise; keeping "
                + ("it" if default.changed() else "defaults"))


def _restate_rejections(search: Search, runs: dict[Knobs, list[TrialResult]], pick: Knobs,
                        headline: Comparison | None) -> None:
    """A setting rejected on speed and re-run here is judged again on these rounds beside
    the pick, the closest comparison the search made, and these rounds' verdict stands:
    its stage's (``slower (-5%)``, or ``likely slower (-11%)`` from a short race) must not
    contradict the runner-up's (a tie at 0.99x). The defaults are judged on ``headline``,
    the speed-up the result gives (every steady run of the two): two paired rounds alone
    called them ``within noise (-41.0%)`` beside a speed-up of 1.56x [1.32, 1.84]. The pick
    itself is no longer rejected. Compile is left to its own rule, which pools its race's
    rounds with these."""
    search.rejected[:] = [r for r in search.rejected
                          if not (r.on_speed and r.trial_id == describe(pick))]
    tie, default = search.options.tie, search.baseline_knobs
    for knobs, results in runs.items():
        if knobs == default != pick:  # in the words of the result's speed-up interval
            reason = headline and headline.log_interval and interval_reason(
                headline.log_interval, tie, ", confirmed")
        elif knobs == pick or knobs.compile_mode != pick.compile_mode:
            continue
        else:
            reason = paired_reason(results, runs[pick], tie, ", confirmed")
        for rejection in search.rejected:
            if reason and rejection.on_speed and rejection.trial_id == describe(knobs):
                rejection.reason = reason


def _name_any(knobs: Knobs) -> str:
    return "PyTorch defaults" if not knobs.changed() else describe(knobs)


def _name(default: Knobs) -> str:
    """The baseline's name in notes: the defaults, or (the only other baseline there is,
    see ``Search.baseline_knobs``) the micro-batch that fits."""
    return f"{describe(default)} (the largest micro-batch that fits)" if default.changed() \
        else "PyTorch defaults"


def _compile_rival(search: Search) -> Knobs | None:
    """The other side of the compile race, when the pick is one side of it."""
    race = search.compile_race
    if race is None or search.incumbent not in (race.eager, race.compiled):
        return None
    return race.compiled if search.incumbent == race.eager else race.eager


def _redecide_compile(search: Search, runs: dict[Knobs, list[TrialResult]], pick: Knobs
                      ) -> Knobs:
    """Compile decided again when both sides of its race were re-run: the race's rounds and
    the confirmation's together, by the stage's own rule."""
    race = search.compile_race
    if race is None or not all(merge(runs.get(k, [])) is not None
                               for k in (race.eager, race.compiled)):
        return pick
    eager_runs = race.runs[race.eager] + runs[race.eager]
    compiled_runs = race.runs[race.compiled] + runs[race.compiled]
    reason = compile_verdict(search, eager_runs, compiled_runs)
    rounds = len(runs[race.compiled])
    if reason is None and pick == race.eager:
        if race.rejection in search.rejected:
            search.rejected.remove(race.rejection)
        search.note(f"confirm: {describe(race.compiled)} kept after all: faster with the "
                    f"confirmation's {rounds} rounds added to its stage's")
        return race.compiled
    if reason is not None and pick == race.compiled:
        loser = merge(runs[race.compiled])
        assert loser is not None
        search.reject(loser, f"{reason}, with the confirmation's {rounds} rounds added")
        return race.eager
    if reason is None and typical_step(runs[race.eager]) < typical_step(runs[race.compiled]):
        # the runner-up will say eager was faster here: say why compile stays
        search.note(f"confirm: {describe(race.compiled)} stays: faster over its stage's "
                    f"{len(race.runs[race.compiled])} runs and the confirmation's {rounds} "
                    "together, though not in the confirmation's alone (a noisy machine: "
                    "tune again when it is quieter, or with a larger --budget)")
    return pick


def runner_up(pick: Knobs, runs: dict[Knobs, list[TrialResult]], step: dict[Knobs, float],
              default: Knobs, headline: Comparison | None) -> RunnerUp | None:
    """The fastest of the other confirmed settings, against the pick: the defaults by the
    headline's own figures (their speed is 1 / the speed-up, and the confidence comes from
    the same interval: a runner-up line that implied 1.14x once sat beside a headline of
    1.66x), any other round by round."""
    others = [k for k in runs if k != pick and math.isfinite(step[k])]
    if not others:
        return None
    second = min(others, key=lambda k: step[k])
    if second == default and headline is not None and headline.confidence is not None:
        return RunnerUp(second, 1 / headline.speedup, headline.confidence)
    theirs, ours = paired_steps(runs[second], runs[pick])
    confidence = confidence_faster(theirs, ours)
    if confidence is None:
        return None
    relative = math.exp(statistics.fmean(math.log(p / s) for s, p in zip(theirs, ours)))
    return RunnerUp(second, relative, confidence)


def _affordable_rounds(search: Search, configs: list[Knobs], slack: float = 0.0) -> int:
    """Confirmation rounds that fit in the budget left. A process compiles once (from the
    run's cache) for one compiled configuration, or not at all where a waiting process
    holds its graphs; with two whose graphs differ, each of their trials compiles again
    (the process keeps the graphs of the settings it compiled last; settings that differ
    in loader knobs alone share them)."""
    budget = search.budget
    per_round = budget.trial_seconds() + (len(configs) - 1) * budget.trial_seconds(
        search.baseline)
    graphs = {k.without_loader() for k in configs if k.compile_mode}
    warm = budget.warm_compile_seconds() if graphs else 0.0
    per_round += warm * len(graphs) if len(graphs) > 1 else 0.0
    fixed = budget.next_startup_seconds() + (
        warm if len(graphs) == 1 and graphs != {budget.executor.held_graphs()} else 0.0)
    return max(0, min(MAX_ROUNDS, int((budget.time_left() * (1 - slack) - fixed) // per_round)))


NOISY_SPREAD = 0.15  # the same settings varying more than this between runs: a noisy machine


def _name_a_noisy_machine(search: Search) -> None:
    """Say so when the defaults, re-run through the search, vary beyond ``NOISY_SPREAD``:
    differences smaller than that spread are hard to tell apart, whatever the statistics."""
    speeds = sorted(search.judge.speed(r) for r in search.results
                    if r.trial.knobs == search.baseline_knobs and r.ok and r.step_time)
    if len(speeds) < 3 or speeds[-1] <= speeds[0] * (1 + NOISY_SPREAD):
        return
    spread = speeds[-1] / speeds[0] - 1
    search.note(f"machine: noisy: {_name(search.baseline_knobs)} measured {speeds[0]:.0f} to "
                f"{speeds[-1]:.0f} "
                f"samples/s over {len(speeds)} runs ({spread:+.0%}); differences of a few % "
                "are uncertain here: stop other jobs on this machine during tuning, or give "
                "--budget more time for more repeats")


# (earlier stage, later stage): a choice of the earlier one measured without the later change
INTERACTING = {("batch", "compile"), ("threads", "loader"), ("loader", "threads")}


def simpler_alternative(search: Search) -> Knobs | None:
    """The incumbent without its least certain change (the smallest gain) among those
    gaining little, made before a later change they interact with, or made after compile
    (in a short race that the budget left: its undoing keeps the compiled graphs, so the
    re-check costs no second compile)."""
    changes = [c for c in search.changes if c.stage != HEADROOM]
    compiled_at = next((i for i, c in enumerate(changes) if c.stage == "compile"), len(changes))
    doubtful = [c for i, c in enumerate(changes) if c.stage != "compile"
                and (c.gain < 2 * search.options.min_gain + 0.05 or i > compiled_at
                     or _interacts_later(c, changes[i + 1:]))]
    # a change of no weight (a deeper prefetch, kept faster or on a tie) is doubted last
    return _undo(search, min(doubtful, key=lambda c: (weightless_change(c.before, c.after),
                                                      c.gain))) if doubtful else None


def closest_rival(search: Search) -> Knobs | None:
    """The incumbent without the change that gained least: re-run beside the pick only to
    say how sure the pick is, since the stages settled it already. A compiled pick's rival
    is the pick without compile (a second compiled setting would compile every round)."""
    changes = [c for c in search.changes if c.stage != HEADROOM]
    if search.incumbent.compile_mode:
        changes = [c for c in changes if c.stage == "compile"]
    return _undo(search, min(changes, key=lambda c: c.gain)) if changes else None


def closest_contender(search: Search) -> Knobs | None:
    """The fastest other setting the stages measured (not the defaults, the same compile
    mode as the pick, none of its values rejected, and the pick's micro-batch where that was
    chosen for memory headroom): when the pick's one change undone is the defaults, this is
    the comparison that can still be wrong."""
    return _fastest(_contender_steps(search))


def _fastest(times: dict[Knobs, list[float]]) -> Knobs | None:
    return min(times, key=lambda k: statistics.geometric_mean(times[k])) if times else None


def _contender_steps(search: Search) -> dict[Knobs, list[float]]:
    """The step times of every setting :func:`closest_contender` may name."""
    pick, default = search.incumbent, search.baseline_knobs
    headroom = any(c.stage == HEADROOM for c in search.changes)
    times: dict[Knobs, list[float]] = {}
    for result in search.results:
        knobs = result.trial.knobs
        if knobs in (pick, default) or knobs.compile_mode != pick.compile_mode or \
                not result.ran or headroom and knobs.micro_batch_size != pick.micro_batch_size:
            continue
        if not (result.ok and result.step_time) or search.judge.problem(result) is not None:
            times[knobs] = [math.inf]  # failed or drifted once: no contender
        elif math.inf not in times.setdefault(knobs, []):
            times[knobs].append(result.step_time)
    return {k: v for k, v in times.items() if math.inf not in v
            and not any(item in search.banned for item in k.to_dict().items())}


def faster_contender(search: Search) -> Knobs | None:
    """:func:`closest_contender` where its windows were faster than the pick's by more than
    ``min_gain`` (geometric means) and no race ran the two side by side: a question the
    stages left open, when their race had no rounds to spend or one window each fell inside
    the unraced tie zone (a loader after compile measured +18 % on one window against 10 %
    window noise and was left out). The confirmation races it beside the pick, and takes it
    when faster there. A setting a race already decided against the pick stays decided."""
    times, pick = _contender_steps(search), search.incumbent
    other = _fastest(times)
    pick_steps = [r.step_time for r in search.results if r.trial.knobs == pick and r.ran
                  and r.ok and r.step_time and search.judge.problem(r) is None]
    if other is None or not pick_steps or any(race.get(other) and race.get(pick)
                                              for race in search.races):
        return None
    other_step = statistics.geometric_mean(times[other])
    faster = other_step * (1 + search.options.min_gain) < statistics.geometric_mean(pick_steps)
    return other if faster else None


def _undo(search: Search, change: Change) -> Knobs | None:
    undone = {k: getattr(change.before, k) for k, v in change.after.to_dict().items()
              if getattr(change.before, k) != v}
    alternative = search.incumbent.replace(**undone)
    return None if alternative == search.incumbent else alternative


def _interacts_later(change: Change, later: list[Change]) -> bool:
    return any((change.stage, c.stage) in INTERACTING for c in later)
