"""Watch-acceptance job (b): lesion grades from MRI slices, one DataLoader worker where the
data needs more.

Each slice is stored as its k-space (the scanner's Fourier samples, 128x128 complex). Every
``__getitem__`` reconstructs it (inverse FFT, magnitude), bias-corrects it, deforms it
elastically (a smoothed random displacement field through ``grid_sample``), crops 96x96 at
random and applies a random gamma. ``num_workers=1`` and one torch thread, so one core
trains and one loads: the one worker cannot keep up with the model (expected: input-bound).

    python scripts/watch_jobs/mri_slices.py [--wrapped] [--steps 55]
"""

from __future__ import annotations


import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from common import parse_args, train

SIDE, CROP, GRADES = 128, 96, 4
UNIQUE = 128  # distinct stored slices, repeated with fresh augmentation


class Slices(Dataset):
    """Ellipses of tissue with a bright lesion whose size gives the grade, stored as k-space."""

    def __init__(self, size: int = 4096, seed: int = 2) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.grades = torch.randint(0, GRADES, (size,), generator=generator)
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, SIDE), torch.linspace(-1, 1, SIDE),
                                indexing="ij")
        images = []
        for grade in self.grades[:UNIQUE].tolist():
            cy, cx = (torch.rand(2, generator=generator) - 0.5).tolist()
            tissue = ((xs / 0.8) ** 2 + (ys / 0.9) ** 2 < 1).float()
            lesion = ((xs - cx * 0.6) ** 2 + (ys - cy * 0.6) ** 2 < (0.05 + 0.05 * grade) ** 2)
            noise = 0.05 * torch.randn(SIDE, SIDE, generator=generator)
            images.append(tissue * 0.5 + lesion.float() + noise)
        self.kspace = torch.fft.fft2(torch.stack(images))

    def __len__(self) -> int:
        return len(self.grades)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = torch.fft.ifft2(self.kspace[index % UNIQUE]).abs()
        image = image / (F.avg_pool2d(image[None, None], 31, 1, 15, count_include_pad=False)[0, 0]
                         + 0.1)  # bias-field correction
        image = elastic(image)
        top, left = (int(v) for v in torch.randint(0, SIDE - CROP + 1, (2,)))
        image = image[top:top + CROP, left:left + CROP].clamp(min=0)
        image = image ** float(torch.empty(()).uniform_(0.7, 1.4))
        return ((image - image.mean()) / (image.std() + 1e-3))[None], int(self.grades[index])


def elastic(image: torch.Tensor, strength: float = 0.04, passes: int = 6) -> torch.Tensor:
    """Deform ``image`` by a random displacement field smoothed by repeated 5x5 blurs."""
    field = torch.randn(1, 2, SIDE, SIDE)
    kernel = torch.full((2, 1, 5, 5), 1 / 25)
    for _ in range(passes):
        field = F.conv2d(field, kernel, padding=2, groups=2)
    field = field / (field.abs().amax() + 1e-6) * strength
    ys, xs = torch.meshgrid(torch.linspace(-1, 1, SIDE), torch.linspace(-1, 1, SIDE),
                            indexing="ij")
    grid = torch.stack([xs, ys], dim=-1)[None] + field.permute(0, 2, 3, 1)
    return F.grid_sample(image[None, None], grid, align_corners=True)[0, 0]


def make_model() -> nn.Module:
    torch.manual_seed(2)
    return nn.Sequential(
        nn.Conv2d(1, 16, 5, stride=2, padding=2), nn.GroupNorm(8, 16), nn.SiLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.GroupNorm(8, 32), nn.SiLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.GroupNorm(8, 64), nn.SiLU(),
        nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Dropout(0.1), nn.Linear(64, GRADES))


def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    images, grades = batch
    return F.cross_entropy(model(images), grades, label_smoothing=0.05)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=55, batch_size=32)
    torch.set_num_threads(1)  # the other core is the worker's
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9, nesterov=True)
    train(model, optimizer, Slices(), loss, args, num_workers=1)


if __name__ == "__main__":
    main()
