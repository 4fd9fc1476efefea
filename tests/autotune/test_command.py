"""The ``tuneup autotune`` command through click's runner."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tuneup.autotune import command
from tuneup.cli import main
from tuneup.settings import read


def invoke(*args: str):
    return CliRunner().invoke(main, ["autotune", *args])


@pytest.mark.parametrize("args, message", [
    (["missing.py"], "no such script: missing.py"),
    (["{script}", "--budget", "1"], "--budget must be at least 10 seconds"),
    (["{script}", "--only", "amp,warp"], "unknown: warp"),
    (["{script}", "--only", "amp", "--skip", "loader"], "either --only or --skip"),
    (["{script}", "--max-memory", "lots"], "--max-memory takes a size"),
    (["{script}", "--expected-steps", "0"], "--expected-steps must be a positive"),
    (["{script}", "--steps", "3"], "pass the script's own arguments after --"),
    (["{script}", "--budget", "nan"], "--budget must be at least 10 seconds"),
    (["{script}", "--nproc-per-node", "0"], "--nproc-per-node must be at least 1"),
    (["{script}", "--output", "{script}/x.json"], "cannot write settings into"),
])
def test_bad_arguments_one_line_exit_2(fake_script, args, message):
    script = fake_script()
    result = invoke(*[a.format(script=script) for a in args])
    assert result.exit_code == 2
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_json_output_and_settings_file(fake_script, tmp_path):
    script = fake_script()
    output = tmp_path / "any-name.conf"
    result = invoke(str(script), "--budget", "60", "--output", str(output), "--format", "json",
                    "--skip", "compile", "--", "--steps", "9")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["settings"] == str(output)
    assert summary["device"] == "cpu" and summary["effective_batch"] == 64
    assert summary["knobs"]["num_workers"] == {"default": 0, "chosen": 0}  # workers only slow it
    assert summary["speedup"] is None and summary["tuned_samples_per_s"] is None  # kept
    assert any(r["trial"].startswith("workers=1") for r in summary["rejected"])
    assert summary["trials"][0]["id"] == "defaults" and summary["trials"][0]["status"] == "ok"
    settings = read(output)
    assert settings.measured.effective_batch_size == 64
    assert settings.fingerprint["torch"]
    assert settings.script == str(script.resolve())


@pytest.mark.parametrize("fixed", [True, False])
def test_the_settings_keep_what_every_trial_ran_with(fake_script, tmp_path, fixed):
    output = tmp_path / "s.json"
    every_trial = {"fixed_malloc_thresholds": True} if fixed else {}
    result = invoke(str(fake_script(every_trial=every_trial)), "--budget", "30", "--only",
                    "threads", "--output", str(output), "--format", "json")
    assert result.exit_code == 0, result.output
    assert read(output).knobs.fixed_malloc_thresholds is (True if fixed else None)
    summary = json.loads(result.stdout)
    assert summary["knobs"]["fixed_malloc_thresholds"] == {"default": False, "chosen": fixed}
    assert summary["settings_knobs"] == read(output).knobs.to_dict()


def test_default_output_is_beside_the_script(fake_script):
    script = fake_script()
    result = invoke(str(script), "--budget", "30", "--only", "threads")
    assert result.exit_code == 0, result.output
    assert (script.parent / "train.tuneup.json").exists()
    assert "PyTorch's defaults kept" in result.stdout  # threads do not change its speed


def test_script_without_wrappers_exit_1(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text("pass\n")
    result = invoke(str(script), "--budget", "30")
    assert result.exit_code == 1
    assert ("plain.py never called tuned_loop or tuned_loader (for a Trainer: "
            "tuned_trainer or tuned_trainer_kwargs) — see docs/autotune.md") in result.output


def test_a_script_that_cannot_be_tuned_says_why_in_the_json_too(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text("pass\n")
    result = invoke(str(script), "--budget", "30", "--format", "json")
    assert result.exit_code == 1
    summary = json.loads(result.stdout)
    assert summary["settings"] is None and "never called tuned_loop" in summary["error"]


def test_ctrl_c_leaves_the_settings_file_intact(fake_script, tmp_path, monkeypatch):
    output = tmp_path / "settings.json"
    output.write_text("earlier settings\n")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "tune", interrupted)
    result = invoke(str(fake_script()), "--output", str(output))
    assert result.exit_code == 130
    assert "interrupted" in result.output and len(result.output.strip().splitlines()) == 1
    assert output.read_text() == "earlier settings\n"


def test_parse_size():
    assert command.parse_size("8GiB") == 8 * 2**30
    assert command.parse_size("512 MiB") == 512 * 2**20
    assert command.parse_size("1.5G") == 1_500_000_000
    with pytest.raises(ValueError):
        command.parse_size("-1G")
