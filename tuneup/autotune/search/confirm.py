"""The last step: the pick, the defaults and the least certain simplification re-run
interleaved in one process, as many rounds as the budget left allows."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tuneup.autotune.search.labels import describe
from tuneup.autotune.search.outcome import Outcome
from tuneup.autotune.search.stages import HEADROOM
from tuneup.autotune.trials import TrialResult, log_ratio_interval, merge, typical_step
from tuneup.settings import Knobs

if TYPE_CHECKING:
    from tuneup.autotune.search.run import Search

MIN_ROUNDS, MAX_ROUNDS = 2, 12


def confirm(search: Search) -> Outcome:
    """Re-run the winner, the defaults and a simpler alternative; within noise the simpler
    settings win. The speed-up is the median of per-round ratios, with its 95 % interval."""
    assert search.baseline is not None and search.incumbent_result is not None
    search.on_stage("confirm")
    _name_a_noisy_machine(search)
    judge, budget = search.judge, search.budget
    tuned, default = search.incumbent, Knobs()
    outcome = Outcome(search.facts, tuned, judge.speed(search.baseline),
                      judge.speed(search.incumbent_result), search.results, search.rejected,
                      search.notes)
    if tuned == default:
        outcome.tuned_samples_per_s = outcome.baseline_samples_per_s
        return outcome
    configs = [tuned, default]
    alternative = simpler_alternative(search)
    if alternative is not None and alternative != default:
        configs.append(alternative)
    rounds = _affordable_rounds(search, configs)
    if rounds < MIN_ROUNDS and len(configs) > 2:  # the alternative's compile does not fit
        configs = configs[:2]
        rounds = _affordable_rounds(search, configs)
    if rounds < MIN_ROUNDS:
        search.note("confirm: skipped, budget exhausted; the speed-up is UNCONFIRMED "
                    "(single trials of the stages)")
        return outcome
    results = search.measure([search.trial(k) for _ in range(rounds) for k in configs])
    runs = {k: [r for r in results if r.trial.knobs == k] for k in configs}
    merged = {k: merge(v) for k, v in runs.items()}
    tuned_run, default_run = merged[tuned], merged[default]
    if tuned_run is None or default_run is None:
        search.note("confirm: re-runs failed; the speed-up is UNCONFIRMED "
                    "(single trials of the stages)")
        return outcome
    step = {k: typical_step(v) for k, v in runs.items()}  # medians over the rounds decide
    gain = 1 + search.options.min_gain
    winner = tuned_run
    alt_run = merged.get(alternative) if alternative is not None else None
    if alt_run is not None and step[tuned] * gain > step[alternative]:
        search.note(f"confirm: {describe(alternative)} is as fast within noise; "
                    "keeping the simpler settings")
        winner = alt_run
    needs_headroom = any(c.stage == HEADROOM for c in search.changes)
    if step[winner.trial.knobs] * gain > step[default] and not needs_headroom:
        search.note("confirm: nothing beat PyTorch defaults beyond noise; keeping defaults")
        measured = step[default] / step[winner.trial.knobs] - 1
        search.reject(winner, f"within noise of the defaults when confirmed ({measured:+.1%} "
                              f"over {rounds} interleaved rounds)")
        winner = default_run
    outcome.knobs = winner.trial.knobs
    batch = search.facts.samples_per_step
    outcome.tuned_samples_per_s = batch / step[winner.trial.knobs]
    outcome.baseline_samples_per_s = batch / step[default]
    outcome.confirmed = True
    outcome.speedup_interval = ratio_interval(runs[winner.trial.knobs], runs[default])
    return outcome


def _affordable_rounds(search: Search, configs: list[Knobs]) -> int:
    """Confirmation rounds that fit in the budget left. A process compiles once for one
    compiled configuration; with two different ones, each of their trials compiles again
    (the process keeps the graphs of the settings it compiled last)."""
    budget = search.budget
    per_round = budget.trial_seconds() + (len(configs) - 1) * budget.trial_seconds(
        search.baseline)
    compiled = len({k for k in configs if k.compile_mode})
    per_round += search.compile_s * compiled if compiled > 1 else 0.0
    fixed = budget.startup_seconds() + (search.compile_s if compiled == 1 else 0.0)
    return min(MAX_ROUNDS, int((budget.time_left() - fixed) // per_round))


NOISY_SPREAD = 0.15  # the same settings varying more than this between runs: a noisy machine


def _name_a_noisy_machine(search: Search) -> None:
    """Say so when the defaults, re-run through the search, vary beyond ``NOISY_SPREAD``:
    differences smaller than that spread are hard to tell apart, whatever the statistics."""
    speeds = sorted(search.judge.speed(r) for r in search.results
                    if r.trial.knobs == Knobs() and r.ok and r.step_time)
    if len(speeds) < 3 or speeds[-1] <= speeds[0] * (1 + NOISY_SPREAD):
        return
    spread = speeds[-1] / speeds[0] - 1
    search.note(f"machine: noisy: PyTorch defaults measured {speeds[0]:.0f} to {speeds[-1]:.0f} "
                f"samples/s over {len(speeds)} runs ({spread:+.0%}); differences of a few % "
                "are uncertain here: stop other jobs on this machine during tuning, or give "
                "--budget more time for more repeats")


def ratio_interval(picked: list[TrialResult], defaults: list[TrialResult]
                   ) -> tuple[float, float] | None:
    """95 % interval of the speed-up from paired rounds (step-time ratios, log scale)."""
    pairs = [(d.step_time, p.step_time) for p, d in zip(picked, defaults)
             if p.ok and d.ok and p.step_time and d.step_time]
    interval = log_ratio_interval([d for d, _ in pairs], [p for _, p in pairs])
    return None if interval is None else (math.exp(interval[0]), math.exp(interval[1]))


def simpler_alternative(search: Search) -> Knobs | None:
    """The incumbent without its least certain change (the one with the smallest gain)."""
    uncertain = [c for c in search.changes if c.stage not in ("compile", HEADROOM)
                 and c.gain < 2 * search.options.min_gain + 0.05]
    if not uncertain:
        return None
    change = min(uncertain, key=lambda c: c.gain)
    undone = {k: getattr(change.before, k) for k, v in change.after.to_dict().items()
              if getattr(change.before, k) != v}
    alternative = search.incumbent.replace(**undone)
    return None if alternative == search.incumbent else alternative
