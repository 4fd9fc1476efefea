"""Tiny workloads and comparisons shared by the runtime tests."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset


def make_dataset(size: int = 96, features: int = 8, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(size, features, generator=generator)
    return TensorDataset(x, (x[:, 0] > 0).long())


def make_model(features: int = 8, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(features, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 2))


def parameters(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def assert_close_parameters(a: list[torch.Tensor], b: list[torch.Tensor], atol: float = 1e-6) -> None:
    assert len(a) == len(b)
    for left, right in zip(a, b):
        torch.testing.assert_close(left, right, atol=atol, rtol=1e-5)
