"""Held-out workload for scripts/bench_autotune.py: keyword spotting on generated audio.
Every ``__getitem__`` turns a stored 16-bit clip into a log-mel spectrogram with torch ops
(gain and time-shift augmentation, background noise, STFT, mel filterbank, log, per-band
normalisation), and the model is a 1-D convolution feeding a GRU: input work done in torch
rather than NumPy or Python, and a recurrent model whose steps run one after another, a
shape the autotuner was not developed on. Same interface as docs/examples
(``make_dataset``, ``make_model``, ``make_optimizer``, ``compute_loss``, ``DEFAULT_BATCH``),
so the benchmark's grid runs the same work with plain PyTorch.

    python scripts/heldout/train_audio.py --steps 100
    .venv/bin/python scripts/bench_autotune.py --workloads train_audio
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from torch import nn
from torch.utils.data import Dataset

from tuneup import tuned_loader, tuned_loop

RATE = 16_000
CLIP = RATE  # one second a clip
N_FFT, HOP, MELS = 400, 160, 40
CLASSES = 12
UNIQUE = 1024  # distinct stored clips; larger datasets repeat them with their own augmentation
DEFAULT_BATCH = 64


def mel_filterbank(mels: int = MELS, n_fft: int = N_FFT, rate: int = RATE) -> torch.Tensor:
    """Triangular filters evenly spaced on the mel scale: ``(n_fft // 2 + 1, mels)``."""
    def to_mel(hz: torch.Tensor) -> torch.Tensor:
        return 2595.0 * torch.log10(1.0 + hz / 700.0)

    edges_mel = torch.linspace(0.0, float(to_mel(torch.tensor(rate / 2))), mels + 2)
    edges = 700.0 * (10 ** (edges_mel / 2595.0) - 1.0)
    bins = torch.linspace(0.0, rate / 2, n_fft // 2 + 1)[:, None]
    lower, centre, upper = edges[:-2], edges[1:-1], edges[2:]
    rising = (bins - lower) / (centre - lower)
    falling = (upper - bins) / (upper - centre)
    return torch.clamp(torch.minimum(rising, falling), min=0.0)


class SpokenKeywords(Dataset):
    """Clips whose class sets the pitch and rhythm of a few tone bursts, stored as int16 PCM."""

    def __init__(self, size: int = 4096, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        unique = min(size, UNIQUE)
        stored = torch.randint(0, CLASSES, (unique,), generator=generator)
        self.labels = stored.repeat(-(-size // unique))[:size]  # sample i is clip i % unique
        t = torch.arange(CLIP) / RATE
        labels = stored[:, None].float()
        pitch = 220.0 * 2 ** (labels / 4)  # three octaves over the classes
        rhythm = 2.0 + (labels % 4)  # bursts per second
        phase = torch.rand(unique, 1, generator=generator) * 2 * math.pi
        envelope = torch.relu(torch.sin(2 * math.pi * rhythm * t + phase)) ** 2
        wave = envelope * (torch.sin(2 * math.pi * pitch * t) + 0.3 * torch.sin(4 * math.pi * pitch * t))
        self.pcm = (wave * 12_000).to(torch.int16)
        self.window = torch.hann_window(N_FFT)
        self.filters = mel_filterbank()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        wave = self.pcm[index % len(self.pcm)].float() / 32768.0
        shift = int(torch.randint(-RATE // 10, RATE // 10 + 1, ()))
        wave = torch.roll(wave, shift) * float(torch.empty(()).uniform_(0.5, 1.5))
        wave = wave + 0.02 * torch.randn(CLIP)
        spectrum = torch.stft(wave, N_FFT, HOP, window=self.window, return_complex=True)
        power = spectrum.abs() ** 2  # (freq, frames)
        logmel = torch.log(self.filters.T @ power + 1e-6)  # (mels, frames)
        logmel = (logmel - logmel.mean(dim=1, keepdim=True)) / (logmel.std(dim=1, keepdim=True) + 1e-3)
        return logmel, self.labels[index]


def make_dataset(size: int = 4096, seed: int = 0) -> SpokenKeywords:
    return SpokenKeywords(size, seed)


class KeywordModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(MELS, 96, 5, stride=2, padding=2), nn.ReLU(),
                                  nn.Conv1d(96, 96, 3, padding=1), nn.ReLU())
        self.gru = nn.GRU(96, 128, batch_first=True)
        self.head = nn.Linear(128, CLASSES)

    def forward(self, logmel: torch.Tensor) -> torch.Tensor:
        features = self.conv(logmel).transpose(1, 2)  # (batch, frames, channels)
        _, hidden = self.gru(features)
        return self.head(hidden[-1])


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return KeywordModel()


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=2e-3)


def compute_loss(model: nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
    logmel, labels = batch
    return nn.functional.cross_entropy(model(logmel).float(), labels)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="training iterations (default 100)")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH,
                        help=f"clips per optimizer step (default {DEFAULT_BATCH})")
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
          f"{step * args.batch_size / elapsed:.0f} clips/s")


if __name__ == "__main__":
    main()
