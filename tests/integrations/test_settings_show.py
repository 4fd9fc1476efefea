"""``tuneup settings show``: the settings file as each ecosystem's arguments, and every bad
input one line with exit status 2 through the real command group."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from tuneup.cli import LazyGroup, main
from tuneup.settings.show import settings

KNOBS = dict(num_workers=2, prefetch_factor=4, amp_dtype="bfloat16", micro_batch_size=64,
             cpu_threads=2)


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    """``tuneup settings`` in the command group (cli.py registers it)."""
    monkeypatch.setitem(LazyGroup.COMMANDS, "settings", (
        "tuneup.settings.show", "settings",
        "Show the settings file as another library's arguments."))


def show(*args: str):
    return CliRunner().invoke(main, ["settings", "show", *args])


def test_a_script_reads_the_file_beside_it_as_hf_fields(write_settings, monkeypatch, tmp_path):
    write_settings(effective_batch_size=256, **KNOBS)
    monkeypatch.delenv("TUNEUP_SETTINGS")
    result = show(str(tmp_path / "train.py"), "--as", "hf")
    assert result.exit_code == 0, result.output
    assert str(tmp_path / "train.tuneup.json") in result.output
    for line in ("TrainingArguments(...,", "    dataloader_num_workers=2,", "    bf16=True,",
                 "    per_device_train_batch_size=64,", "    gradient_accumulation_steps=4,",
                 "torch.set_num_threads(2)"):
        assert line in result.output.splitlines()


@pytest.mark.parametrize(("ecosystem", "lines"), [
    ("plain", ["DataLoader(...,", "    num_workers=2,",
               "with torch.autocast(device_type, dtype=torch.bfloat16): ..."]),
    ("lightning", ["L.Trainer(...,", "    precision='bf16-mixed',"]),
    ("env", ["export OMP_NUM_THREADS=2", "export ACCELERATE_MIXED_PRECISION=bf16"]),
])
def test_each_ecosystem_prints_lines_to_paste(write_settings, ecosystem, lines):
    path = write_settings(**KNOBS)
    result = show(str(path), "--as", ecosystem)
    assert result.exit_code == 0, result.output
    assert set(lines) <= set(result.output.splitlines())
    assert "micro_batch_size" in result.output  # said to be left out, with why


def test_json_holds_the_same_spelling(write_settings):
    path = write_settings(**KNOBS)
    data = json.loads(show(str(path), "--as", "env", "--format", "json").output)
    assert data["arguments"] == {"TUNEUP_SETTINGS": str(path), "OMP_NUM_THREADS": "2",
                                 "ACCELERATE_MIXED_PRECISION": "bf16"}
    assert set(data["left_out"]) == {"num_workers", "prefetch_factor", "micro_batch_size"}


def test_tuneup_settings_names_the_file_without_a_path(write_settings):
    write_settings(**KNOBS)
    assert "    num_workers=2," in show().output.splitlines()


@pytest.mark.parametrize(("content", "says"), [
    (None, "no settings file at .*missing.tuneup.json: run `tuneup autotune`"),
    ("{\"schema_version\": 1, \"knobs\": {\"num_wor", "cannot use .*: not valid JSON"),
    ("{\"schema_version\": 1, \"knobs\": {\"workers\": 2}}", "unknown knob.*workers"),
])
def test_a_missing_or_broken_file_is_one_line_and_exit_2(tmp_path, content, says):
    path = tmp_path / "missing.tuneup.json"
    if content is not None:
        path.write_text(content)
    result = show(str(tmp_path / "missing.py"))
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1
    assert result.output.startswith("tuneup settings: ")
    assert re.search(says, result.output)


def test_no_path_and_no_variable_is_one_line():
    result = show()
    assert result.exit_code == 2
    assert result.output.strip() == ("tuneup settings: name the training script or the "
                                     "settings file (or set TUNEUP_SETTINGS)")


def test_help_explains_with_examples():
    result = CliRunner().invoke(settings, ["show", "--help"])
    assert "--as [plain|hf|lightning|env]" in result.output
    assert "tuneup settings show train.py --as hf" in result.output


@pytest.mark.parametrize(("measured", "says"), [
    ({"effective_batch_size": "256"}, "measured.effective_batch_size must be an integer >= 1 "
                                      "or null, not '256'"),
    ({"effective_batch_size": 256.0}, "measured.effective_batch_size must be an integer >= 1"),
    ({"effective_batch_size": 0}, "measured.effective_batch_size must be an integer >= 1"),
    ({"data_wait_share": "high"}, "measured.data_wait_share must be a number >= 0"),
    ({"tuned_samples_per_s": True}, "measured.tuned_samples_per_s must be a number >= 0"),
])
def test_measured_is_validated_like_the_knobs(tmp_path, measured, says):
    """Every declared field of ``measured`` by its declared type: a string batch once gave a
    traceback, a float one ``gradient_accumulation_steps=4.0``."""
    path = tmp_path / "train.tuneup.json"
    path.write_text(json.dumps({"schema_version": 1, "knobs": KNOBS,
                                "measured": {**measured, "speedup": 1.5}}))
    result = show(str(path), "--as", "hf")
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert result.output.startswith(f"tuneup settings: cannot use {path}: ")
    assert says in result.output
