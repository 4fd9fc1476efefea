"""The benchmark's held-out workloads run as a user runs them (through tuneup's wrappers) and
expose the pieces the benchmark's plain-PyTorch grid imports."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HELDOUT = Path(__file__).resolve().parents[2] / "scripts" / "heldout"
NAMES = sorted(path.stem for path in HELDOUT.glob("train_*.py"))


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, HELDOUT / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_there_are_held_out_workloads():
    assert {"train_tokens", "train_tabular", "train_audio"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_a_held_out_workload_trains_through_the_wrappers(name, monkeypatch, capsys):
    monkeypatch.delenv("TUNEUP_SETTINGS", raising=False)
    load(name).main(["--steps", "3", "--batch-size", "8"])
    assert capsys.readouterr().out.startswith("3 iterations, loss ")


@pytest.mark.parametrize("name", NAMES)
def test_the_plain_pieces_give_a_finite_loss_that_trains(name):
    workload = load(name)
    dataset = workload.make_dataset()
    batch = torch.utils.data.default_collate([dataset[i] for i in range(8)])
    model = workload.make_model()
    first = workload.compute_loss(model, batch)
    assert torch.isfinite(first)
    optimizer = workload.make_optimizer(model)
    for _ in range(5):
        optimizer.zero_grad()
        loss = workload.compute_loss(model, batch)
        loss.backward()
        optimizer.step()
    assert workload.compute_loss(model, batch) < first


def test_rows_parse_the_same_in_every_process():
    """Hashing uses crc32, not Python's per-process salted hash(): a worker and the main
    process map a row to the same embedding ids."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import train_tabular; "
            "print(train_tabular.make_dataset(size=4)[3][0].tolist())")
    outputs = {subprocess.run([sys.executable, "-c", code, str(HELDOUT)], capture_output=True,
                              text=True, check=True, env={**os.environ, "PYTHONHASHSEED": seed}
                              ).stdout for seed in ("1", "2")}
    assert len(outputs) == 1
    assert outputs.pop().strip() == str(load("train_tabular").make_dataset(size=4)[3][0].tolist())


def test_a_repeated_clip_keeps_its_label():
    """Samples beyond the stored clips repeat them: clip i % UNIQUE, and its label."""
    audio = load("train_audio")
    dataset = audio.make_dataset(size=audio.UNIQUE + 5)
    assert all(dataset.labels[audio.UNIQUE + i] == dataset.labels[i] for i in range(5))
