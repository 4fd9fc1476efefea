"""The speed-up over every steady run of two settings, and when it shows a change."""

from __future__ import annotations

from test_confirm import result
from test_search import compute_bound, search

from tuneup.autotune import protocol
from tuneup.autotune.search import Search, describe
from tuneup.autotune.search.speedup import speedup_beyond_noise
from tuneup.autotune.search.stages import change_shown, clearly_ahead
from tuneup.autotune.trials import Trial, TrialResult
from tuneup.settings import Knobs

PICK = Knobs(amp_dtype="bfloat16")


def test_beyond_noise_needs_two_runs_a_side_clear_of_the_tie_zone():
    one_each = [result(Knobs(), 0.1), result(PICK, 0.05)]
    assert speedup_beyond_noise(one_each, PICK, Knobs(), 0.03) is None  # one run: none
    two_each = one_each + [result(Knobs(), 0.101), result(PICK, 0.051)]
    shown = speedup_beyond_noise(two_each, PICK, Knobs(), 0.03)
    assert shown is not None and 1.5 < shown[0] < 2 < shown[1]
    close = [result(Knobs(), 0.1), result(PICK, 0.099), result(Knobs(), 0.1),
             result(PICK, 0.098)]  # faster, but by less than the 3 % tie zone
    assert speedup_beyond_noise(close, PICK, Knobs(), 0.03) is None


def test_a_find_is_shown_by_two_runs_a_side_beyond_noise():
    tuner = Search(search(compute_bound)[1])
    tuner.incumbent = PICK
    tuner.results = [result(Knobs(), 0.1), result(PICK, 0.05)]
    assert not change_shown(tuner)  # one window each: no interval
    tuner.results += [result(Knobs(), 0.1), result(PICK, 0.05)]
    assert change_shown(tuner)
    tuner.incumbent = Knobs()
    assert not change_shown(tuner)  # the defaults are no change


def test_a_find_far_beyond_the_windows_spread_is_clearly_ahead_on_one_window_each():
    tuner = Search(search(compute_bound)[1])
    tuner.incumbent = PICK
    tuner.results = [result(Knobs(), 0.1), result(PICK, 0.02)]
    assert clearly_ahead(tuner) and not change_shown(tuner)  # 5x: no interval needed
    tuner.results = [result(Knobs(), 0.1), result(PICK, 0.08)]
    assert not clearly_ahead(tuner)  # 1.25x with no spread measured: under the floor's bar
    tuner.results = [result(Knobs(), 0.1), result(Knobs(), 0.06), result(PICK, 0.07)]
    assert not clearly_ahead(tuner)  # the defaults' fastest window decides: 0.86x of it
    tuner.results = [result(Knobs(), 0.1), result(Knobs(), 0.08), result(PICK, 0.03)]
    assert clearly_ahead(tuner)  # 2.7x beyond a spread of 16 %
    tuner.results.append(TrialResult(Trial(describe(PICK), PICK), protocol.OOM, message="oom"))
    assert clearly_ahead(tuner)  # a failed run of the pick is no window of it
    tuner.incumbent = Knobs()
    assert not clearly_ahead(tuner)  # the defaults are no change
