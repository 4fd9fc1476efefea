"""When a comparison of interleaved runs is decided: the looks and the verdict shared by the
stages' races and the confirmation."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

from tuneup.autotune.trials import TrialResult, log_ratio_interval, paired_steps, typical_step
from tuneup.settings import Knobs


def is_look(rounds: int) -> bool:
    """Rounds after which a race looks at its intervals: 2, 3, 4, 6, 8, 12, 16, 24, ...
    (looking after every round would let noise end it early more often)."""
    while rounds > 4 and rounds % 2 == 0:
        rounds //= 2
    return rounds in (2, 3, 4)


def verdict(runs: dict[Knobs, list[TrialResult]], tie: float, first_round: int = 1
            ) -> tuple[dict[Knobs, tuple[float, float]], bool]:
    """The race's state: contenders slower than the leader beyond ``tie`` (log scale) with
    95 % confidence, with their interval, and whether any other is still undecided.
    ``runs[k][first_round:]`` are the interleaved rounds (a stage's first sweep, before
    them, is not paired)."""
    leader = min(runs, key=lambda k: typical_step(runs[k]))
    slower: dict[Knobs, tuple[float, float]] = {}
    undecided = False
    for knobs in [k for k in runs if k != leader]:
        interval = log_ratio_interval(*paired_steps(runs[knobs][first_round:],
                                                    runs[leader][first_round:]))
        if interval is None:
            undecided = True
        elif interval[0] > tie:
            slower[knobs] = interval
        elif interval[1] >= tie:
            undecided = True
    return slower, undecided


def interval_gain(interval: tuple[float, float]) -> float:
    """A contender's speed over the leader's, less 1, at the centre of the interval of its
    log step-time ratio (``-0.2``: 20 % slower)."""
    return math.exp(-sum(interval) / 2) - 1


def paired_reason(runs: list[TrialResult], leader: list[TrialResult], tie: float,
                  how: str = "") -> str | None:
    """How a setting run in rounds beside the leader compares, from their paired ratios:
    ``slower (-12%)`` when its interval lies beyond ``tie`` (log scale) on the slow side,
    ``faster (+5.0%)`` on the fast side (the notes say why it was not taken), ``likely
    slower (-24%)`` when only the interval's centre lies beyond it (rounds too few or too
    noisy to show it), otherwise ``within noise (-2.0%)``: no two words name the same
    evidence. ``how`` is appended inside the brackets; None with fewer than two pairs."""
    interval = log_ratio_interval(*paired_steps(runs, leader))
    return None if interval is None else interval_reason(interval, tie, how)


def interval_reason(interval: tuple[float, float], tie: float, how: str = "") -> str:
    """:func:`paired_reason`'s words for a 95 % interval of log(step / leader's step)."""
    gain = interval_gain(interval)
    if interval[0] > tie:
        return f"slower ({gain:+.0%}{how})"
    if interval[1] < -tie:
        return f"faster ({gain:+.1%}{how})"
    if sum(interval) / 2 > tie:
        return f"likely slower ({gain:+.0%}{how})"
    return f"within noise ({gain:+.1%}{how})"


def window_noise(results: list[TrialResult]) -> float:
    """The machine's window-to-window spread: the pooled standard deviation of log step
    times over every setting measured more than once in ``results`` (0 with none). What a
    comparison of single windows must clear; a window's own standard error does not show a
    slow stretch of the machine that covers the whole window."""
    logs: dict[Knobs, list[float]] = defaultdict(list)
    for result in results:
        if result.ok and result.step_time:
            logs[result.trial.knobs].append(math.log(result.step_time))
    repeated = [v for v in logs.values() if len(v) > 1]
    freedom = sum(len(v) - 1 for v in repeated)
    if not freedom:
        return 0.0
    return math.sqrt(sum(statistics.variance(v) * (len(v) - 1) for v in repeated) / freedom)
