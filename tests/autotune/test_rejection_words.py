"""The words a lost comparison is given: "slower" only for what the paired rounds show
slower beyond the tie zone, "within noise" for the rest."""

from __future__ import annotations

import math

from test_search import record

from tuneup.autotune.search.verdict import paired_reason
from tuneup.autotune.trials import Trial, TrialResult
from tuneup.settings import Knobs

TIE = math.log(1.03)


def runs(knobs: Knobs, steps: list[float]) -> list[TrialResult]:
    return [TrialResult.from_event(Trial(f"{i}", knobs), record(s)) for i, s in enumerate(steps)]


def test_a_steady_loss_beyond_the_tie_zone_is_slower():
    leader = runs(Knobs(), [0.10, 0.11, 0.10, 0.12])
    loser = runs(Knobs(num_workers=1), [s * 1.25 for s in (0.10, 0.11, 0.10, 0.12)])
    assert paired_reason(loser, leader, TIE) == "slower (-20%)"


def test_a_loss_the_rounds_cannot_tell_from_noise_is_within_noise():
    """5 % slower on average, but one round in three the other way round: not shown slower."""
    leader = runs(Knobs(), [0.10, 0.10, 0.10])
    loser = runs(Knobs(num_workers=1), [0.115, 0.112, 0.088])
    reason = paired_reason(loser, leader, TIE, ", confirmed")
    assert reason is not None and reason.startswith("within noise (-")
    assert reason.endswith(", confirmed)")


def test_a_steady_gain_beyond_the_tie_zone_is_faster_not_within_noise():
    leader = runs(Knobs(), [0.10, 0.11, 0.10])
    winner = runs(Knobs(num_workers=1), [0.09, 0.099, 0.09])
    assert paired_reason(winner, leader, TIE) == "faster (+11.1%)"


def test_fewer_than_two_pairs_say_nothing():
    assert paired_reason(runs(Knobs(num_workers=1), [0.2]), runs(Knobs(), [0.1]), TIE) is None
