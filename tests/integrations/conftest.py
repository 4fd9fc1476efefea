"""Shared pieces for the integration tests: a clean environment and process state, settings
files, and the transformers / Lightning quiet options."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from tuneup.runtime import apply
from tuneup.settings import Knobs, Measurement, Settings, save

ENV = ("TUNEUP_SETTINGS", "TUNEUP_DISABLE", "TUNEUP_PROBE", "TUNEUP_OBSERVERS",
       "ACCELERATE_MIXED_PRECISION", "ACCELERATE_DYNAMO_BACKEND", "ACCELERATE_DYNAMO_MODE")


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No tuneup variables, no per-script settings file (pytest is not a training script),
    and the process-wide switches the settings may set put back afterwards."""
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("tuneup.settings.store.running_script", lambda: None)
    apply._cache.clear()
    threads, matmul = torch.get_num_threads(), torch.get_float32_matmul_precision()
    yield
    torch.set_num_threads(threads)
    torch.set_float32_matmul_precision(matmul)
    apply._cache.clear()


@pytest.fixture
def write_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Path]:
    """Write a settings file with the given knobs and point TUNEUP_SETTINGS at it."""

    def write(effective_batch_size: int | None = None, **knobs: object) -> Path:
        path = tmp_path / "train.tuneup.json"
        save(Settings(knobs=Knobs(**knobs),
                      measured=Measurement(effective_batch_size=effective_batch_size)), path)
        monkeypatch.setenv("TUNEUP_SETTINGS", str(path))
        apply._cache.clear()
        return path

    return write
