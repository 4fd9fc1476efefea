"""Compute-bound example: an MLP classifier on generated data, where AMP and compile matter.

It trains on the GPU where there is one (``--device cpu`` to stay on the CPU), where AMP,
compile and pinned, non-blocking copies become live knobs. Run it as is (plain PyTorch
behaviour without a settings file), then tune it:

    python docs/examples/train_mlp.py --steps 300 --batch-size 256
    tuneup autotune docs/examples/train_mlp.py -- --batch-size 256

The workload pieces (``make_dataset``, ``make_model``, ``make_optimizer``, ``compute_loss``)
are importable so that benchmarks can run the same work with plain PyTorch code.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

from tuneup import tuned_loader, tuned_loop

FEATURES = 512
HIDDEN = 2048
CLASSES = 10
DEFAULT_BATCH = 256


def make_dataset(size: int = 8192, seed: int = 0) -> TensorDataset:
    """Gaussian features labelled by a fixed random linear teacher (learnable, cheap to load)."""
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(size, FEATURES, generator=generator)
    teacher = torch.randn(FEATURES, CLASSES, generator=generator)
    return TensorDataset(features, (features @ teacher).argmax(dim=1))


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.GELU(),
        nn.Linear(HIDDEN, HIDDEN), nn.GELU(),
        nn.Linear(HIDDEN, CLASSES),
    )


def default_device() -> str:
    """The GPU where there is one: what a user with a GPU trains on."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    features, labels = batch
    return nn.functional.cross_entropy(model(features), labels)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="training iterations (default 300)")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH,
                        help=f"samples per optimizer step (default {DEFAULT_BATCH})")
    parser.add_argument("--device", default=default_device(),
                        help="where to train (default: cuda when there is a GPU, else cpu)")
    parser.add_argument("--dataset-size", type=int, default=8192)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1:
        parser.error("--steps and --batch-size must be positive")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model = make_model().to(args.device)
    optimizer = make_optimizer(model)
    loop = tuned_loop(model, optimizer)  # the loader hands it batches on the model's device
    loader = tuned_loader(make_dataset(args.dataset_size), batch_size=args.batch_size,
                          shuffle=True, drop_last=True, loop=loop)
    step, samples, started = 0, 0, time.perf_counter()
    while step < args.steps:
        for features, labels in loader:
            loss = loop.train_step((features, labels), lambda batch: compute_loss(loop.model, batch))
            step += 1
            samples += len(labels)
            if step >= args.steps:
                break
    elapsed = time.perf_counter() - started
    print(f"{step} iterations, loss {loss.item():.4f}, {samples / elapsed:.0f} samples/s")


if __name__ == "__main__":
    main()
