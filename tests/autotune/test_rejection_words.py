"""The words a lost comparison is given: "slower" only for what the paired rounds show
slower beyond the tie zone, "likely slower" when only their centre is, "within noise" for
the rest."""

from __future__ import annotations

import math

from test_search import record

from tuneup.autotune.search.judge import Judge, Options
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


def test_a_large_loss_the_rounds_cannot_show_is_likely_slower_not_within_noise():
    """24 % slower on average over two noisy rounds: the interval still reaches the tie zone,
    so not "slower", but not the words of a tie either."""
    leader = runs(Knobs(), [0.10, 0.10])
    loser = runs(Knobs(num_workers=1), [0.16, 0.10])
    reason = paired_reason(loser, leader, TIE, ", raced")
    assert reason == "likely slower (-21%, raced)"


def test_a_loss_inside_the_tie_zone_is_within_noise():
    """2 % slower on average, one round in three the other way round: a tie."""
    leader = runs(Knobs(), [0.10, 0.10, 0.10])
    loser = runs(Knobs(num_workers=1), [0.106, 0.107, 0.093])
    reason = paired_reason(loser, leader, TIE, ", confirmed")
    assert reason is not None and reason.startswith("within noise (-")
    assert reason.endswith(", confirmed)")


def test_a_steady_gain_beyond_the_tie_zone_is_faster_not_within_noise():
    leader = runs(Knobs(), [0.10, 0.11, 0.10])
    winner = runs(Knobs(num_workers=1), [0.09, 0.099, 0.09])
    assert paired_reason(winner, leader, TIE) == "faster (+11.1%)"


def test_fewer_than_two_pairs_say_nothing():
    assert paired_reason(runs(Knobs(num_workers=1), [0.2]), runs(Knobs(), [0.1]), TIE) is None


def window(knobs: Knobs, steps: list[float]) -> TrialResult:
    return TrialResult.from_event(Trial("w", knobs), {**record(steps[0]), "step_s_all": steps})


def test_one_window_each_slower_beyond_the_gain_worth_a_change_but_not_their_noise():
    judge = Judge(Options())
    steady = window(Knobs(), [0.10] * 6)
    noisy = [0.10, 0.10, 0.10, 0.16, 0.16, 0.16]  # a slow stretch in the window
    assert judge.versus(window(Knobs(num_workers=1), noisy), steady) == "likely slower (-23%)"
    assert judge.versus(window(Knobs(num_workers=1), [0.12] * 6), steady) == "slower (-17%)"
    assert judge.versus(window(Knobs(num_workers=1), [0.101] * 6), steady) == "within noise (-1.0%)"
