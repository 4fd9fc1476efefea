"""Overhead of tuned_loader + tuned_loop against the plain PyTorch loop, same work.

Settings equal to the defaults (a settings file whose knobs are all null), interleaved runs
in one process; the ratio is the median over rounds of tuned/plain for runs next to each
other in time, which cancels most of the drift of a shared machine. Target: under 1%.

    .venv/bin/python scripts/bench_overhead.py [--rounds 41] [--batch-size 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from tuneup import tuned_loader, tuned_loop
from tuneup.settings import Settings, save


def workload(size: int, features: int = 128) -> tuple[TensorDataset, torch.nn.Module]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(size, features, generator=generator)
    dataset = TensorDataset(x, (x[:, 0] > 0).long())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(features, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2))
    return dataset, model


def plain_epoch(dataset: TensorDataset, model: torch.nn.Module, batch_size: int) -> float:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    started = time.perf_counter()
    for x, y in DataLoader(dataset, batch_size=batch_size, shuffle=True):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    return time.perf_counter() - started


def tuned_epoch(dataset: TensorDataset, model: torch.nn.Module, batch_size: int) -> float:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    started = time.perf_counter()
    loop = tuned_loop(model, optimizer)
    for x, y in tuned_loader(dataset, batch_size=batch_size, shuffle=True, loop=loop):
        with loop.step():
            loss = F.cross_entropy(loop.model(x), y)
        loop.backward(loss)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--dataset-size", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: steadier on a shared machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        settings = Path(folder) / "defaults.tuneup.json"
        save(Settings(), settings)  # every knob null: PyTorch's defaults
        os.environ["TUNEUP_SETTINGS"] = str(settings)
        dataset, model = workload(args.dataset_size)
        plain_epoch(dataset, model, args.batch_size)  # warm up allocator and kernels
        tuned_epoch(dataset, model, args.batch_size)
        plain, tuned = [], []
        for round_ in range(args.rounds):
            runs = [(plain, plain_epoch), (tuned, tuned_epoch)]
            for times, epoch in runs if round_ % 2 == 0 else runs[::-1]:
                times.append(epoch(dataset, model, args.batch_size))
    steps = -(-args.dataset_size // args.batch_size)
    print(f"steps per epoch: {steps}, rounds: {args.rounds}, threads: {torch.get_num_threads()}")
    plain_s, tuned_s = statistics.median(plain), statistics.median(tuned)
    print(f"median epoch: plain {plain_s / steps * 1e6:7.1f} us/step, tuned "
          f"{tuned_s / steps * 1e6:7.1f} us/step ({(tuned_s - plain_s) / steps * 1e6:+.1f} us/step)")
    paired = statistics.median(t / p for p, t in zip(plain, tuned))  # neighbours in time
    print(f"ratio tuned/plain (median of paired runs): {paired:.4f}  (target < 1.01)")


if __name__ == "__main__":
    main()
