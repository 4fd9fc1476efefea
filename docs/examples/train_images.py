"""Input-bound example: a small CNN on generated "compressed" images decoded per sample.

Every ``__getitem__`` does CPU work the way an image pipeline does: de-quantise 8x8 DCT
blocks, inverse DCT, YCbCr -> RGB, random crop, flip and brightness jitter, normalise.
With ``num_workers=0`` the model waits for the decoder most of the time, on the GPU where
there is one (``--device cpu`` to stay on the CPU) all the more.

    python docs/examples/train_images.py --steps 100 --batch-size 128
    tuneup autotune docs/examples/train_images.py -- --batch-size 128

The workload pieces (``make_dataset``, ``make_model``, ``make_optimizer``, ``compute_loss``)
are importable so that benchmarks can run the same work with plain PyTorch code.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from tuneup import tuned_loader, tuned_loop

SIZE = 128  # stored image side (decoded, then halved)
CROP = 56  # side after the random crop of the halved image
UNIQUE = 512  # distinct stored images; larger datasets repeat them with their own labels
BLOCK = 8
CLASSES = 10
DEFAULT_BATCH = 128


def _dct_matrix(n: int = BLOCK) -> np.ndarray:
    """Orthonormal DCT-II basis: ``coefficients = D @ block @ D.T``."""
    k = np.arange(n)[:, None]
    basis = np.cos(math.pi * (2 * np.arange(n)[None, :] + 1) * k / (2 * n)) * math.sqrt(2 / n)
    basis[0] /= math.sqrt(2)
    return basis.astype(np.float32)


DCT = _dct_matrix()
QUANT = (1.0 + np.add.outer(np.arange(BLOCK), np.arange(BLOCK))).astype(np.float32) * 2.0
YCBCR_TO_RGB = np.array([[1.0, 0.0, 1.402], [1.0, -0.344136, -0.714136], [1.0, 1.772, 0.0]],
                        dtype=np.float32)


class CompressedImages(Dataset):
    """Striped images whose stripe angle is the class, stored as quantised DCT blocks.

    Samples beyond the first ``UNIQUE`` repeat stored images (with fresh augmentation).
    """

    def __init__(self, size: int = 2048, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        unique = min(size, UNIQUE)
        self.labels = np.resize(rng.integers(0, CLASSES, unique), size)
        ys, xs = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
        angle = (self.labels[:unique, None, None] * math.pi / CLASSES).astype(np.float32)
        phase = rng.uniform(0, 2 * math.pi, (unique, 1, 1)).astype(np.float32)
        stripes = np.sin((xs * np.cos(angle) + ys * np.sin(angle)) * 0.4 + phase)
        luma = 60 * stripes + rng.standard_normal((unique, SIZE, SIZE), np.float32) * 12
        chroma = rng.normal(0, 20, (unique, 2, 1, 1)).astype(np.float32)
        ycbcr = np.concatenate(
            [luma[:, None], np.broadcast_to(chroma, (unique, 2, SIZE, SIZE))], axis=1)
        blocks = ycbcr.reshape(unique, 3, SIZE // BLOCK, BLOCK, SIZE // BLOCK, BLOCK)
        blocks = blocks.transpose(0, 1, 2, 4, 3, 5)  # (n, channel, by, bx, 8, 8), centred on 0
        self.coefficients = np.round(DCT @ blocks @ DCT.T / QUANT).astype(np.int16)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        coefficients = self.coefficients[index % len(self.coefficients)].astype(np.float32)
        blocks = DCT.T @ (coefficients * QUANT) @ DCT
        ycbcr = blocks.transpose(0, 1, 3, 2, 4).reshape(3, SIZE, SIZE)
        rgb = np.tensordot(YCBCR_TO_RGB, ycbcr, axes=1) + 128
        rgb = rgb.reshape(3, SIZE // 2, 2, SIZE // 2, 2).mean(axis=(2, 4))
        top, left = (int(v) for v in torch.randint(0, SIZE // 2 - CROP + 1, (2,)))
        crop = rgb[:, top:top + CROP, left:left + CROP]
        if torch.rand(()) < 0.5:
            crop = crop[:, :, ::-1]
        crop = np.clip(crop * float(torch.empty(()).uniform_(0.8, 1.2)), 0, 255)
        mean, std = crop.mean(axis=(1, 2), keepdims=True), crop.std(axis=(1, 2), keepdims=True)
        image = (crop - mean) / (std + 1e-3)
        pixels = torch.from_numpy(np.ascontiguousarray(image, dtype=np.float32))
        return pixels, int(self.labels[index])


def make_dataset(size: int = 2048, seed: int = 0) -> CompressedImages:
    return CompressedImages(size, seed)


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, CLASSES),
    )


def default_device() -> str:
    """The GPU where there is one: what a user with a GPU trains on."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    images, labels = batch
    return nn.functional.cross_entropy(model(images), labels)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150, help="training iterations (default 150)")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH,
                        help=f"samples per optimizer step (default {DEFAULT_BATCH})")
    parser.add_argument("--device", default=default_device(),
                        help="where to train (default: cuda when there is a GPU, else cpu)")
    parser.add_argument("--dataset-size", type=int, default=2048)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1:
        parser.error("--steps and --batch-size must be positive")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model = make_model().to(args.device)
    optimizer = make_optimizer(model)
    loop = tuned_loop(model, optimizer)  # the loader hands it batches on the model's device
    # The crops draw from torch's global generator; a shuffle with its own generator keeps the
    # sample order whatever the number of workers (without one, tuneup adds no workers).
    loader = tuned_loader(make_dataset(args.dataset_size), batch_size=args.batch_size,
                          shuffle=True, drop_last=True, loop=loop,
                          generator=torch.Generator().manual_seed(0))
    step, samples, started = 0, 0, time.perf_counter()
    while step < args.steps:
        for images, labels in loader:
            loss = loop.train_step((images, labels), lambda batch: compute_loss(loop.model, batch))
            step += 1
            samples += len(labels)
            if step >= args.steps:
                break
    elapsed = time.perf_counter() - started
    print(f"{step} iterations, loss {loss.item():.4f}, {samples / elapsed:.0f} samples/s")


if __name__ == "__main__":
    main()
