"""When comparisons are decided: the machine's window-to-window spread, and a stage whose
budget held no race rounds."""

from __future__ import annotations

import math
import statistics

from test_search import record, search

from tuneup.autotune.search import Options
from tuneup.autotune.search.verdict import window_noise
from tuneup.autotune.trials import Trial, TrialResult
from tuneup.settings import Knobs


def window(knobs: Knobs, step_s: float) -> TrialResult:
    return TrialResult(Trial("t", knobs), "ok", step_s=step_s, step_s_all=[step_s] * 9)


def test_window_noise_pools_the_spread_of_settings_measured_more_than_once():
    a, b = Knobs(), Knobs(num_workers=2)
    results = [window(a, 0.10), window(a, 0.12), window(a, 0.11),
               window(b, 0.05), window(b, 0.06), window(Knobs(cpu_threads=1), 0.2)]
    logs_a = [math.log(x) for x in (0.10, 0.12, 0.11)]
    logs_b = [math.log(x) for x in (0.05, 0.06)]
    pooled = (2 * statistics.variance(logs_a) + statistics.variance(logs_b)) / 3
    assert window_noise(results) == pooled ** 0.5
    assert window_noise(results[-1:]) == 0.0  # nothing repeated: no spread known


def test_a_stage_without_race_rounds_needs_a_gain_beyond_the_machines_spread():
    """The budget holds no race: one window each. One thread's window is 6 % faster, but the
    defaults' own windows vary by 10 %: within noise, the simpler settings stay; 20 % faster
    clears it."""
    for gain, kept in ((0.06, Knobs()), (0.20, Knobs(cpu_threads=1))):
        tuner, _ = search(lambda k: record(0.1), Options(groups=frozenset({"threads"})),
                          budget=0.0)
        tuner.results = [window(Knobs(), s) for s in (0.100, 0.110, 0.100, 0.110)]
        reference = window(Knobs(), 0.100)
        candidate = window(Knobs(cpu_threads=1), 0.100 / (1 + gain))
        tuner.baseline = tuner.budget.baseline = tuner.budget.typical = reference
        assert tuner.choose(reference, [candidate], "threads").trial.knobs == kept


def test_one_window_each_decides_no_tie_over_a_change_of_no_weight():
    """A deeper prefetch is no heavier than the default, so a raced tie over it goes to the
    faster; one window each (no race rounds) decides nothing: 1 % faster, the reference
    stays."""
    workers = Knobs(num_workers=2)
    tuner, _ = search(lambda k: record(0.1), Options(groups=frozenset({"loader"})), budget=0.0)
    tuner.results = [window(workers, s) for s in (0.100, 0.101, 0.100, 0.101)]
    reference = window(workers, 0.100)
    candidate = window(workers.replace(prefetch_factor=4), 0.100 / 1.01)
    tuner.baseline = tuner.budget.baseline = tuner.budget.typical = reference
    assert tuner.choose(reference, [candidate], "loader").trial.knobs == workers
