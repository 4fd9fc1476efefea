"""The settings file records how long the chosen knobs waited for data while tuned, so a
tuned run compares its own wait with that (tuneup/runtime/telemetry.py)."""

from __future__ import annotations

from tuneup.autotune.command import data_wait_at_tuning, settings_for
from tuneup.autotune.search import Outcome
from tuneup.autotune.space import ScriptFacts
from tuneup.autotune.trials import Trial, TrialResult
from tuneup.settings import Knobs, Settings

PICK = Knobs(num_workers=2)


def result(knobs: Knobs, share: float | None, status: str = "ok") -> TrialResult:
    return TrialResult(Trial("t", knobs), status, samples_per_s=640.0, step_s=0.1,
                       step_s_all=[0.1] * 6, data_wait_share=share)


def outcome(*results: TrialResult) -> Outcome:
    return Outcome(facts=ScriptFacts(effective_batch=64), knobs=PICK,
                   baseline_samples_per_s=320.0, tuned_samples_per_s=640.0,
                   results=list(results), rejected=[])


def test_the_pick_s_trials_give_the_share_and_its_spread():
    picked = outcome(result(Knobs(), 0.6), result(PICK, 0.2), result(PICK, 0.24),
                     result(PICK, 0.9, status="error"), result(PICK, 0.22))
    assert data_wait_at_tuning(picked) == {"data_wait_share": 0.22, "data_wait_noise": 0.02}


def test_one_trial_has_no_spread_and_none_has_no_figures():
    assert data_wait_at_tuning(outcome(result(PICK, 0.3))) == {
        "data_wait_share": 0.3, "data_wait_noise": None}
    assert data_wait_at_tuning(outcome(result(Knobs(), 0.3), result(PICK, None))) == {
        "data_wait_share": None, "data_wait_noise": None}


def test_the_figures_reach_the_file_and_read_back(tmp_path):
    settings = settings_for(outcome(result(PICK, 0.2), result(PICK, 0.24)), tmp_path / "t.py")
    again = Settings.from_dict(settings.to_dict())
    assert (again.measured.data_wait_share, again.measured.data_wait_noise) == (0.22, 0.0283)
