"""Overhead of tuned_loader + tuned_loop against the plain PyTorch loop, same work.

Settings equal to the defaults (a settings file whose knobs are all null). As in a real
script, the wrappers and the DataLoader are made once, before the timed epochs; their
one-time cost is reported apart. Runs are interleaved in one process (the order reversed
every round). The figures per step and the ratio compare the mean of each form's fastest
quarter of epochs (interference only ever slows an epoch down); the median over rounds of
tuned/plain for epochs next to each other in time is printed beside it. Both forms are
measured: ``loop.train_step`` and the plain ``loop.step()`` + ``loop.backward()``. Targets:
under 1 % on the examples' step sizes and under 20 µs per step on the tiny MLP. The "null
step" rows (no compute to speak of) show the wrappers' own cost per step in µs, the figure
whole-epoch ratios cannot resolve.

Each workload also times a second plain loop ("plain A/A": the same code as "plain", its own
optimizer and DataLoader), so the bench shows its own noise floor: a tuned ratio is
meaningful only where it stands out from the A/A ratio. Epochs are timed with the main
thread's CPU time by default (``--clock cpu``; everything here runs in that thread: no
workers, one torch thread), which leaves out the time the thread is preempted by other
processes on a shared machine; ``--clock wall`` times wall-clock seconds instead.

    .venv/bin/python scripts/bench_overhead.py [--rounds 21] [--batch-sizes 16,64,256]
        [--examples] [--clock cpu|wall]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

from tuneup import tuned_loader, tuned_loop
from tuneup.settings import Settings, save

EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"


def tiny_mlp(size: int = 4096, features: int = 128) -> tuple[Dataset, torch.nn.Module, Callable]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(size, features, generator=generator)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(features, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2))
    return TensorDataset(x, (x[:, 0] > 0).long()), model, \
        lambda m, b: F.cross_entropy(m(b[0]), b[1])


def null_step(size: int = 8192) -> tuple[Dataset, torch.nn.Module, Callable]:
    """Almost no compute (a 4 -> 1 linear layer on 4 of the features): what is left of a
    step is the loop's own cost, so the difference is the wrappers' cost per step."""
    x = torch.randn(size, 128, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    return TensorDataset(x, x[:, 0]), torch.nn.Linear(4, 1), \
        lambda m, b: (m(b[0][:, :4]).squeeze(1) - b[1]).square().mean()


def example(name: str, size: int) -> tuple[Dataset, torch.nn.Module, Callable]:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_dataset(size), module.make_model(), module.compute_loss


CLOCK = {"cpu": time.thread_time, "wall": time.perf_counter}
clock = CLOCK["cpu"]


def plain_runner(dataset: Dataset, model: torch.nn.Module, loss: Callable, batch_size: int
                 ) -> Callable[[], float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True)

    def epoch() -> float:
        started = clock()
        for batch in loader:
            optimizer.zero_grad()
            loss(model, batch).backward()
            optimizer.step()
        return clock() - started
    return epoch


def tuned_runner(form: str) -> Callable[..., Callable[[], float]]:
    def make(dataset: Dataset, model: torch.nn.Module, loss: Callable, batch_size: int
             ) -> Callable[[], float]:
        loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.01))
        loader = tuned_loader(dataset, batch_size=batch_size, shuffle=True, loop=loop)

        def step_fn(batch: Any) -> torch.Tensor:
            return loss(loop.model, batch)

        def epoch() -> float:
            started = clock()
            for batch in loader:
                if form == "train_step":
                    loop.train_step(batch, step_fn)
                else:
                    with loop.step():
                        value = loss(loop.model, batch)
                    loop.backward(value)
            return clock() - started
        return epoch
    return make


def setup_cost(dataset: Dataset, model: torch.nn.Module, repeats: int = 200) -> float:
    """Microseconds tuned_loop + tuned_loader take beyond a DataLoader: paid once a run."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    costs = []
    for _ in range(repeats):
        started = time.perf_counter()
        tuned_loader(dataset, batch_size=64, loop=tuned_loop(model, optimizer))
        middle = time.perf_counter()
        DataLoader(dataset, batch_size=64)
        costs.append((middle - started) - (time.perf_counter() - middle))
    return statistics.median(costs) * 1e6


def compare(label: str, workload: tuple[Dataset, torch.nn.Module, Callable], batch_size: int,
            rounds: int) -> None:
    dataset, model, loss = workload
    runs = {"plain": plain_runner(dataset, model, loss, batch_size),
            "train_step": tuned_runner("train_step")(dataset, model, loss, batch_size),
            "backward": tuned_runner("backward")(dataset, model, loss, batch_size),
            "plain A/A": plain_runner(dataset, model, loss, batch_size)}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():
        run()  # warm up allocator and kernels
    order = list(runs)
    for round_ in range(rounds):
        for name in order if round_ % 2 == 0 else order[::-1]:
            times[name].append(runs[name]())
    steps = len(DataLoader(dataset, batch_size=batch_size))
    plain = fast_quarter(times["plain"]) / steps * 1e6
    for form in ("train_step", "backward", "plain A/A"):
        paired = statistics.median(t / p for p, t in zip(times["plain"], times[form]))
        tuned = fast_quarter(times[form]) / steps * 1e6
        print(f"{label:14s} batch {batch_size:4d}  {form:10s}  plain {plain:9.1f} us/step  "
              f"{'again' if form == 'plain A/A' else 'tuned'} {tuned:9.1f} us/step  "
              f"({tuned - plain:+7.1f} us)  ratio {tuned / plain:.4f}  "
              f"(paired median {paired:.4f})", flush=True)


def fast_quarter(seconds: list[float]) -> float:
    """Mean of the fastest quarter of the epochs: other processes on a shared machine only
    ever slow an epoch down (preemption, cache and memory-bandwidth contention), so the
    fast epochs are the code's own speed; a quarter, not the single fastest, so that one
    lucky epoch does not decide."""
    fastest = sorted(seconds)[:max(1, len(seconds) // 4)]
    return statistics.fmean(fastest)


def arguments(description: str) -> argparse.ArgumentParser:
    """The options this benchmark and its like (bench_probe.py) share."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--batch-sizes", default="16,64,256")
    parser.add_argument("--examples", action="store_true",
                        help="also the two examples at their default batch size (slower)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: steadier on a shared machine)")
    parser.add_argument("--clock", choices=sorted(CLOCK), default="cpu",
                        help="cpu: the main thread's CPU time (default); wall: wall clock")
    return parser


def main() -> None:
    args = arguments(__doc__.splitlines()[0]).parse_args()
    global clock
    clock = CLOCK[args.clock]
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        settings = Path(folder) / "defaults.tuneup.json"
        save(Settings(), settings)  # every knob null: PyTorch's defaults
        os.environ["TUNEUP_SETTINGS"] = str(settings)
        print(f"clock: {args.clock}, threads: {torch.get_num_threads()}, rounds: {args.rounds}, "
              f"python {sys.version.split()[0]}, torch {torch.__version__}")
        print(f"one-time setup beyond a DataLoader: {setup_cost(*tiny_mlp()[:2]):.0f} us")
        for batch_size in (int(b) for b in args.batch_sizes.split(",")):
            compare("null step", null_step(), batch_size, args.rounds)
        for batch_size in (int(b) for b in args.batch_sizes.split(",")):
            compare("tiny MLP", tiny_mlp(), batch_size, args.rounds)
        if args.examples:
            compare("train_mlp", example("train_mlp", 2048), 256, max(3, args.rounds // 4))
            compare("train_images", example("train_images", 512), 64, max(3, args.rounds // 4))


if __name__ == "__main__":
    main()
