"""Held-out workload for scripts/bench_autotune.py: a small causal transformer language model
on generated token sequences (attention, layer norms, a token-level loss), a shape the
autotuner was not developed on. Same interface as docs/examples (``make_dataset``,
``make_model``, ``make_optimizer``, ``compute_loss``, ``DEFAULT_BATCH``), so the benchmark's
grid runs the same work with plain PyTorch.

    python scripts/heldout/train_tokens.py --steps 200
    .venv/bin/python scripts/bench_autotune.py --workloads train_tokens
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

from tuneup import tuned_loader, tuned_loop

VOCAB = 512
CONTEXT = 64
WIDTH = 128
LAYERS = 2
HEADS = 4
DEFAULT_BATCH = 64


def make_dataset(size: int = 4096, seed: int = 0) -> TensorDataset:
    """Sequences from a fixed random bigram chain: the next token is predictable in part."""
    generator = torch.Generator().manual_seed(seed)
    transitions = torch.softmax(3 * torch.randn(VOCAB, VOCAB, generator=generator), dim=1)
    tokens = torch.empty(size, CONTEXT + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(VOCAB, (size,), generator=generator)
    for position in range(1, CONTEXT + 1):
        tokens[:, position] = torch.multinomial(transitions[tokens[:, position - 1]], 1,
                                                generator=generator).squeeze(1)
    return TensorDataset(tokens)


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Parameter(torch.zeros(CONTEXT, WIDTH))
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, VOCAB)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(CONTEXT),
                             persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(tokens) + self.position[: tokens.shape[1]]
        length = tokens.shape[1]
        hidden = self.blocks(hidden, mask=self.causal[:length, :length], is_causal=True)
        return self.head(hidden)


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return TinyLM()


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=3e-4)


def compute_loss(model: nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
    (tokens,) = batch
    logits = model(tokens[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="training iterations (default 200)")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH,
                        help=f"sequences per optimizer step (default {DEFAULT_BATCH})")
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
          f"{step * args.batch_size / elapsed:.0f} sequences/s")


if __name__ == "__main__":
    main()
