"""``tuned_loader``: a DataLoader with the tuned loader knobs that feeds micro-batches to a loop."""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from tuneup.runtime import apply
from tuneup.runtime.batches import UnsplittableBatch, batch_size_of, move_to, split_batch
from tuneup.runtime.loop import TunedLoop
from tuneup.runtime.telemetry import Stats, Telemetry
from tuneup.settings import Knobs, store

_DATALOADER_SIGNATURE = inspect.signature(DataLoader.__init__)


class TunedLoader:
    """Iterable like the DataLoader it wraps (``loader.dataloader``); unknown attributes
    (``dataset``, ``sampler``, ``batch_size``, ...) are the DataLoader's."""

    def __init__(self, dataset: Any, user_kwargs: dict[str, Any], *, knobs: Knobs,
                 loop: TunedLoop | None) -> None:
        self.dataset = dataset
        self.loop = loop
        self.user_kwargs = user_kwargs
        self.telemetry = loop.telemetry if loop is not None else Telemetry()
        self._unsplittable = False
        self.configure(knobs)

    def configure(self, knobs: Knobs) -> None:
        """(Re)build the inner DataLoader for ``knobs``; the user's own keywords win."""
        self.knobs = knobs
        self.dataloader = DataLoader(self.dataset, **self.dataloader_kwargs(knobs))
        device = self.loop.device if self.loop is not None else None
        self._device = device if device is not None and device.type != "cpu" else None
        self._non_blocking = bool(self.dataloader.pin_memory)

    def dataloader_kwargs(self, knobs: Knobs) -> dict[str, Any]:
        """The DataLoader keywords for ``knobs``: tuned values only where the user gave none."""
        tuned = {k: v for k, v in knobs.loader_kwargs().items() if k not in self.user_kwargs}
        pinning_helps = torch.cuda.is_available() and (
            self.loop is None or self.loop.device.type == "cuda")
        if not pinning_helps:
            tuned.pop("pin_memory", None)
        workers = self.user_kwargs.get("num_workers", tuned.get("num_workers", 0))
        if not workers:
            tuned.pop("prefetch_factor", None)
            tuned.pop("persistent_workers", None)
        return {**tuned, **self.user_kwargs}

    @property
    def micro_batch_size(self) -> int | None:
        """Samples per yielded micro-batch, or None when batches are yielded whole."""
        if self.loop is None or self._unsplittable or self.dataloader.batch_sampler is None:
            return None
        return self.loop.micro_batch_size

    def __iter__(self) -> Iterator[Any]:
        probe = self.loop._probe if self.loop is not None else None
        return probe.iterate(self) if probe is not None else self._iterate()

    def _iterate(self) -> Iterator[Any]:
        """The inner DataLoader's batches (as micro-batches when linked), timed."""
        telemetry = self.telemetry
        clock = time.perf_counter
        batches = iter(self.dataloader)
        micro = self.micro_batch_size
        while True:
            started = clock()
            if telemetry.started is None:
                telemetry.started = started
            telemetry.latest = started
            try:
                batch = next(batches)
            except StopIteration:
                return
            telemetry.data_wait_s += clock() - started
            if self.loop is None:
                telemetry.samples += self.samples_in(batch)
                telemetry.steps += 1
                yield batch
            else:
                yield from self.micro_batches(batch, micro)

    def samples_in(self, batch: Any) -> int:
        """Samples in one batch from the inner DataLoader."""
        if self.dataloader.batch_sampler is None:  # no automatic batching: one sample
            return 1
        return batch_size_of(batch) or 1

    def micro_batches(self, batch: Any, micro: int | None) -> Iterator[Any]:
        """Move ``batch`` to the loop's device and yield it in micro-batches of ``micro``,
        telling the loop each one's share of the samples and where the step boundary is."""
        loop = self.loop
        total = self.samples_in(batch)
        self.telemetry.samples += total
        if self._device is not None:
            batch = move_to(batch, self._device, self._non_blocking)
        parts = None
        if micro is not None and micro < total and not self._unsplittable:
            try:
                parts = split_batch(batch, micro)
            except UnsplittableBatch as exc:
                self._unsplittable = True
                store.warn(f"cannot split this batch into micro-batches of {micro} ({exc}); "
                           f"training on whole batches without accumulation")
        if parts is None:
            loop._share, loop._boundary, loop._split = 1.0, True, False
            yield batch
            return
        loop._split = True
        last = len(parts) - 1
        for index, part in enumerate(parts):
            loop._share = min(micro, total - index * micro) / total
            loop._boundary = index == last
            yield part

    def __len__(self) -> int:
        micro = self.micro_batch_size
        if micro is None:
            return len(self.dataloader)
        batches = self.dataloader.batch_sampler
        if not isinstance(batches, BatchSampler):
            raise TypeError("len() of a tuned_loader is unknown: its batch_sampler's "
                            "batches are split into micro-batches")
        size = len(self.dataset) if isinstance(self.dataset, IterableDataset) else len(batches.sampler)
        full, rest = divmod(size, batches.batch_size)
        count = full * -(-batches.batch_size // micro)
        if rest and not batches.drop_last:
            count += -(-rest // micro)
        return count

    def __getattr__(self, name: str) -> Any:
        if name == "dataloader":  # not built yet: avoid recursing
            raise AttributeError(name)
        return getattr(self.dataloader, name)

    def stats(self) -> Stats:
        """Input-stall share, samples/s and steps (the loop's, when linked to one)."""
        return self.telemetry.stats()


def tuned_loader(dataset: Any, *args: Any, loop: TunedLoop | None = None,
                 **kwargs: Any) -> TunedLoader:
    """A DataLoader over ``dataset`` (same arguments) with the tuned loader knobs.

    Alone, only ``num_workers``, ``pin_memory``, ``prefetch_factor`` and
    ``persistent_workers`` are tuned, and only those the caller did not pass. With
    ``loop=``, ``batch_size`` is the effective batch of each optimizer step: batches are
    split into the tuned micro-batches and arrive on ``loop.device``.
    """
    bound = _DATALOADER_SIGNATURE.bind(None, dataset, *args, **kwargs)
    user_kwargs = {k: v for k, v in bound.arguments.items() if k not in ("self", "dataset")}
    if loop is not None:
        knobs = loop.knobs
    elif _probing():
        knobs = Knobs()
    else:
        knobs = apply.settings_knobs()
    return TunedLoader(dataset, user_kwargs, knobs=knobs, loop=loop)


def _probing() -> bool:
    from tuneup.autotune import child

    return child.driver() is not None
