"""Whatever lies at the settings path, training runs: on PyTorch defaults, with exactly one
warning that names the file and the problem. Written from the kinds of bad file, not from
one file's bytes."""

from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path

import pytest
import torch

from tuneup import tuned_loader, tuned_loop
from tuneup.runtime import apply
from tuneup.settings import Knobs, Settings, TuneupWarning, read, save

ENV = ("TUNEUP_SETTINGS", "TUNEUP_DISABLE", "TUNEUP_PROBE", "TUNEUP_OBSERVERS")


@pytest.fixture(autouse=True)
def clean(monkeypatch, tmp_path):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("tuneup.settings.store.running_script", lambda: None)


def fifo(folder: Path) -> Path:
    path = folder / "fifo.json"
    os.mkfifo(path)  # nobody writes: reading would block forever
    return path


def text(content: str):
    def make(folder: Path) -> Path:
        path = folder / "bad.json"
        path.write_text(content, encoding="utf-8")
        return path
    return make


def raw(content: bytes):
    def make(folder: Path) -> Path:
        path = folder / "bad.json"
        path.write_bytes(content)
        return path
    return make


KINDS = {
    "a FIFO": (fifo, "not a regular file"),
    "a device that never ends": (lambda folder: Path("/dev/zero"), "not a regular file"),
    "a directory": (lambda folder: folder, "not a regular file"),
    "a huge file": (text(" " * (2 << 20) + "{}"), "a settings file is at most"),
    "deep nesting": (text("[" * 100_000 + "]" * 100_000), "not valid JSON"),
    "a 5,000-digit number": (text('{"schema_version": 1, "knobs": {"num_workers": '
                                  + "9" * 5000 + "}}"), "not valid JSON"),
    "NaN": (text('{"schema_version": 1, "knobs": {"prefetch_factor": NaN}}'), "NaN"),
    "Infinity": (text('{"schema_version": 1, "knobs": {"cpu_threads": Infinity}}'), "Infinity"),
    "a bool schema_version": (text('{"schema_version": true, "knobs": {}}'),
                              "schema_version True is not supported"),
    "a wrong knob type": (text('{"schema_version": 1, "knobs": {"num_workers": "4"}}'),
                          "num_workers must be an integer"),
    "truncated": (text('{"schema_version": 1, "knobs": {"num_wor'), "not valid JSON"),
    "binary": (raw(b"\x00\xff\xfe\x80" * 64), "not valid JSON|cannot read"),
    "a JSON list": (text("[1, 2]"), "does not hold a JSON object"),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_training_runs_on_defaults_with_one_warning(kind, tmp_path, monkeypatch):
    make, reason = KINDS[kind]
    path = make(tmp_path)
    monkeypatch.setenv("TUNEUP_SETTINGS", str(path))
    apply._cache.clear()
    with pytest.warns(TuneupWarning, match=reason) as caught:
        knobs = apply.settings_knobs()
        model = torch.nn.Linear(4, 2)
        loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
        for x, y in tuned_loader(torch.utils.data.TensorDataset(
                torch.randn(8, 4), torch.randint(0, 2, (8,))), batch_size=4):
            loop.backward(torch.nn.functional.cross_entropy(loop.model(x), y))
    assert knobs == Knobs() and loop.stats().steps == 2
    assert len([w for w in caught if issubclass(w.category, TuneupWarning)]) == 1
    assert str(path) in str(caught[0].message)


def test_knobs_beyond_the_machine_are_cut_with_one_warning(tmp_path, monkeypatch):
    path = tmp_path / "big.json"
    save(Settings(knobs=Knobs(num_workers=10**9, cpu_threads=10**9, prefetch_factor=10**6)), path)
    monkeypatch.setenv("TUNEUP_SETTINGS", str(path))
    apply._cache.clear()
    cores = apply.usable_cores()
    with pytest.warns(TuneupWarning, match=f"cut to this machine's {cores} usable cores") as caught:
        knobs = apply.settings_knobs()
    assert len(caught) == 1
    assert (knobs.num_workers, knobs.cpu_threads, knobs.prefetch_factor) == (4 * cores, cores, 64)


def test_saving_honours_the_umask(tmp_path):
    previous = os.umask(0o022)
    try:
        save(Settings(), tmp_path / "a.json")
        os.umask(0o077)
        save(Settings(), tmp_path / "b.json")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "b.json").stat().st_mode) == 0o600


def test_saving_writes_through_a_symlink(tmp_path):
    target = tmp_path / "real" / "train.tuneup.json"
    target.parent.mkdir()
    save(Settings(), target)
    link = tmp_path / "train.tuneup.json"
    link.symlink_to(target)
    save(Settings(knobs=Knobs(num_workers=2)), link)
    assert link.is_symlink() and read(target).knobs.num_workers == 2


def test_a_failed_save_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "train.tuneup.json"
    save(Settings(knobs=Knobs(num_workers=1)), path)

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError):
        save(Settings(knobs=Knobs(num_workers=2)), path)
    assert read(path).knobs.num_workers == 1
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_settings_never_hold_non_json_numbers(tmp_path):
    from tuneup.settings import Measurement

    with pytest.raises(ValueError):
        save(Settings(measured=Measurement(baseline_samples_per_s=float("nan"))),
             tmp_path / "x.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not (tmp_path / "x.json").exists()
