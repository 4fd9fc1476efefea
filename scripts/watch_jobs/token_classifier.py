"""Watch-acceptance job (c): a small transformer encoder classifying pre-tokenised sequences.

The tokens are generated once and held in memory (a ``TensorDataset``): a batch costs an
index and a stack, while the model (``nn.TransformerEncoder``, 3 layers of width 96 over 80
tokens) does all the work (expected: compute-bound).

    python scripts/watch_jobs/token_classifier.py [--wrapped] [--steps 110]
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from common import parse_args, train

VOCAB, LENGTH, WIDTH, HEADS, LAYERS, TOPICS = 2000, 80, 96, 6, 3, 5


def make_dataset(size: int = 6144, seed: int = 3) -> TensorDataset:
    """Each topic draws its tokens from its own slice of the vocabulary, mixed with noise."""
    generator = torch.Generator().manual_seed(seed)
    topics = torch.randint(0, TOPICS, (size,), generator=generator)
    own = topics[:, None] * (VOCAB // TOPICS) + torch.randint(
        0, VOCAB // TOPICS, (size, LENGTH), generator=generator)
    noise = torch.randint(0, VOCAB, (size, LENGTH), generator=generator)
    mixed = torch.where(torch.rand(size, LENGTH, generator=generator) < 0.3, own, noise)
    return TensorDataset(mixed, topics)


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Parameter(torch.randn(LENGTH, WIDTH) * 0.02)
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 3 * WIDTH, dropout=0.1,
                                           activation="gelu", batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, TOPICS)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.blocks(self.embed(tokens) + self.position)
        return self.head(hidden.mean(dim=1))


def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    tokens, topics = batch
    return F.cross_entropy(model(tokens), topics)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=110, batch_size=64)
    torch.manual_seed(3)
    model = Encoder()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.01)
    train(model, optimizer, make_dataset(), loss, args, num_workers=0)


if __name__ == "__main__":
    main()
