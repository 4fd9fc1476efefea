"""The settings package: schema validation, atomic save, load's warnings, the fingerprint."""

from __future__ import annotations

import json
import os
import warnings

import pytest

from tuneup.machine.snapshot import CPU, GPU, Driver, Snapshot, TorchBuild
from tuneup.settings import (
    SCHEMA_VERSION, Knobs, Measurement, Settings, SettingsError, TuneupWarning, default_path,
    disabled, fingerprint, load, read, resolve_path, save,
)
from tuneup.settings import store


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("TUNEUP_SETTINGS", "TUNEUP_DISABLE"):
        monkeypatch.delenv(name, raising=False)


def tuned() -> Settings:
    return Settings(knobs=Knobs(num_workers=4, pin_memory=True, micro_batch_size=64,
                                amp_dtype="bfloat16", compile_mode="default"),
                    measured=Measurement(baseline_samples_per_s=100.0, tuned_samples_per_s=250.0,
                                         effective_batch_size=256, device="cpu"),
                    fingerprint={"torch": "2.13.0", "cpu_cores": 2}, script="train.py",
                    created="2026-11-22T01:00:00Z", tuneup_version="0.1.0")


def test_save_then_read_round_trips_a_readable_file(tmp_path):
    path = tmp_path / "deep" / "train.tuneup.json"
    save(tuned(), path)
    data = json.loads(path.read_text())
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["measured"]["speedup"] == 2.5
    assert path.read_text().startswith("{\n  ")  # indented for people
    assert read(path) == tuned()


def test_save_is_atomic_when_the_rename_fails(tmp_path, monkeypatch):
    path = tmp_path / "train.tuneup.json"
    save(Settings(), path)
    before = path.read_text()

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save(tuned(), path)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["train.tuneup.json"]


@pytest.mark.parametrize(("knobs", "message"), [
    ({"num_workers": -1}, "num_workers must be an integer >= 0"),
    ({"num_workers": True}, "num_workers must be an integer"),
    ({"cpu_threads": 0}, "cpu_threads must be an integer >= 1"),
    ({"micro_batch_size": 2.5}, "micro_batch_size must be an integer >= 1"),
    ({"prefetch_factor": 0}, "prefetch_factor must be an integer >= 1"),
    ({"pin_memory": "yes"}, "pin_memory must be true, false or null"),
    ({"amp_dtype": "fp16"}, "amp_dtype must be one of bfloat16, float16"),
    ({"compile_mode": "fast"}, "compile_mode must be one of"),
    ({"float32_matmul_precision": "low"}, "float32_matmul_precision must be one of"),
    ({"num_workers": 0, "prefetch_factor": 2}, "need num_workers > 0"),
    ({"warp": 9}, "unknown knob"),
])
def test_invalid_knobs_name_the_problem(knobs, message):
    with pytest.raises(SettingsError, match=message):
        Knobs.from_dict(knobs)


@pytest.mark.parametrize(("data", "message"), [
    ([], "does not hold a JSON object"),
    ({"schema_version": 2}, "schema_version 2 is not supported"),
    ({"knobs": {}}, "schema_version None is not supported"),
    ({"schema_version": 1, "knobs": []}, "'knobs' must be an object"),
    ({"schema_version": 1, "measured": 3}, "'measured' must be an object"),
    ({"schema_version": 1, "fingerprint": "x"}, "'fingerprint' must be an object"),
])
def test_invalid_files_name_the_problem(data, message):
    with pytest.raises(SettingsError, match=message):
        Settings.from_dict(data)


def test_unknown_measurements_are_ignored_and_nulls_are_defaults():
    settings = Settings.from_dict({"schema_version": 1, "knobs": None,
                                   "measured": {"speedup": 3.0, "future_field": 1}})
    assert settings.knobs == Knobs() and settings.measured == Measurement()


def test_load_missing_file_is_silent(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load(tmp_path / "absent.json") is None


def test_load_broken_file_warns_once_with_the_fix(tmp_path):
    path = tmp_path / "train.tuneup.json"
    path.write_text('{"schema_version": 1, "knobs": {')
    with pytest.warns(TuneupWarning, match=r"ignoring settings file .*not valid JSON.*re-run `tuneup autotune`") as caught:
        assert load(path) is None
    assert len(caught) == 1


def test_disable_and_override(tmp_path, monkeypatch):
    path = tmp_path / "any.name"
    save(tuned(), path)
    monkeypatch.setenv("TUNEUP_SETTINGS", str(path))
    assert resolve_path() == path and load() == tuned()
    for value in ("1", "true", "YES", "on"):
        monkeypatch.setenv("TUNEUP_DISABLE", value)
        assert disabled() and load() is None
    monkeypatch.setenv("TUNEUP_DISABLE", "0")
    assert not disabled()


def test_default_path_is_beside_the_script(tmp_path, monkeypatch):
    assert default_path(tmp_path / "train.py") == tmp_path / "train.tuneup.json"
    monkeypatch.setattr("sys.argv", ["-c"])
    monkeypatch.setattr("sys.modules", {**__import__("sys").modules, "__main__": object()})
    assert store.running_script() is None and resolve_path() is None


def test_fingerprint_from_a_snapshot_and_its_differences():
    snapshot = Snapshot(torch=TorchBuild(version="2.13.0+cu126", cuda="12.6"),
                        cpu=CPU(model="EPYC", usable_cores=8.0),
                        driver=Driver(version="570.1"), gpus=[GPU(name="A100"), GPU(name="A100")])
    stored = fingerprint.from_snapshot(snapshot)
    assert stored == {"gpu_model": "A100", "gpu_count": 2, "driver": "570.1",
                      "torch": "2.13.0+cu126", "torch_cuda": "12.6", "cpu_model": "EPYC",
                      "cpu_cores": 8.0}
    now = dict(stored, gpu_count=1, torch="2.13.1+cu126", extra="new")
    assert fingerprint.differences(stored, now) == ["gpu_count 2 -> 1", "torch 2.13.0+cu126 -> 2.13.1+cu126"]
    assert fingerprint.differences(stored, stored) == []
    assert fingerprint.from_snapshot(Snapshot())["gpu_count"] == 0


def test_safe_knobs_exist():
    names = set(Knobs().to_dict())
    assert set(fingerprint.SAFE_ACROSS_MACHINES) <= names


def test_knobs_without_the_loader_keep_what_compiled_graphs_depend_on():
    knobs = Knobs(num_workers=2, prefetch_factor=4, pin_memory=True, persistent_workers=True,
                  compile_mode="default", amp_dtype="bfloat16", cpu_threads=1)
    graphs = knobs.without_loader()
    assert graphs == Knobs(compile_mode="default", amp_dtype="bfloat16", cpu_threads=1)
    assert Knobs(num_workers=1, compile_mode="default").without_loader() == \
        Knobs(num_workers=2, prefetch_factor=4, compile_mode="default").without_loader()
