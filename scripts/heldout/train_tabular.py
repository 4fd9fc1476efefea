"""Held-out workload for scripts/bench_autotune.py: click-through prediction on tabular rows
whose categorical fields are parsed and hashed in Python per sample (GIL-bound input work,
no NumPy), feeding an EmbeddingBag and a small MLP: sparse lookups and a pipeline a
process pool can speed up, a shape the autotuner was not developed on. Same interface as
docs/examples (``make_dataset``, ``make_model``, ``make_optimizer``, ``compute_loss``,
``DEFAULT_BATCH``), so the benchmark's grid runs the same work with plain PyTorch.

    python scripts/heldout/train_tabular.py --steps 200
    .venv/bin/python scripts/bench_autotune.py --workloads train_tabular
"""

from __future__ import annotations

import argparse
import random
import time
import zlib

import torch
from torch import nn
from torch.utils.data import Dataset

from tuneup import tuned_loader, tuned_loop

FIELDS = 26  # categorical columns, as in the Criteo layout
NUMERIC = 13
BUCKETS = 1 << 16  # hashing trick: ids modulo this many embedding rows
WIDTH = 32
DEFAULT_BATCH = 256


class ClickRows(Dataset):
    """Rows stored as the raw tab-separated text a log file holds; every ``__getitem__``
    splits, parses and hashes it (deterministically: crc32, not Python's salted ``hash``)."""

    def __init__(self, size: int = 8192, seed: int = 0) -> None:
        rng = random.Random(seed)
        self.lines = [self._line(rng) for _ in range(size)]

    @staticmethod
    def _line(rng: random.Random) -> str:
        categories = [f"c{field}_{int(rng.paretovariate(1.2)) % 5000:x}" for field in range(FIELDS)]
        numbers = [f"{rng.lognormvariate(1.0, 1.5):.3f}" for _ in range(NUMERIC)]
        signal = sum(len(c) for c in categories[:4]) + float(numbers[0])
        label = "1" if signal + rng.gauss(0, 3) > 30 else "0"
        return "\t".join([label, *numbers, *categories])

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        label, *rest = self.lines[index].split("\t")
        numbers = [min(float(v), 1e4) for v in rest[:NUMERIC]]
        dense = [(v ** 0.5) / 10.0 for v in numbers]  # a log-normal column, tamed
        ids = [zlib.crc32(f"{field}:{value}".encode()) % BUCKETS
               for field, value in enumerate(rest[NUMERIC:])]
        return (torch.tensor(ids, dtype=torch.long), torch.tensor(dense, dtype=torch.float32),
                torch.tensor(float(label)))


def make_dataset(size: int = 8192, seed: int = 0) -> ClickRows:
    return ClickRows(size, seed)


class ClickModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(BUCKETS, WIDTH, mode="sum")
        self.dense = nn.Linear(NUMERIC, WIDTH)
        self.top = nn.Sequential(nn.Linear(2 * WIDTH, 256), nn.ReLU(), nn.Linear(256, 128),
                                 nn.ReLU(), nn.Linear(128, 1))

    def forward(self, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        features = torch.cat([self.embed(ids), self.dense(dense)], dim=1)
        return self.top(features).squeeze(1)


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return ClickModel()


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=1e-3)


def compute_loss(model: nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
    ids, dense, labels = batch
    return nn.functional.binary_cross_entropy_with_logits(model(ids, dense).float(), labels)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="training iterations (default 200)")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH,
                        help=f"rows per optimizer step (default {DEFAULT_BATCH})")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1:
        parser.error("--steps and --batch-size must be positive")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model = make_model()
    optimizer = make_optimizer(model)
    loop = tuned_loop(model, optimizer)
    loader = tuned_loader(make_dataset(), batch_size=args.batch_size, shuffle=True,
                          drop_last=True, loop=loop)
    step, started = 0, time.perf_counter()
    while step < args.steps:
        for batch in loader:
            loss = loop.train_step(batch, lambda piece: compute_loss(loop.model, piece))
            step += 1
            if step >= args.steps:
                break
    elapsed = time.perf_counter() - started
    print(f"{step} iterations, loss {loss.item():.4f}, "
          f"{step * args.batch_size / elapsed:.0f} rows/s")


if __name__ == "__main__":
    main()
