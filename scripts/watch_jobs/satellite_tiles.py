"""Watch-acceptance job (a): land-cover classes from 4-band satellite tiles, ``num_workers=0``.

Each tile is stored zlib-compressed (uint8 red, green, blue, near-infrared, 72x72). Every
``__getitem__`` decompresses it, despeckles it with a 5x5 median filter, rotates it by a random
angle, crops 48x48 at random, adds the NDVI band and normalises: per-sample work in the main
process, so the model waits for its data most of the time (expected: input-bound).

    python scripts/watch_jobs/satellite_tiles.py [--wrapped] [--steps 50]
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from common import parse_args, train

SIDE, CROP, BANDS, CLASSES = 72, 48, 4, 7
UNIQUE = 256  # distinct stored tiles; the dataset repeats them with fresh augmentation


class Tiles(Dataset):
    """Smooth random fields whose band mix and texture frequency give the class."""

    def __init__(self, size: int = 4096, seed: int = 1) -> None:
        rng = np.random.default_rng(seed)
        self.labels = rng.integers(0, CLASSES, size)
        ys, xs = np.mgrid[0:SIDE, 0:SIDE].astype(np.float32) / SIDE
        self.stored = []
        for label in self.labels[:UNIQUE]:
            texture = np.sin((xs + rng.uniform()) * (3 + label) * math.pi) * np.cos(ys * 5)
            mix = rng.uniform(0.3, 1.0, (BANDS, 1, 1)) * (1 + label / CLASSES)
            bands = 100 + 60 * texture * mix + rng.normal(0, 15, (BANDS, SIDE, SIDE))
            self.stored.append(zlib.compress(np.clip(bands, 0, 255).astype(np.uint8).tobytes()))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        raw = zlib.decompress(self.stored[index % UNIQUE])
        tile = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(BANDS, SIDE, SIDE)
        tile = median5(tile.float())
        tile = rotate(tile, float(torch.empty(()).uniform_(-math.pi, math.pi)))
        top, left = (int(v) for v in torch.randint(0, SIDE - CROP + 1, (2,)))
        tile = tile[:, top:top + CROP, left:left + CROP]
        red, nir = tile[0], tile[3]
        ndvi = (nir - red) / (nir + red + 1e-3)
        tile = torch.cat([tile, ndvi[None]])
        mean, std = tile.mean(dim=(1, 2), keepdim=True), tile.std(dim=(1, 2), keepdim=True)
        return (tile - mean) / (std + 1e-3), int(self.labels[index])


def median5(bands: torch.Tensor) -> torch.Tensor:
    """A 5x5 median filter per band (despeckling)."""
    padded = F.pad(bands[None], (2, 2, 2, 2), mode="reflect")
    patches = F.unfold(padded, 5).view(bands.shape[0], 25, SIDE, SIDE)
    return patches.median(dim=1).values


def rotate(bands: torch.Tensor, angle: float) -> torch.Tensor:
    cos, sin = math.cos(angle), math.sin(angle)
    theta = torch.tensor([[[cos, -sin, 0.0], [sin, cos, 0.0]]])
    grid = F.affine_grid(theta, [1, *bands.shape], align_corners=False)
    return F.grid_sample(bands[None], grid, mode="bilinear", padding_mode="reflection",
                         align_corners=False)[0]


def make_model() -> nn.Module:
    torch.manual_seed(1)

    def block(inputs: int, outputs: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(inputs, outputs, 3, padding=1), nn.BatchNorm2d(outputs),
                             nn.ReLU(), nn.MaxPool2d(2))
    return nn.Sequential(block(BANDS + 1, 24), block(24, 48), block(48, 96),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(96, CLASSES))


def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    tiles, labels = batch
    return F.cross_entropy(model(tiles), labels)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=50, batch_size=48)
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    train(model, optimizer, Tiles(), loss, args, num_workers=0)


if __name__ == "__main__":
    main()
