"""Samplers that count iterations, not epochs (minGPT's ``RandomSampler(replacement=True,
num_samples=int(1e10))``): nothing the wrappers do may cost memory or time in proportion
to the sampler's length, with settings or without (``TUNEUP_DISABLE=1``)."""

from __future__ import annotations

import itertools
import time
import tracemalloc
from collections.abc import Iterator

import pytest
import torch
from runtime_helpers import make_dataset, make_model
from torch.utils.data import RandomSampler, Sampler

from tuneup import tuned_loader, tuned_loop

HUGE = 10**12
# far below a list of 10**12 / 8 batch sizes; a few batches of 8 x 8 floats and the iterator
MEMORY_LIMIT = 2 * 2**20
TIME_LIMIT_S = 1.0


class HugeLenSampler(Sampler[int]):
    """A sampler of one's own whose ``__len__`` is as long as the run may ever be."""

    def __init__(self, size: int, length: int) -> None:
        self.size, self.length = size, length

    def __iter__(self) -> Iterator[int]:
        return (i % self.size for i in itertools.count())

    def __len__(self) -> int:
        return self.length


class CountingSampler(Sampler[int]):
    """An endless sampler with no ``__len__`` at all."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __iter__(self) -> Iterator[int]:
        return (i % self.size for i in itertools.count())


def samplers(size: int) -> dict[str, Sampler[int]]:
    return {"random-with-replacement": RandomSampler(range(size), replacement=True,
                                                     num_samples=HUGE),
            "huge-len": HugeLenSampler(size, HUGE),
            "beyond-ssize-t": HugeLenSampler(size, 10**30),
            "no-len": CountingSampler(size)}


@pytest.mark.parametrize("kind", ["random-with-replacement", "huge-len", "beyond-ssize-t",
                                  "no-len"])
@pytest.mark.parametrize("setup", ["settings", "disabled"])
def test_iter_and_first_next_cost_nothing_in_the_samplers_length(
        kind, setup, write_settings, monkeypatch):
    if setup == "settings":
        write_settings(micro_batch_size=4, cpu_threads=1)
    else:
        monkeypatch.setenv("TUNEUP_DISABLE", "1")
    dataset = make_dataset()
    model = make_model()
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
    loader = tuned_loader(dataset, batch_size=8, sampler=samplers(len(dataset))[kind],
                          drop_last=True, loop=loop)
    tracemalloc.start()
    started = time.perf_counter()
    try:
        iterator = iter(loader)
        batches = [next(iterator) for _ in range(3)]
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < TIME_LIMIT_S and peak < MEMORY_LIMIT, (elapsed, peak)
    assert [len(x) for x, _ in batches] == [8, 8, 8]
    # the latest batch is still trained (and split, with the settings' micro-batch)
    loss = loop.train_step(batches[-1], lambda b: torch.nn.functional.cross_entropy(
        loop.model(b[0]), b[1]))
    assert torch.isfinite(loss)
    assert loop.applied_micro_batch == (4 if setup == "settings" else None)


def test_the_counts_of_a_finite_epoch_are_unchanged(write_settings):
    """Lazily computed, the expected counts still end with the short last batch."""
    write_settings(micro_batch_size=4, cpu_threads=1)
    loader = tuned_loader(make_dataset(size=21), batch_size=8)
    assert list(loader._expected_counts()) == [8, 8, 5]
    dropped = tuned_loader(make_dataset(size=21), batch_size=8, drop_last=True)
    assert list(dropped._expected_counts()) == [8, 8]
