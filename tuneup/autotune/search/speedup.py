"""What the result claims about two settings, from one statistic: the headline speed-up and
its interval, the runner-up line and the confirmation's restated rejections all come from
:func:`compare`, so they cannot tell two stories (a headline of 1.66x once sat beside a
runner-up line that implied 1.14x).

The figure pools every run of the two settings in the search, after setting aside the
windows a disturbance took (one window of the defaults at 22 samples/s among 780s once made
a headline of 3.02x [0.67, 13.69]). A speed-up is *confirmed* only when its 95 % interval
excludes 1."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from tuneup.autotune.trials import TrialResult, student_t_cdf, student_t_quantile
from tuneup.settings import Knobs

OUTLIER_Z = 3.5  # robust z-score (Iglewicz and Hoaglin's cut) beyond which a window is disturbed
MIN_SPREAD = 0.03  # log units: a robust spread no smaller than 3 % (tight runs keep a 10 % window)
PAIR_FACTOR = 2.0  # of two windows, the slower is disturbed when this many times slower
MAD_TO_SD = 1.4826  # the median absolute deviation of a normal sample, as its standard deviation


@dataclass(frozen=True)
class Disturbed:
    """A window set aside: its step time and the typical (median) step of its setting."""

    knobs: Knobs
    step_s: float
    typical_s: float


@dataclass(frozen=True)
class Comparison:
    """``other`` set against ``pick`` over every steady run of both in the search.

    ``log_interval``: 95 % interval (Welch's t) of ``log(other's step / pick's step)``, None
    with fewer than two steady runs on a side; ``confidence``: the one-sided chance, from
    the same t, that the pick is the faster; ``pick_step_s`` and ``other_step_s``: the
    geometric means of their steady runs (their ratio is the interval's centre)."""

    pick_step_s: float
    other_step_s: float
    log_interval: tuple[float, float] | None
    confidence: float | None
    disturbed: tuple[Disturbed, ...] = ()

    @property
    def speedup(self) -> float:
        """The pick's speed over the other's."""
        return self.other_step_s / self.pick_step_s

    @property
    def interval(self) -> tuple[float, float] | None:
        """:attr:`log_interval` as a 95 % interval of :attr:`speedup`."""
        if self.log_interval is None:
            return None
        return math.exp(self.log_interval[0]), math.exp(self.log_interval[1])

    @property
    def confirmed(self) -> bool:
        """The interval excludes 1: a speed-up above it, or a slowdown below it."""
        return self.log_interval is not None and (self.log_interval[0] > 0
                                                  or self.log_interval[1] < 0)


def steady_steps(results: list[TrialResult], knobs: Knobs
                 ) -> tuple[list[float], list[Disturbed]]:
    """Step times of every measured run of ``knobs``, less the disturbed ones: with three
    or more, those whose log lies more than ``OUTLIER_Z`` robust standard deviations (the
    median absolute deviation, no less than ``MIN_SPREAD``) above the median; with two, the
    slower when ``PAIR_FACTOR`` times slower (no spread can be told from two). Only slow
    windows: interference on a shared machine only ever slows a window down, and a setting
    whose later runs are faster (a busy stretch in its stage) is not a disturbance."""
    steps = [r.step_time for r in results
             if r.ok and r.step_time and r.step_time > 0 and r.trial.knobs == knobs]
    if len(steps) == 2:
        fast, slow = sorted(steps)
        if slow > fast * PAIR_FACTOR:
            return [fast], [Disturbed(knobs, slow, fast)]
        return steps, []
    if len(steps) < 3:
        return steps, []
    logs = [math.log(s) for s in steps]
    centre = statistics.median(logs)
    spread = max(MAD_TO_SD * statistics.median(abs(x - centre) for x in logs), MIN_SPREAD)
    kept = [s for s, x in zip(steps, logs) if x - centre <= OUTLIER_Z * spread]
    typical = math.exp(centre)
    return kept, [Disturbed(knobs, s, typical) for s in steps if s not in kept]


def steady_step(results: list[TrialResult], knobs: Knobs) -> float | None:
    """The geometric mean of the steady runs of ``knobs``: the step the result reports."""
    kept, _ = steady_steps(results, knobs)
    return statistics.geometric_mean(kept) if kept else None


def compare(results: list[TrialResult], pick: Knobs, other: Knobs) -> Comparison | None:
    """``other`` against ``pick`` over every steady run of both; None when either has none."""
    mine, my_disturbed = steady_steps(results, pick)
    theirs, their_disturbed = steady_steps(results, other)
    if not mine or not theirs:
        return None
    a, b = [math.log(x) for x in theirs], [math.log(x) for x in mine]
    centre = statistics.fmean(a) - statistics.fmean(b)
    interval = confidence = None
    if pick == other:
        interval, confidence = (0.0, 0.0), 0.5
    elif len(a) >= 2 and len(b) >= 2:
        va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
        if va + vb == 0:
            interval = (centre, centre)
            confidence = 1.0 if centre > 0 else 0.0 if centre < 0 else 0.5
        else:
            # Welch-Satterthwaite degrees of freedom, rounded down (the cautious side)
            df = max(1, int((va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))))
            error = math.sqrt(va + vb)
            half = student_t_quantile(0.975, df) * error
            interval = (centre - half, centre + half)
            confidence = student_t_cdf(centre / error, df)
    return Comparison(math.exp(statistics.fmean(b)), math.exp(statistics.fmean(a)), interval,
                      confidence, tuple(my_disturbed + their_disturbed))


def speedup_beyond_noise(results: list[TrialResult], pick: Knobs, other: Knobs,
                         min_gain: float) -> tuple[float, float] | None:
    """:func:`compare`'s 95 % interval of the speed-up where it puts ``pick`` faster than
    ``other`` beyond ``min_gain`` (its low end above 1 + ``min_gain``), None otherwise."""
    found = compare(results, pick, other)
    interval = found.interval if found is not None else None
    return interval if interval is not None and interval[0] > 1 + min_gain else None


def disturbed_note(disturbed: tuple[Disturbed, ...], samples_per_step: float,
                   name: Callable[[Knobs], str]) -> str | None:
    """``confirm: set aside as disturbed: 1 window of PyTorch defaults (22 samples/s
    against their typical 780)``; None when no window was."""
    if not disturbed:
        return None
    parts = []
    for knobs in dict.fromkeys(d.knobs for d in disturbed):
        mine = [d for d in disturbed if d.knobs == knobs]
        speeds = ", ".join(f"{samples_per_step / d.step_s:.0f}" for d in mine)
        parts.append(f"{len(mine)} window(s) of {name(knobs)} ({speeds} samples/s against "
                     f"their typical {samples_per_step / mine[0].typical_s:.0f})")
    return ("confirm: set aside as disturbed, far outside their setting's other runs: "
            + "; ".join(parts) + "; the speed-up and runner-up use the rest")
