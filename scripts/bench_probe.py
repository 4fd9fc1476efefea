"""What the plain-DataLoader probe costs a job: a plain PyTorch loop (a DataLoader and a
hand-written step) with the probe installed against the same loop without it.

The probe is what ``tuneup watch -- python train.py`` puts in a job that uses no tuneup
wrapper (tuneup/watch/plain_probe.py): it wraps every DataLoader iterator's ``__next__``
and writes a small feed file once a second. Here it is installed in this process, on a
temporary feed directory, and switched on and off between epochs (the iterator class's
``__init__`` / ``__next__`` set to the probe's or back to torch's), so both forms run in one
process, interleaved, the order reversed every round, as in scripts/bench_overhead.py. A
third form, "plain A/A" (the same code as "plain", its own optimizer and DataLoader), shows
the bench's own noise floor: the probe's ratio means something only where it stands out from
the A/A ratio. The figures per step compare the mean of each form's fastest quarter of epochs;
the median over rounds of probe/plain for adjacent epochs is printed beside it. The
"loader only" rows (batches and no step) and the null step rows give the probe's own cost
per batch in µs. Target: under 1 % on the examples' step sizes.

    .venv/bin/python scripts/bench_probe.py [--rounds 21] [--batch-sizes 16,64,256]
        [--examples] [--example-rounds 15] [--clock cpu|wall]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import timeit
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.utils.data.dataloader as dataloader_module
from torch.utils.data import Dataset

import bench_overhead
from bench_overhead import CLOCK, example, fast_quarter, null_step, plain_runner, tiny_mlp
from tuneup.watch.plain_probe import _Probe

BASE = dataloader_module._BaseDataLoaderIter


class Switch:
    """The probe's methods on the iterator class, or torch's own."""

    def __init__(self, directory: Path) -> None:
        self.original = (BASE.__init__, BASE.__next__)
        self.probe = _Probe(directory)
        self.probe.patch(dataloader_module)
        self.probed = (BASE.__init__, BASE.__next__)
        self.set(False)

    def set(self, on: bool) -> None:
        BASE.__init__, BASE.__next__ = self.probed if on else self.original


def runner(switch: Switch, on: bool) -> Callable[..., Callable[[], float]]:
    """The plain loop of bench_overhead, with the probe switched ``on`` for its epochs."""
    def make(dataset: Dataset, model: torch.nn.Module, loss: Callable, batch_size: int
             ) -> Callable[[], float]:
        epoch = plain_runner(dataset, model, loss, batch_size)

        def switched() -> float:
            switch.set(on)
            try:
                return epoch()
            finally:
                switch.set(False)
        return switched
    return make


def loader_only(switch: Switch, on: bool, dataset: Dataset, batch_size: int
                ) -> Callable[[], float]:
    """An epoch of batches and nothing else: the loader's own cost per batch, the probe's
    added to it when ``on``."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True)

    def epoch() -> float:
        switch.set(on)
        try:
            started = bench_overhead.clock()
            for _ in loader:
                pass
            return bench_overhead.clock() - started
        finally:
            switch.set(False)
    return epoch


def own_cost_ns(directory: Path, calls: int = 500_000, repeats: int = 7) -> tuple[float, float]:
    """The probe's own work per batch, timed alone (no loader, no noise of a step): an
    iterator class whose ``__next__`` returns at once, called with and without the probe's
    wrapper; the fastest of ``repeats`` runs of each. Returns (ns without, ns with)."""
    class Iterator:
        def __init__(self, loader: Any) -> None:
            pass

        def __next__(self) -> None:
            return None

    original = Iterator.__next__
    probe = _Probe(directory)
    probe.patch(SimpleNamespace(_BaseDataLoaderIter=Iterator))
    iterator = Iterator(SimpleNamespace(batch_size=16))

    def fastest(step: Callable[[Any], Any]) -> float:
        return min(timeit.repeat(lambda: step(iterator), number=calls, repeat=repeats)) / calls
    try:
        return fastest(original) * 1e9, fastest(Iterator.__next__) * 1e9
    finally:
        probe.broken = True  # its folder goes: no write at exit


def compare(switch: Switch, label: str, workload: tuple[Dataset, torch.nn.Module, Callable],
            batch_size: int, rounds: int) -> None:
    dataset, model, loss = workload
    if label == "loader only":
        runs = {name: loader_only(switch, name == "probe", dataset, batch_size)
                for name in ("plain", "probe", "plain A/A")}
    else:
        runs = {name: runner(switch, name == "probe")(dataset, model, loss, batch_size)
                for name in ("plain", "probe", "plain A/A")}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():
        run()  # warm up allocator and kernels
    order = list(runs)
    for round_ in range(rounds):
        for name in order if round_ % 2 == 0 else order[::-1]:
            times[name].append(runs[name]())
    steps = len(torch.utils.data.DataLoader(dataset, batch_size=batch_size))
    plain = fast_quarter(times["plain"]) / steps * 1e6
    for form in ("probe", "plain A/A"):
        paired = statistics.median(t / p for p, t in zip(times["plain"], times[form]))
        other = fast_quarter(times[form]) / steps * 1e6
        print(f"{label:14s} batch {batch_size:4d}  {form:9s}  plain {plain:9.1f} us/step  "
              f"{'again' if form == 'plain A/A' else 'probed'} {other:9.1f} us/step  "
              f"({other - plain:+7.1f} us)  ratio {other / plain:.4f}  "
              f"(paired median {paired:.4f})", flush=True)


def main() -> None:
    parser = bench_overhead.arguments(__doc__.splitlines()[0])
    parser.add_argument("--example-rounds", type=int, default=15,
                        help="rounds of the examples (an epoch of each: ~1 s)")
    args = parser.parse_args()
    bench_overhead.clock = CLOCK[args.clock]  # plain_runner reads the module's clock
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="tuneup-bench-probe-") as folder:
        switch = Switch(Path(folder))
        print(f"clock: {args.clock}, threads: {torch.get_num_threads()}, rounds: {args.rounds}, "
              f"python {sys.version.split()[0]}, torch {torch.__version__}")
        bare, probed = own_cost_ns(Path(folder))
        print(f"the probe's own work per batch: {probed - bare:.0f} ns (a bare __next__ "
              f"{bare:.0f} ns, wrapped {probed:.0f} ns; a publish once a second besides)")
        sizes = [int(b) for b in args.batch_sizes.split(",")]
        for batch_size in sizes:
            compare(switch, "loader only", null_step(), batch_size, args.rounds)
        for batch_size in sizes:
            compare(switch, "null step", null_step(), batch_size, args.rounds)
        for batch_size in sizes:
            compare(switch, "tiny MLP", tiny_mlp(), batch_size, args.rounds)
        if args.examples:
            compare(switch, "train_mlp", example("train_mlp", 2048), 256, args.example_rounds)
            compare(switch, "train_images", example("train_images", 512), 128,
                    args.example_rounds)
        published = switch.probe.counters.batches
        switch.probe.broken = True  # the folder goes now: no last write at exit
    print(f"batches the probe counted: {published}")


if __name__ == "__main__":
    main()
