"""The end-of-run line: it suggests tuning only where tuning has something to do."""

from __future__ import annotations

import pytest

from tuneup.runtime.telemetry import AtTuning, Stats, Telemetry
from tuneup.settings import Knobs, Measurement, Settings, save


def stats(wait_share: float) -> Stats:
    return Stats(steps=300, samples=9600, elapsed_s=10.0, data_wait_s=10.0 * wait_share,
                 copy_s=0.0, samples_per_s=960.0, data_wait_share=wait_share)


def test_a_run_with_tuned_settings_is_not_told_to_run_autotune():
    """The demo's tuned run ended 'waited for data 10% of the time — run tuneup autotune'."""
    line = stats(0.10).summary(tuned=True)
    assert "run `tuneup autotune`" not in line and "tuned settings applied" in line
    assert "run `tuneup autotune`" in stats(0.10).summary(tuned=False)


def at_tuning(share: float | None, noise: float | None = None,
              speed: float | None = 960.0, ranks: int | None = None) -> AtTuning | None:
    return AtTuning.from_measurement(Measurement(
        data_wait_share=share, data_wait_noise=noise, tuned_samples_per_s=speed,
        local_ranks=ranks))


def test_a_tuned_run_waiting_as_long_as_at_tuning_time_is_not_told_to_re_tune():
    """The demo: 20 % waited right after tuning, as the tuned settings did while tuned."""
    line = stats(0.20).summary(tuned=True, at_tuning=at_tuning(0.20, 0.02))
    assert "no longer fit" not in line and "autotune" not in line
    assert "tuned settings applied; 20% when tuned" in line


def test_tuned_settings_that_no_longer_fit_are_named():
    slower = Stats(steps=300, samples=6000, elapsed_s=10.0, data_wait_s=3.5, copy_s=0.0,
                   samples_per_s=600.0, data_wait_share=0.35)
    line = slower.summary(tuned=True, at_tuning=at_tuning(0.10, 0.02))
    assert "no longer fit" in line and "re-run `tuneup autotune`" in line and "35%" in line
    assert "10% when tuned" in line


@pytest.mark.parametrize(("share", "noise", "speed", "why"), [
    (0.28, 0.02, 960.0, "the wait rose by less than 10 points"),
    (0.34, 0.08, 600.0, "the rise is within twice the noise of tuning's trials"),
    (0.45, 0.02, 900.0, "waiting longer, but still as fast as at tuning time"),
])
def test_only_a_clearly_worse_run_is_said_to_no_longer_fit(share, noise, speed, why):
    run = Stats(steps=300, samples=int(speed * 10), elapsed_s=10.0, data_wait_s=10.0 * share,
                copy_s=0.0, samples_per_s=speed, data_wait_share=share)
    line = run.summary(tuned=True, at_tuning=at_tuning(0.20, noise, speed=960.0))
    assert "no longer fit" not in line, why
    assert "(tuned settings applied; 20% when tuned)" in line


def test_tuning_speed_is_per_process_under_torchrun():
    """Two local ranks measured 1,920 samples/s together: each run process compares with 960."""
    assert at_tuning(0.1, speed=1920.0, ranks=2).samples_per_s == 960.0


def test_a_file_without_the_wait_at_tuning_time_does_not_claim_unfitness():
    """Files written before tuneup recorded the wait: a long one is named, nothing claimed."""
    assert at_tuning(None) is None and at_tuning(float("nan")) is None and at_tuning(2.0) is None
    line = stats(0.35).summary(tuned=True)
    assert "no longer fit" not in line and "35%" in line
    assert "does not say how long they waited when tuned" in line
    assert "(tuned settings applied)" in stats(0.10).summary(tuned=True)


def test_the_exit_line_compares_with_the_file_s_figures(tmp_path, monkeypatch, capsys):
    path = tmp_path / "s.tuneup.json"
    save(Settings(knobs=Knobs(num_workers=1), measured=Measurement(
        tuned_samples_per_s=40.0, data_wait_share=0.5, data_wait_noise=0.05)), path)
    monkeypatch.setenv("TUNEUP_SETTINGS", str(path))
    telemetry = Telemetry()
    telemetry.started, telemetry.latest, telemetry.data_wait_s = 1.0, 3.0, 1.0  # 50 % waited
    telemetry.samples, telemetry.steps = 64, 4
    telemetry.print_summary()
    assert "(tuned settings applied; 50% when tuned)" in capsys.readouterr().err


def test_a_settings_file_that_kept_the_defaults_is_not_tuned(tmp_path, monkeypatch, capsys):
    """autotune keeps PyTorch's defaults when nothing beats them, and writes only the knobs it
    sets on every run (malloc's thresholds): that run was not tuned, so tuning is suggested."""
    path = tmp_path / "s.tuneup.json"
    save(Settings(knobs=Knobs(fixed_malloc_thresholds=True)), path)
    monkeypatch.setenv("TUNEUP_SETTINGS", str(path))
    telemetry = Telemetry()
    telemetry.started, telemetry.latest, telemetry.data_wait_s = 1.0, 3.0, 0.3
    telemetry.samples, telemetry.steps = 64, 4
    telemetry.print_summary()
    assert "— run `tuneup autotune`" in capsys.readouterr().err


@pytest.mark.parametrize(("tuned", "says"), [(False, "— run `tuneup autotune`"),
                                             (True, "tuned settings applied")])
def test_the_exit_line_knows_whether_settings_were_applied(tmp_path, monkeypatch, capsys,
                                                          tuned, says):
    if tuned:
        path = tmp_path / "s.tuneup.json"
        save(Settings(knobs=Knobs(num_workers=1)), path)
        monkeypatch.setenv("TUNEUP_SETTINGS", str(path))
    telemetry = Telemetry()  # TUNEUP_VERBOSE would print this at exit
    telemetry.started, telemetry.latest, telemetry.data_wait_s = 1.0, 3.0, 0.3
    telemetry.samples, telemetry.steps = 64, 4
    telemetry.print_summary()
    assert says in capsys.readouterr().err
