"""Watch-acceptance job (d): activity recognition from 9-axis IMU windows, with more threads
than cores.

Windows are stored as recorded, at 800 Hz. Each ``__getitem__`` low-passes one through a
257-tap FIR filter and keeps every 8th sample (100 Hz, 512 samples), band-passes it through
the FFT, time-warps it (a random resampling), rotates the three sensor triads by one random
rotation and standardises it; a 1-D CNN with dilated convolutions classifies it. The script asks for
``torch.set_num_threads(2)`` and ``num_workers=2``: two compute threads in the training
process and two busy workers, four busy threads on a 2-core machine (expected:
cpu-oversubscribed).

    python scripts/watch_jobs/sensor_windows.py [--wrapped] [--steps 80]
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from common import parse_args, train

AXES, WINDOW, ACTIVITIES = 9, 512, 6
RATE_HZ, LOW_HZ, HIGH_HZ = 100.0, 0.3, 20.0
DECIMATE, TAPS = 8, 257  # recorded at 800 Hz
UNIQUE = 128


def low_pass(taps: int = TAPS, cutoff: float = 0.5 / DECIMATE) -> torch.Tensor:
    """A Hann-windowed sinc anti-aliasing filter, one copy per axis: ``(AXES, 1, taps)``."""
    n = torch.arange(taps) - taps // 2
    kernel = 2 * cutoff * torch.sinc(2 * cutoff * n) * torch.hann_window(taps, periodic=False)
    return (kernel / kernel.sum()).expand(AXES, 1, taps).contiguous()


class Windows(Dataset):
    """Sums of sines whose frequencies and axis weights give the activity, plus noise."""

    def __init__(self, size: int = 8192, seed: int = 4) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.activities = torch.randint(0, ACTIVITIES, (size,), generator=generator)
        t = torch.arange(WINDOW * DECIMATE) / (RATE_HZ * DECIMATE)
        base = 0.5 + self.activities[:UNIQUE, None, None].float()  # Hz
        weights = torch.rand(UNIQUE, AXES, 1, generator=generator)
        phase = torch.rand(UNIQUE, AXES, 1, generator=generator) * 2 * math.pi
        self.stored = (weights * torch.sin(2 * math.pi * base * t + phase)
                       + 0.3 * torch.randn(UNIQUE, AXES, WINDOW * DECIMATE, generator=generator))
        self.fir = low_pass()
        frequencies = torch.fft.rfftfreq(WINDOW, 1 / RATE_HZ)
        self.band = ((frequencies >= LOW_HZ) & (frequencies <= HIGH_HZ)).float()

    def __len__(self) -> int:
        return len(self.activities)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        recorded = self.stored[index % UNIQUE][None]
        window = F.conv1d(recorded, self.fir, padding=TAPS // 2, groups=AXES)[0, :, ::DECIMATE]
        window = torch.fft.irfft(torch.fft.rfft(window) * self.band, n=WINDOW)
        window = warp(window, float(torch.empty(()).uniform_(0.8, 1.25)))
        rotation = random_rotation()
        window = torch.cat([rotation @ window[i:i + 3] for i in range(0, AXES, 3)])
        window = window + 0.02 * torch.randn_like(window)
        mean, std = window.mean(dim=1, keepdim=True), window.std(dim=1, keepdim=True)
        return (window - mean) / (std + 1e-4), int(self.activities[index])


def warp(window: torch.Tensor, speed: float) -> torch.Tensor:
    """Play the window at ``speed``, then back to its length (a tempo change)."""
    stretched = F.interpolate(window[None], scale_factor=speed, mode="linear",
                              align_corners=False)
    return F.interpolate(stretched, size=WINDOW, mode="linear", align_corners=False)[0]


def random_rotation() -> torch.Tensor:
    """A uniformly random 3-D rotation (QR of a Gaussian matrix, signs fixed)."""
    q, r = torch.linalg.qr(torch.randn(3, 3))
    q = q * torch.sign(torch.diagonal(r))
    return q if torch.det(q) > 0 else -q


def make_model() -> nn.Module:
    torch.manual_seed(4)
    layers: list[nn.Module] = [nn.Conv1d(AXES, 96, 7, padding=3), nn.ReLU()]
    for dilation in (1, 2, 4, 8):
        layers += [nn.Conv1d(96, 96, 5, padding=2 * dilation, dilation=dilation),
                   nn.BatchNorm1d(96), nn.ReLU()]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(96, ACTIVITIES))


def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    windows, activities = batch
    return F.cross_entropy(model(windows), activities)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=80, batch_size=32)
    torch.set_num_threads(2)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    train(model, optimizer, Windows(), loss, args, num_workers=2)


if __name__ == "__main__":
    main()
