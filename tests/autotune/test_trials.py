"""The timing statistics: Student's t from its incomplete beta, paired confidence, and the
intervals (paired rounds, pooled runs)."""

from __future__ import annotations

import math
import random

import pytest

from tuneup.autotune.trials import (
    confidence_faster,
    log_ratio_interval,
    log_ratio_interval_pooled,
    student_t_cdf,
    student_t_quantile,
)


# two-sided 95 % critical values, from any table of Student's t
@pytest.mark.parametrize(("df", "t"), [(1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262),
                                        (10, 2.228), (20, 2.086), (39, 2.023), (120, 1.980)])
def test_t_quantiles_match_the_tables(df, t):
    assert student_t_quantile(0.975, df) == pytest.approx(t, abs=1e-3)
    assert student_t_cdf(t, df) == pytest.approx(0.975, abs=1e-4)


@pytest.mark.parametrize("df", [1, 3, 30])
def test_the_t_distribution_is_symmetric(df):
    for t in (0.0, 0.3, 1.7, 25.0):
        assert student_t_cdf(t, df) + student_t_cdf(-t, df) == pytest.approx(1.0, abs=1e-12)
    assert student_t_cdf(1.0, 1) == pytest.approx(0.75, abs=1e-9)  # Cauchy: 1/2 + atan(1)/pi


def test_confidence_follows_the_evidence():
    rng = random.Random(7)
    base = [0.1 * (1 + abs(rng.gauss(0, 0.2))) for _ in range(12)]
    clearly = [b * 1.2 for b in base]  # 20 % slower, round by round
    assert confidence_faster(clearly, base) == pytest.approx(1.0, abs=1e-9)
    assert confidence_faster(base, clearly) == pytest.approx(0.0, abs=1e-9)
    mixed = [b * (1.02 + rng.gauss(0, 0.05)) for b in base]
    assert 0.5 < confidence_faster(mixed, base) < 1.0
    assert confidence_faster(mixed[:1], base[:1]) is None


def test_the_interval_holds_the_true_ratio_19_times_in_20():
    """Coverage of the paired interval on simulated rounds: a true 10 % ratio, log-normal
    noise per round; 2000 experiments of 6 rounds each."""
    rng = random.Random(11)
    inside = 0
    for _ in range(2000):
        a = [math.exp(rng.gauss(0, 0.1)) for _ in range(6)]
        b = [x * 1.1 * math.exp(rng.gauss(0, 0.05)) for x in a]
        low, high = log_ratio_interval(b, a)
        inside += low <= math.log(1.1) <= high
    assert 0.93 <= inside / 2000 <= 0.97


@pytest.mark.parametrize(("n_slow", "n_fast", "spread_fast"), [(9, 4, 0.1), (3, 3, 0.05),
                                                              (2, 6, 0.2)])
def test_the_pooled_interval_holds_the_true_ratio_19_times_in_20(n_slow, n_fast, spread_fast):
    """Welch's interval over unequal numbers of runs with unequal spreads (a search re-runs
    the defaults more often than its pick): coverage of a true 2x ratio stays near 95 %."""
    rng = random.Random(3)
    inside = 0
    for _ in range(2000):
        slow = [2.0 * math.exp(rng.gauss(0, 0.08)) for _ in range(n_slow)]
        fast = [math.exp(rng.gauss(0, spread_fast)) for _ in range(n_fast)]
        low, high = log_ratio_interval_pooled(slow, fast)
        inside += low <= math.log(2.0) <= high
    assert 0.94 <= inside / 2000 <= 0.99  # rounding df down errs on the wide side


def test_the_pooled_interval_needs_two_runs_a_side():
    assert log_ratio_interval_pooled([1.0, 1.1, 0.9], [0.5]) is None
    assert log_ratio_interval_pooled([1.0, 1.0], [0.5, 0.5]) == pytest.approx(
        (math.log(2), math.log(2)))


def test_a_trial_s_time_split_reaches_the_json():
    """issue 38: the step's breakdown (data wait, device, host) in --format json."""
    from tuneup.autotune.report import _trial_json
    from tuneup.autotune.trials import Trial, TrialResult
    from tuneup.settings import Knobs

    event = {"status": "ok", "step_s": 0.04, "step_s_all": [0.04] * 9,
             "data_wait_share": 0.25, "device_s": 0.02}
    result = TrialResult.from_event(Trial("workers=8", Knobs(num_workers=8)), event)
    assert result.device_s == 0.02
    parts = _trial_json(result)["breakdown"]
    assert parts["data_wait"] == pytest.approx(0.01) and parts["device"] == pytest.approx(0.02)
    assert parts["host"] == pytest.approx(0.01)



def test_a_trials_input_shape_count_is_read_from_its_event():
    from tuneup.autotune.trials import Trial, TrialResult
    from tuneup.settings import Knobs

    event = {"status": "ok", "step_s_all": [0.1] * 9, "input_shapes": 3}
    assert TrialResult.from_event(Trial("t", Knobs()), event).input_shapes == 3
    odd = {"status": "ok", "step_s_all": [0.1] * 9, "input_shapes": "many"}
    assert TrialResult.from_event(Trial("t", Knobs()), odd).input_shapes is None
