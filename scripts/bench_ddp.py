"""DDP with gradient accumulation: all-reduces per optimizer step and samples/s, plain vs tuneup.

Two ranks on gloo (``torch.multiprocessing.spawn``, one process group), a small MLP, a batch
of ``--batch`` samples per rank trained as micro-batches of ``--micro-batch`` (accumulation 4
by default), in two arms on the same data in the same order:

- **A, plain DDP with accumulation** — what users write: ``loss / 4`` and ``backward()`` on
  each micro-batch of a ``DistributedDataParallel`` model, then ``optimizer.step()``. DDP
  all-reduces the gradients in every backward: 4 all-reduces per optimizer step.
- **B, tuneup** — the same model and data through ``tuned_loader`` / ``tuned_loop``
  (``loop.train_step``) with a settings file giving ``micro_batch_size``: every micro-batch but
  the last runs under ``no_sync()``, so 1 all-reduce per optimizer step.

All-reduces are counted for real: a DDP communication hook on each arm's model
(``register_comm_hook``) counts its calls and then runs PyTorch's default hook
(``allreduce_hook``: the bucket's all-reduce, averaged); one call = one bucket all-reduced.
The model fits one bucket, so calls per step are all-reduces per step (the bucket count is
printed). samples/s = samples of both ranks / the slower rank's wall time for an epoch.

The arms are interleaved in pairs (A B, B A, A B, ...) in the same processes, one epoch
each, so a pair's two epochs see the same machine; the speed ratio B/A is taken per pair and
its median and range printed.

Both arms start from the same parameters and see the same batches (a ``DistributedSampler``
with seed 0 and ``set_epoch`` in A; the one tuned_loader installs in B), so they train the
same up to float rounding. The max absolute difference of their parameters is printed per
rank, in float32 after the first epoch and at the end, and for a float64 control (both arms
again, one epoch, in float64). The float32 figure grows with the steps: summing 4 gradients
all-reduced one by one (A) rounds differently from summing them locally and all-reducing
once (B), ~1e-8 per step, and SGD with momentum through ReLUs amplifies such differences
over hundreds of steps. In float64 they stay ~1e-16, which separates rounding from a real
difference (checked: above 1e-12 is reported). The final training losses are printed too.

    .venv/bin/python scripts/bench_ddp.py [--pairs 20] [--steps 25] [--batch 256]
        [--micro-batch 64] [--hidden 256] [--threads 1] [--quick] [--format json]

The figures printed are what this run measured on this machine (which may be shared).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

WORLD = 2
FEATURES, CLASSES = 128, 10
SEED = 0  # model init, data, and the samplers' shuffle seed (tuned_loader's default too)


def make_dataset(samples: int, dtype: torch.dtype = torch.float32) -> TensorDataset:
    generator = torch.Generator().manual_seed(SEED)
    x = torch.randn(samples, FEATURES, generator=generator)
    teacher = torch.randn(FEATURES, CLASSES, generator=generator)
    return TensorDataset(x.to(dtype), (x @ teacher).argmax(1))


def make_model(hidden: int) -> torch.nn.Module:
    torch.manual_seed(SEED)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, CLASSES))


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


class Counter:
    """DDP communication hook: counts the buckets it all-reduces, then does the default."""

    def __init__(self) -> None:
        self.calls = 0
        self.buckets: set[int] = set()

    # no annotations: DDP checks them, and this module's are strings (__future__ annotations)
    def hook(self, state, bucket):  # type: ignore[no-untyped-def]
        self.calls += 1
        self.buckets.add(bucket.index())
        return default_hooks.allreduce_hook(state, bucket)


class Arm:
    """One DDP model, its optimizer and loader; :meth:`epoch` trains one pass."""

    name: str
    model: DistributedDataParallel
    loader: Any

    def __init__(self, args: argparse.Namespace, dataset: TensorDataset) -> None:
        dtype = dataset.tensors[0].dtype  # the model in the data's precision
        self.model = DistributedDataParallel(make_model(args.hidden).to(dtype))
        self.counter = Counter()
        self.model.register_comm_hook(None, self.counter.hook)
        self.optimizer = make_optimizer(self.model)

    def epoch(self) -> None:
        raise NotImplementedError

    def steps(self) -> int:
        return len(self.loader)

    def flat_parameters(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.model.parameters()])

    def loss_on(self, dataset: TensorDataset) -> float:
        """The mean loss over the whole ``dataset`` (the same on every rank)."""
        with torch.no_grad():
            x, y = dataset.tensors
            return F.cross_entropy(self.model.module(x), y).item()


def max_abs_diff(arms: dict[str, Arm]) -> float:
    return (arms["plain"].flat_parameters() - arms["tuneup"].flat_parameters()).abs().max().item()


class PlainArm(Arm):
    """What users write: backward on each micro-batch under DDP (no ``no_sync``)."""

    name = "plain"

    def __init__(self, args: argparse.Namespace, dataset: TensorDataset) -> None:
        super().__init__(args, dataset)
        self.micro = args.micro_batch
        self.accumulation = args.batch // args.micro_batch
        self.sampler = DistributedSampler(dataset, shuffle=True, seed=SEED)
        self.loader = DataLoader(dataset, batch_size=args.batch, sampler=self.sampler)
        self.passes = 0

    def epoch(self) -> None:
        self.sampler.set_epoch(self.passes)
        self.passes += 1
        for x, y in self.loader:
            self.optimizer.zero_grad()
            for xs, ys in zip(x.split(self.micro), y.split(self.micro)):
                loss = F.cross_entropy(self.model(xs), ys) / self.accumulation
                loss.backward()
            self.optimizer.step()


class TunedArm(Arm):
    """The same through ``tuned_loader`` / ``tuned_loop``; the micro-batch from the settings."""

    name = "tuneup"

    def __init__(self, args: argparse.Namespace, dataset: TensorDataset) -> None:
        from tuneup import tuned_loader, tuned_loop

        super().__init__(args, dataset)
        self.loop = tuned_loop(self.model, self.optimizer)
        with warnings.catch_warnings():  # the expected "each rank its own share" line
            warnings.filterwarnings("ignore", message="tuneup: tuned_loader gives each")
            self.loader = tuned_loader(dataset, batch_size=args.batch, shuffle=True,
                                       loop=self.loop)
        model = self.loop.model

        def loss_fn(batch: Any) -> torch.Tensor:
            return F.cross_entropy(model(batch[0]), batch[1])
        self.loss_fn = loss_fn

    def epoch(self) -> None:
        for batch in self.loader:
            self.loop.train_step(batch, self.loss_fn)


def timed_epoch(arm: Arm) -> dict[str, Any]:
    """One epoch of ``arm`` on every rank, started together: the slower rank's seconds, and
    this rank's all-reduce calls in it."""
    dist.barrier()
    calls = arm.counter.calls
    started = time.perf_counter()
    arm.epoch()
    elapsed = torch.tensor(time.perf_counter() - started, dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # not through DDP: not counted
    return {"seconds": elapsed.item(), "all_reduces": arm.counter.calls - calls,
            "steps": arm.steps()}


def rank_main(rank: int, args: argparse.Namespace, init: str, settings: str, out: str) -> None:
    os.environ["TUNEUP_SETTINGS"] = settings  # read by tuned_loop / tuned_loader on this rank
    os.environ["LOCAL_WORLD_SIZE"] = str(WORLD)  # as torchrun sets it: ranks share the cores
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    try:
        dataset = make_dataset(args.steps * args.batch * WORLD)
        arms: dict[str, Arm] = {"plain": PlainArm(args, dataset),
                                "tuneup": TunedArm(args, dataset)}
        for arm in arms.values():
            arm.epoch()  # warm-up: DDP's bucket rebuild, allocator, kernels
        first_epoch_diff = max_abs_diff(arms)
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in arms}
        for pair in range(args.pairs):
            order = ("plain", "tuneup") if pair % 2 == 0 else ("tuneup", "plain")
            for name in order:
                rounds[name].append(timed_epoch(arms[name]))
        # The float64 control: one epoch of both arms, same batches. float32 rounding
        # differences (~1e-8 at first) grow over hundreds of SGD steps; in float64 they stay
        # ~1e-16, so a difference there would be a real one (other data, other gradient).
        exact = make_dataset(args.steps * args.batch * WORLD, torch.float64)
        control: dict[str, Arm] = {"plain": PlainArm(args, exact),
                                   "tuneup": TunedArm(args, exact)}
        for arm in control.values():
            arm.epoch()
        mine = {
            "rank": rank,
            "rounds": rounds,
            "buckets": {name: len(arm.counter.buckets) for name, arm in arms.items()},
            "max_abs_diff_first_epoch": first_epoch_diff,
            "max_abs_diff": max_abs_diff(arms),
            "max_abs_diff_float64": max_abs_diff(control),
            "loss": {name: arm.loss_on(dataset) for name, arm in arms.items()},
            "applied_micro_batch": arms["tuneup"].loop.applied_micro_batch,
            "micro_batch_blocked": arms["tuneup"].loop.micro_batch_blocked,
        }
        # do the ranks hold the same parameters (DDP's promise), per arm
        for name, arm in arms.items():
            flat = arm.flat_parameters()
            high, low = flat.clone(), flat.clone()
            dist.all_reduce(high, op=dist.ReduceOp.MAX)
            dist.all_reduce(low, op=dist.ReduceOp.MIN)
            mine[f"rank_spread_{name}"] = (high - low).abs().max().item()
        gathered: list[Any] = [None] * WORLD
        dist.all_gather_object(gathered, mine)
        if rank == 0:
            Path(out).write_text(json.dumps(gathered))
    finally:
        dist.destroy_process_group()


def summarise(args: argparse.Namespace, ranks: list[dict[str, Any]], wall: float
              ) -> dict[str, Any]:
    samples_per_epoch = args.steps * args.batch * WORLD
    arms = {}
    for name in ("plain", "tuneup"):
        per_rank = [[r["all_reduces"] / r["steps"] for r in rank["rounds"][name]]
                    for rank in ranks]
        speeds = [samples_per_epoch / r["seconds"] for r in ranks[0]["rounds"][name]]
        flat = [value for values in per_rank for value in values]
        arms[name] = {
            "all_reduces_per_step": statistics.median(flat),
            "all_reduces_per_step_range": [min(flat), max(flat)],
            "buckets": max(rank["buckets"][name] for rank in ranks),
            "samples_per_s": statistics.median(speeds),
            "samples_per_s_range": [min(speeds), max(speeds)],
            "samples_per_s_rounds": speeds,
            "ms_per_step": statistics.median(
                r["seconds"] / r["steps"] * 1e3 for r in ranks[0]["rounds"][name]),
            "rank_spread": max(rank[f"rank_spread_{name}"] for rank in ranks),
        }
    ratios = [b / a for a, b in zip(arms["plain"]["samples_per_s_rounds"],
                                    arms["tuneup"]["samples_per_s_rounds"])]
    return {
        "ranks": WORLD, "backend": "gloo", "threads_per_rank": args.threads,
        "torch": torch.__version__, "usable_cores": len(os.sched_getaffinity(0)),
        "model": f"MLP {FEATURES}-{args.hidden}-{args.hidden}-{CLASSES}",
        "parameters": sum(p.numel() for p in make_model(args.hidden).parameters()),
        "batch_per_rank": args.batch, "micro_batch": args.micro_batch,
        "accumulation": args.batch // args.micro_batch, "steps_per_epoch": args.steps,
        "pairs": args.pairs,
        "arms": arms,
        "ratio_tuneup_over_plain": statistics.median(ratios),
        "ratio_range": [min(ratios), max(ratios)],
        "ratios": ratios,
        "epochs_per_arm": args.pairs + 1,
        "max_abs_param_diff_per_rank": [rank["max_abs_diff"] for rank in ranks],
        "max_abs_param_diff_first_epoch_per_rank": [rank["max_abs_diff_first_epoch"]
                                                    for rank in ranks],
        "max_abs_param_diff_float64_per_rank": [rank["max_abs_diff_float64"]
                                                for rank in ranks],
        "final_loss": ranks[0]["loss"],
        "applied_micro_batch": [rank["applied_micro_batch"] for rank in ranks],
        "micro_batch_blocked": [rank["micro_batch_blocked"] for rank in ranks],
        "wall_s": wall,
    }


def surprises(result: dict[str, Any]) -> list[str]:
    """What does not match the expectation: said, never hidden."""
    found = []
    accumulation = result["accumulation"]
    expected = {"plain": accumulation, "tuneup": 1}
    for name, arm in result["arms"].items():
        low, high = arm["all_reduces_per_step_range"]
        if arm["buckets"] != 1:
            found.append(f"{name}: the gradients went in {arm['buckets']} buckets, so calls per "
                         "step count bucket all-reduces, not optimizer-step all-reduces")
        if (low, high) != (expected[name] * arm["buckets"],) * 2:
            found.append(f"{name}: {low:g}..{high:g} all-reduce calls per step, expected "
                         f"{expected[name] * arm['buckets']}")
        if arm["rank_spread"] > 0:
            found.append(f"{name}: the ranks' parameters differ by up to {arm['rank_spread']:.3g}")
    if any(m != result["micro_batch"] for m in result["applied_micro_batch"]):
        found.append(f"tuneup applied micro-batch {result['applied_micro_batch']} "
                     f"(blocked: {result['micro_batch_blocked']})")
    if max(result["max_abs_param_diff_float64_per_rank"]) > 1e-12:
        found.append("in float64 the arms' parameters differ by more than 1e-12 after one "
                     "epoch: not rounding, the arms train differently")
    return found


def print_table(result: dict[str, Any], found: list[str]) -> None:
    arms = result["arms"]
    print(f"DDP with gradient accumulation: {result['ranks']} ranks on {result['backend']} "
          f"(CPU, {result['usable_cores']} usable cores, {result['threads_per_rank']} torch "
          f"thread per rank), torch {result['torch']}")
    print(f"{result['model']} ({result['parameters']:,} parameters, "
          f"{result['parameters'] * 4 / 1024:.0f} KiB of float32 gradients), SGD; batch "
          f"{result['batch_per_rank']} per rank = {result['accumulation']} micro-batches of "
          f"{result['micro_batch']}; {result['pairs']} interleaved pairs of one epoch "
          f"({result['steps_per_epoch']} optimizer steps) per arm")
    print()
    print(f"  {'arm':34s} {'all-reduces/step':>16s} {'buckets':>7s} {'ms/step':>8s} "
          f"{'samples/s median (range)':>28s}")
    labels = {"plain": "A plain DDP, backward x" + str(result["accumulation"]),
              "tuneup": "B tuneup (train_step, no_sync)"}
    for name, arm in arms.items():
        low, high = arm["all_reduces_per_step_range"]
        count = f"{arm['all_reduces_per_step']:g}" + ("" if low == high else
                                                       f" ({low:g}..{high:g})")
        speed = (f"{arm['samples_per_s']:,.0f} ({arm['samples_per_s_range'][0]:,.0f}.."
                 f"{arm['samples_per_s_range'][1]:,.0f})")
        print(f"  {labels[name]:34s} {count:>16s} {arm['buckets']:>7d} "
              f"{arm['ms_per_step']:>8.2f} {speed:>28s}")
    low, high = result["ratio_range"]
    print()
    print(f"  samples/s ratio B/A per pair: median {result['ratio_tuneup_over_plain']:.3f} "
          f"(range {low:.3f}..{high:.3f}, {len(result['ratios'])} pairs)")
    def per_rank(key: str) -> str:
        return ", ".join(f"{d:.1e}" for d in result[key])
    steps = result["steps_per_epoch"]
    print(f"  parameters, max |A - B| (rank 0, rank 1): float32 after 1 epoch ({steps} steps) "
          f"{per_rank('max_abs_param_diff_first_epoch_per_rank')}, after "
          f"{result['epochs_per_arm']} epochs {per_rank('max_abs_param_diff_per_rank')}; "
          f"float64 control after 1 epoch {per_rank('max_abs_param_diff_float64_per_rank')}")
    loss = result["final_loss"]
    print(f"  final training loss A {loss['plain']:.6g}, B {loss['tuneup']:.6g} (|A - B| "
          f"{abs(loss['plain'] - loss['tuneup']):.1e}); ranks identical "
          f"within each arm: "
          f"{'yes' if all(a['rank_spread'] == 0 for a in arms.values()) else 'NO'}")
    print(f"  wall time {result['wall_s']:.1f} s")
    for line in found:
        print(f"SURPRISE: {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20, help="interleaved A/B epoch pairs")
    parser.add_argument("--steps", type=int, default=25, help="optimizer steps per epoch")
    parser.add_argument("--batch", type=int, default=256, help="samples per rank per step")
    parser.add_argument("--micro-batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256, help="MLP hidden width")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--quick", action="store_true", help="a few-second smoke run")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    args = parser.parse_args()
    if args.quick:
        args.pairs, args.steps = 2, 3
    if args.batch % args.micro_batch or args.batch <= args.micro_batch:
        parser.error("--batch must be a multiple of --micro-batch, and larger")

    from tuneup.settings import Knobs, Settings, fingerprint, save

    with tempfile.TemporaryDirectory(prefix="bench-ddp-") as folder:
        settings = Path(folder) / "bench_ddp.tuneup.json"
        # this machine's fingerprint: the micro-batch applies as a tuned file's would
        save(Settings(knobs=Knobs(micro_batch_size=args.micro_batch),
                      fingerprint=fingerprint.current()), settings)
        out = Path(folder) / "result.json"
        started = time.perf_counter()
        mp.spawn(rank_main, args=(args, f"file://{Path(folder) / 'rendezvous'}",
                                  str(settings), str(out)), nprocs=WORLD, join=True)
        result = summarise(args, json.loads(out.read_text()), time.perf_counter() - started)
    found = surprises(result)
    result["surprises"] = found
    if args.format == "json":
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        print_table(result, found)


if __name__ == "__main__":
    main()
