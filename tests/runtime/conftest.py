"""Shared pieces for the runtime tests: a clean environment, settings files, tiny workloads."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tuneup.settings import Knobs, Settings, save

ENV = ("TUNEUP_SETTINGS", "TUNEUP_DISABLE", "TUNEUP_PROBE", "TUNEUP_VERBOSE")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No tuneup variables, and no per-script settings file (pytest is not a training script)."""
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("tuneup.settings.store.running_script", lambda: None)


@pytest.fixture
def write_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Path]:
    """Write a settings file with the given knobs and point TUNEUP_SETTINGS at it."""

    def write(fingerprint: dict | None = None, **knobs: object) -> Path:
        path = tmp_path / "train.tuneup.json"
        save(Settings(knobs=Knobs(**knobs), fingerprint=fingerprint or {}), path)
        monkeypatch.setenv("TUNEUP_SETTINGS", str(path))
        return path

    return write


@pytest.fixture
def no_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield
