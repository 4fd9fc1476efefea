"""The training loop the watch-acceptance jobs share, in two forms that do the same work: plain
PyTorch (a ``torch.utils.data.DataLoader`` and a hand-written step), and ``--wrapped``
(tuneup's ``tuned_loader`` / ``tuned_loop``, which with no settings file beside the script are
plain PyTorch). Under ``tuneup watch`` the first is measured by the plain-DataLoader probe,
the second by the wrappers' own feed: the acceptance compares the two.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

Loss = Callable[[torch.nn.Module, Any], torch.Tensor]


def parse_args(description: str, steps: int, batch_size: int) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=steps, help=f"optimizer steps ({steps})")
    parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--wrapped", action="store_true",
                        help="the same work through tuned_loader / tuned_loop")
    args = parser.parse_args()
    if args.steps < 1 or args.batch_size < 1:
        parser.error("--steps and --batch-size must be positive")
    return args


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, dataset: Dataset,
          loss: Loss, args: argparse.Namespace, **loader_kwargs: Any) -> None:
    """``args.steps`` optimizer steps over as many epochs as it takes; prints the rate."""
    run = _wrapped if args.wrapped else _plain
    started = time.perf_counter()
    last = run(model, optimizer, dataset, loss, args, loader_kwargs)
    seconds = time.perf_counter() - started
    form = "wrapped" if args.wrapped else "plain"
    print(f"{form}: {args.steps} steps, loss {last:.4f}, "
          f"{args.steps * args.batch_size / seconds:.0f} samples/s")


def _plain(model: torch.nn.Module, optimizer: torch.optim.Optimizer, dataset: Dataset,
           loss: Loss, args: argparse.Namespace, loader_kwargs: dict[str, Any]) -> float:
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True,
                        **loader_kwargs)
    step, value = 0, torch.zeros(())
    while step < args.steps:
        for batch in loader:
            value = loss(model, batch)
            value.backward()
            optimizer.step()
            optimizer.zero_grad()  # where train_step does it: the same memory use, same speed
            step += 1
            if step >= args.steps:
                break
    return float(value.detach())


def _wrapped(model: torch.nn.Module, optimizer: torch.optim.Optimizer, dataset: Dataset,
             loss: Loss, args: argparse.Namespace, loader_kwargs: dict[str, Any]) -> float:
    from tuneup import tuned_loader, tuned_loop

    loop = tuned_loop(model, optimizer)
    loader = tuned_loader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True,
                          loop=loop, **loader_kwargs)
    step, value = 0, torch.zeros(())
    while step < args.steps:
        for batch in loader:
            value = loop.train_step(batch, lambda b: loss(loop.model, b))
            step += 1
            if step >= args.steps:
                break
    return float(value.detach())
