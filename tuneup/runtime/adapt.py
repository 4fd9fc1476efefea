"""Online adaptation (``tuned_loop(..., adapt=True)``): more loading where the loop waits.

An observer of the runtime like any other (see :mod:`tuneup.runtime.hooks`): it times each
epoch of a loader's batches, and when the loop waited for data more than
:data:`STALL_SHARE` of that epoch, the next epoch gets one more DataLoader worker (up to the
cores this process may use), then a deeper prefetch. Changes happen only between epochs,
each is said once, and none touches which samples come in which batch or order: the sampler,
its generator and the batches are the DataLoader's as before; only who loads them changes.
So no worker is added to an IterableDataset (workers split its stream and regroup its
batches), nor where the shuffle is seeded from torch's global generator and loading draws
from it too (see :meth:`TunedLoader.fixed_reasons`). What does change is said: random draws
made while loading come from PyTorch's per-worker seeds once there are workers.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ContextManager

from torch.utils.data import IterableDataset

from tuneup.runtime import apply, hooks
from tuneup.runtime.loader import LoaderPass
from tuneup.settings import store

if TYPE_CHECKING:
    from tuneup.runtime.loader import TunedLoader
    from tuneup.runtime.loop import TunedLoop

STALL_SHARE = 0.2  # an epoch that waited for data longer than this share gets more loading
MIN_EPOCH_S = 0.05  # shorter epochs say nothing about the loader
MAX_ADAPTED_PREFETCH = 16
DEFAULT_PREFETCH = 2  # PyTorch's, per worker


class Adaptation(hooks.Observer):
    """Raises ``num_workers``, then ``prefetch_factor``, on the loaders whose batches ``loop``
    trains on, epoch by epoch while the input stall stays high."""

    def __init__(self, loop: TunedLoop) -> None:
        self.loop = weakref.ref(loop)  # the adaptation ends with its loop
        self.trained: weakref.WeakSet[TunedLoader] = weakref.WeakSet()
        self.pending: TunedLoader | None = None  # the loader whose batch the script holds
        self.settled: weakref.WeakSet[TunedLoader] = weakref.WeakSet()  # nothing more to add

    def batches(self, loader: TunedLoader, source: Iterator[Any]) -> Iterator[Any]:
        if isinstance(source, LoaderPass):
            source.start()  # the DataLoader's seeds are drawn at iter(), as without tuneup
        if (self.loop() is None or loader in self.settled
                or "num_workers" in loader.user_kwargs
                or isinstance(loader.dataset, IterableDataset)):
            return source
        return self._timed_epoch(loader, source)

    def guard(self, loop: TunedLoop) -> ContextManager[Any]:
        if loop is self.loop() and self.pending is not None:
            self.trained.add(self.pending)  # a training loader, not an eval one
        return contextlib.nullcontext()

    def _timed_epoch(self, loader: TunedLoader, source: Iterator[Any]) -> Iterator[Any]:
        telemetry = loader.telemetry
        started, waited = time.perf_counter(), telemetry.data_wait_s
        for batch in source:
            self.pending = loader
            yield batch
            self.pending = None
        elapsed = time.perf_counter() - started
        if elapsed >= MIN_EPOCH_S and loader in self.trained:
            self._after_epoch(loader, (telemetry.data_wait_s - waited) / elapsed)

    def _after_epoch(self, loader: TunedLoader, stall: float) -> None:
        if stall <= STALL_SHARE:
            return
        workers = loader.dataloader.num_workers
        prefetch = loader.dataloader.prefetch_factor or DEFAULT_PREFETCH
        cap = apply.rank_cores()
        waited = f"adapt: waited for data {stall:.0%} of the last epoch"
        if workers < cap and "num_workers" in loader.fixed_reasons:
            self.settled.add(loader)
            store.warn(f"{waited}, but num_workers stays {workers}: "
                       f"{loader.fixed_reasons['num_workers']}")
            return
        if workers < cap:
            name, before, value = "num_workers", workers, max(1, min(cap, workers * 2))
        elif prefetch < MAX_ADAPTED_PREFETCH and "prefetch_factor" not in loader.fixed_reasons:
            name, before, value = "prefetch_factor", prefetch, prefetch * 2
        else:
            return
        same = "same batches, same order"
        if name == "num_workers":
            same += "; random draws made while loading come from PyTorch's per-worker seeds"
        store.warn(f"{waited}: {name} {before} -> {value} from the next epoch ({same})")
        loader.configure(loader.knobs.replace(**{name: value}))


def install(loop: TunedLoop) -> Adaptation:
    """Install the adaptation for ``loop``'s loaders; it stays for the process's life."""
    adaptation = Adaptation(loop)
    hooks.install(adaptation)
    return adaptation
