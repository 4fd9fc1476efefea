"""The end-of-run line: it suggests tuning only where tuning has something to do."""

from __future__ import annotations

import pytest

from tuneup.runtime.telemetry import Stats, Telemetry
from tuneup.settings import Knobs, Settings, save


def stats(wait_share: float) -> Stats:
    return Stats(steps=300, samples=9600, elapsed_s=10.0, data_wait_s=10.0 * wait_share,
                 copy_s=0.0, samples_per_s=960.0, data_wait_share=wait_share)


def test_a_run_with_tuned_settings_is_not_told_to_run_autotune():
    """The demo's tuned run ended 'waited for data 10% of the time — run tuneup autotune'."""
    line = stats(0.10).summary(tuned=True)
    assert "run `tuneup autotune`" not in line and "tuned settings applied" in line
    assert "run `tuneup autotune`" in stats(0.10).summary(tuned=False)


def test_tuned_settings_that_no_longer_fit_are_named():
    line = stats(0.35).summary(tuned=True)
    assert "no longer fit" in line and "re-run `tuneup autotune`" in line and "35%" in line


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
