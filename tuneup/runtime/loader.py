"""``tuned_loader``: a DataLoader with the tuned loader knobs, timed, yielding the user's batches.

A ``TunedLoader`` is a ``DataLoader`` to libraries that check (``accelerator.prepare`` shards
it as one: :mod:`tuneup.integrations.accelerate`), though it wraps one and rebuilds it when
autotune switches knobs.

It never changes which samples a batch holds or how many batches there are: ``len()`` and
the batches are the inner DataLoader's. Micro-batching happens in the loop
(:meth:`TunedLoop.train_step`); the loader only notes how many samples each batch should
hold, so the loop can tell the sample dimension from a sequence-first one.

``iter(loader)`` makes the DataLoader's iterator at once, as ``iter(DataLoader)`` does, so
its seed draws from torch's global generator happen when they would without tuneup. Workers
are not added where they would change the sample order: a shuffle seeded from the global
generator over a dataset whose loading draws from that generator too (with ``num_workers=0``
those draws move the next epoch's seed; in workers they do not).
"""

from __future__ import annotations

import inspect
import itertools
import random
import sys
import time
import types
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import (BatchSampler, DataLoader, IterableDataset, RandomSampler,
                              SubsetRandomSampler, WeightedRandomSampler, default_collate,
                              default_convert)

from tuneup.after_import import after_import
from tuneup.runtime import apply, distributed, hooks
from tuneup.runtime.batches import batch_size_of, move_to, note_expected
from tuneup.runtime.telemetry import Stats, Telemetry
from tuneup.settings import Knobs, store

if TYPE_CHECKING:
    from tuneup.runtime.loop import TunedLoop

_DATALOADER_SIGNATURE = inspect.signature(DataLoader.__init__)
_WORKER_ONLY = ("prefetch_factor", "persistent_workers")
# torch's samplers that, without a generator of their own, seed each pass from the global one
_GLOBALLY_SEEDED = (RandomSampler, SubsetRandomSampler, WeightedRandomSampler)
# the keywords that decide which samples each batch holds (a batch sampler replaces them)
_SAMPLING = ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last")
_accelerate_watched = False  # whether accelerate's prepare is served (or will be, once imported)


class TunedLoader(DataLoader):
    """Iterable like the DataLoader it wraps (``loader.dataloader``); unknown attributes
    (``sampler``, ``batch_size``, ...) are the DataLoader's. Made by :func:`tuned_loader`.

    A ``DataLoader`` subclass so that ``isinstance`` checks (accelerate's ``prepare``) take
    it for one, built from ``tuned_loader``'s arguments (DataLoader's) so that a library
    that rebuilds a DataLoader from its class and attributes (Lightning injecting a
    sampler) builds a tuned one; ``DataLoader.__init__`` is never run: the inner one is."""

    def __init__(self, dataset: Any, *args: Any, loop: TunedLoop | None = None,
                 splits_by_worker: bool | None = None, **kwargs: Any) -> None:
        _serve_accelerate()
        bound = _DATALOADER_SIGNATURE.bind(None, dataset, *args, **kwargs)
        user_kwargs = {k: v for k, v in bound.arguments.items() if k not in ("self", "dataset")}
        hooks.install_from_environment()
        observers = hooks.current()
        knobs = apply.settings_knobs() if loop is None else loop.knobs
        if observers is not hooks.NOBODY and loop is None:
            knobs = observers.initial_knobs(knobs)
        self.dataset = dataset
        self.loop = loop
        self.splits_by_worker = splits_by_worker
        self.user_kwargs = user_kwargs
        # under a process group without a sampler of the user's: this rank's share
        self.distributed_sampler = distributed.sampler_for(dataset, user_kwargs)
        self.telemetry = loop.telemetry if loop is not None else Telemetry()
        self._reasons = self._known_reasons(splits_by_worker)
        self._order_checked = False
        self._prepare: Callable[[DataLoader], Any] | None = None  # accelerate's, once prepared
        self._plain: DataLoader | None = None  # the DataLoader it prepared: its sampling is kept
        self.configure(knobs)
        # the keywords given, as attributes (the inner DataLoader has the same values): what
        # a library rebuilding the loader reads; the context is a property checking workers
        for name, value in user_kwargs.items():
            if name != "multiprocessing_context":
                setattr(self, name, value)
        if observers is not hooks.NOBODY:
            observers.loader_created(self)

    @property
    def fixed_reasons(self) -> dict[str, str]:
        """Knobs that must not be tuned for this loader, each with the reason. Whether workers
        would change the sample order is checked on first use (it loads one sample), so a
        loader nobody tunes never loads more than the DataLoader does."""
        if not self._order_checked:
            self._order_checked = True
            reason = self._order_reason()
            if reason is not None:
                self._reasons["num_workers"] = reason
        return self._reasons

    def _known_reasons(self, splits_by_worker: bool | None) -> dict[str, str]:
        """The reasons known from the arguments alone, without loading a sample."""
        reasons = {name: "passed explicitly to tuned_loader" for name in Knobs.LOADER
                   if name in self.user_kwargs}
        if "num_workers" not in reasons and isinstance(self.dataset, IterableDataset):
            if not (splits_by_worker if splits_by_worker is not None
                    else _reads_worker_info(type(self.dataset))):
                reasons["num_workers"] = (
                    f"{type(self.dataset).__name__} is an IterableDataset that does not split its "
                    "stream by worker (every worker would yield every sample); pass "
                    "splits_by_worker=True to tuned_loader if it does")
        return reasons

    def _order_reason(self) -> str | None:
        """Why workers would change the sample order, if they would: the shuffle is seeded
        from torch's global generator at each pass and loading a sample draws from it too."""
        if "num_workers" in self._reasons or not self._seeded_globally():
            return None
        name = type(self.dataset).__name__
        try:
            draws = self._loading_draws_from_torch()
        except Exception as exc:  # noqa: BLE001 - the user's dataset; training must run
            return (f"loading sample 0 of {name} to check whether it draws random numbers "
                    f"failed ({apply.one_line(exc)}), and the shuffle is seeded from torch's "
                    "global generator; pass generator= to tuned_loader to allow workers")
        if not draws:
            return None
        return (f"loading a sample of {name} draws from torch's global random generator, "
                "which with num_workers=0 also seeds the next epoch's shuffle: workers would "
                "change the sample order from the second epoch on; pass "
                "generator=torch.Generator().manual_seed(...) to tuned_loader to allow workers")

    def _seeded_globally(self) -> bool:
        """Whether the sampler seeds each pass from torch's global generator (a shuffle
        without ``generator=``, or torch's random samplers without one)."""
        if self.distributed_sampler is not None or isinstance(self.dataset, IterableDataset):
            return False
        kwargs = self.user_kwargs
        batches, sampler = kwargs.get("batch_sampler"), kwargs.get("sampler")
        if isinstance(batches, BatchSampler):
            sampler = batches.sampler
        elif batches is not None:
            return False  # the user's own batches: how they are drawn is theirs
        if sampler is None:
            return bool(kwargs.get("shuffle")) and kwargs.get("generator") is None
        return isinstance(sampler, _GLOBALLY_SEEDED) and sampler.generator is None

    def _loading_draws_from_torch(self) -> bool:
        unbatched = "batch_size" in self.user_kwargs and self.user_kwargs["batch_size"] is None
        collate = self.user_kwargs.get("collate_fn") or (
            default_convert if unbatched else default_collate)
        return loading_draws_from_torch(self.dataset, collate, unbatched)

    def configure(self, knobs: Knobs) -> None:
        """(Re)build the inner DataLoader for ``knobs``; the user's own keywords win."""
        self.knobs = knobs
        kwargs = self.dataloader_kwargs(knobs)
        if self._prepare is None or self._plain is None:
            self.dataloader = DataLoader(self.dataset, **kwargs)
        else:
            self.dataloader = self._prepare(self._with_plain_sampling(kwargs))
        device = self.loop.device if self.loop is not None else None
        self._device = device if device is not None and device.type != "cpu" else None
        self._counted: int | None = None  # samples the sampler put in the latest batch
        self._non_blocking = bool(self.dataloader.pin_memory)

    def prepare_with(self, prepare: Callable[[DataLoader], Any]) -> None:
        """Iterate ``prepare(inner DataLoader)`` from now on, and prepare the DataLoader each
        :meth:`configure` builds the same way: how ``accelerator.prepare`` gives this process
        its share of the batches, on its device (:mod:`tuneup.integrations.accelerate`)."""
        if self.distributed_sampler is not None:  # the accelerator shares the batches out
            self.distributed_sampler = None
            self.dataloader = DataLoader(self.dataset, **self.dataloader_kwargs(self.knobs))
        self._plain, self._prepare = self.dataloader, prepare
        self.dataloader = prepare(self.dataloader)

    @property
    def prepared(self) -> bool:
        """Whether the batches come through a preparation (:meth:`prepare_with`)."""
        return self._prepare is not None

    def _with_plain_sampling(self, kwargs: dict[str, Any]) -> DataLoader:
        """A DataLoader with ``kwargs``' loading knobs over the first prepared one's batch
        sampler: the same sampler object and generator (accelerate seeds it once, from
        torch's global generator), so rebuilding moves no random stream and no sample."""
        plain = self._plain
        assert plain is not None
        if isinstance(self.dataset, IterableDataset):  # no indices: accelerate shards the stream
            return DataLoader(self.dataset, **kwargs)
        loading = {k: v for k, v in kwargs.items() if k not in _SAMPLING}
        if plain.batch_sampler is None:
            return DataLoader(self.dataset, sampler=plain.sampler, batch_size=None, **loading)
        return DataLoader(self.dataset, batch_sampler=plain.batch_sampler, **loading)

    def dataloader_kwargs(self, knobs: Knobs) -> dict[str, Any]:
        """The DataLoader keywords for ``knobs``: tuned values only where they may apply."""
        tuned = {k: v for k, v in knobs.loader_kwargs().items() if k not in self.user_kwargs}
        if tuned.get("num_workers") and "num_workers" in self.fixed_reasons:
            store.warn(f"num_workers={tuned['num_workers']} from the settings is not applied: "
                       f"{self.fixed_reasons['num_workers']}")
            del tuned["num_workers"]
        pinning_helps = torch.cuda.is_available() and (
            self.loop is None or self.loop.device.type == "cuda")
        if not pinning_helps:
            tuned.pop("pin_memory", None)
        if not self.user_kwargs.get("num_workers", tuned.get("num_workers", 0)):
            for name in _WORKER_ONLY:
                tuned.pop(name, None)
        kwargs = {**tuned, **self.user_kwargs}
        if self.distributed_sampler is not None:  # it shuffles (or not) as the user asked
            kwargs.pop("shuffle", None)
            kwargs["sampler"] = self.distributed_sampler
        return kwargs

    @property
    def shuffles(self) -> bool:
        """Whether the batch order depends on a random generator (anything but in-order)."""
        sampler = (self._plain or self.dataloader).sampler
        return not isinstance(sampler, (torch.utils.data.SequentialSampler,
                                        torch.utils.data.dataloader._InfiniteConstantSampler))

    def __iter__(self) -> Iterator[Any]:
        observers = hooks.current()
        if observers is hooks.NOBODY:
            return self.batches()
        return observers.batches(self, LoaderPass(self))

    def batches(self, source: Iterable[Any] | None = None) -> Iterator[Any]:
        """The inner DataLoader's batches (or ``source``'s, e.g. cached ones), timed, moved to
        a linked loop's device, each noted with the samples it should hold. The iterator is
        made now, as ``iter(DataLoader)`` makes it (its seed draws included)."""
        return self._timed(iter(self.dataloader if source is None else source))

    def _timed(self, iterator: Iterator[Any]) -> Iterator[Any]:
        telemetry = self.telemetry
        clock = time.perf_counter
        expect = self._expected_counts()
        # the sampler's counts are exact (a shard's last batch may be padded or short)
        exact = not isinstance(self.dataset, IterableDataset) and not self.prepared
        moving = self._device is not None
        try:
            while True:
                started = clock()
                if telemetry.started is None:
                    telemetry.started = started
                telemetry.latest = started
                try:
                    batch = next(iterator)
                except StopIteration:
                    return
                telemetry.data_wait_s += clock() - started
                expected = next(expect, None)
                self._counted = expected if exact else None
                samples = self.samples_in(batch)
                telemetry.samples += samples
                if self.loop is None:
                    telemetry.steps += 1
                if moving:
                    copy_started = clock()
                    batch = move_to(batch, self._device, self._non_blocking)
                    telemetry.copy_s += clock() - copy_started
                note_expected(expected)
                yield batch
        finally:
            note_expected(None)

    def _expected_counts(self) -> Iterator[int | None]:
        """The number of samples each batch of an epoch holds, where the DataLoader fixes it.

        Computed as the batches come, from ``len(sampler)``, never listed: a sampler that
        counts iterations rather than epochs (``RandomSampler(replacement=True,
        num_samples=10**10)``) costs no memory and no time at ``iter()``."""
        batches = self.dataloader.batch_sampler
        if not isinstance(batches, BatchSampler):
            return iter(())  # no automatic batching, or the user's own batch_sampler
        size = batches.batch_size
        sampler = getattr(batches, "sampler", None)  # accelerate's shard of one has none
        if getattr(batches, "split_batches", False):  # accelerate's: a share of each batch
            size //= batches.num_processes
        try:
            total: int | None = None if sampler is None else len(sampler)
        except (TypeError, OverflowError):  # no __len__, or one beyond a C ssize_t
            total = None
        if total is None or isinstance(self.dataset, IterableDataset):
            return itertools.repeat(size)  # full batches; a short last one is trained whole
        full, rest = divmod(total, size)
        last = (rest,) if rest and not batches.drop_last else ()
        return itertools.chain(itertools.repeat(size, full), last)

    def samples_in(self, batch: Any) -> int:
        """Samples in one batch from the inner DataLoader: as many as its BatchSampler put in
        (whatever shape a custom ``collate_fn`` gives the batch), else its first dimension."""
        if self.dataloader.batch_sampler is None:  # no automatic batching: one sample
            return 1
        return self._counted or batch_size_of(batch) or 1

    def __len__(self) -> int:
        return len(self.dataloader)

    def __getattr__(self, name: str) -> Any:
        if name == "dataloader":  # not built yet: avoid recursing
            raise AttributeError(name)
        return getattr(self.dataloader, name)

    def stats(self) -> Stats:
        """Input-stall share, samples/s and steps (the loop's, when linked to one)."""
        return self.telemetry.stats()


class LoaderPass(Iterator[Any]):
    """One pass over a loader's batches as observers receive it: started by ``start()`` or
    the first ``next()``. An observer that replaces the stream (the autotune child) thus
    starts no DataLoader iterator for nothing; one that passes it on calls ``start()`` where
    ``iter(DataLoader)`` would draw its seeds."""

    def __init__(self, loader: TunedLoader) -> None:
        self.loader = loader
        self.stream: Iterator[Any] | None = None

    def start(self) -> Iterator[Any]:
        if self.stream is None:
            self.stream = self.loader.batches()
        return self.stream

    def __next__(self) -> Any:
        return next(self.start())

    def close(self) -> None:
        """End the pass (a generator's ``close``): its DataLoader iterator and workers go."""
        close = getattr(self.stream, "close", None)
        if close is not None:
            close()


def loading_draws_from_torch(dataset: Any, collate: Callable[[Any], Any],
                             unbatched: bool) -> bool:
    """Whether loading and collating sample 0 advances torch's global CPU generator (the
    one a shuffle without ``generator=`` seeds from). The global generators' states
    (torch's, Python's, numpy's) are put back: the check moves no random stream."""
    before = _global_states()
    try:
        sample = dataset[0]
        collate(sample if unbatched else [sample])
        return not torch.equal(before["torch"], torch.random.get_rng_state())
    finally:
        _restore_states(before)


def _global_states() -> dict[str, Any]:
    """The state of each global generator a dataset may draw from (numpy's when loaded)."""
    states: dict[str, Any] = {"torch": torch.random.get_rng_state(), "random": random.getstate()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        states["numpy"] = numpy.random.get_state()
    return states


def _restore_states(states: dict[str, Any]) -> None:
    torch.random.set_rng_state(states["torch"])
    random.setstate(states["random"])
    if "numpy" in states:
        sys.modules["numpy"].random.set_state(states["numpy"])


def _reads_worker_info(cls: type) -> bool:
    """Whether the dataset's own methods call ``get_worker_info()``: the documented way an
    IterableDataset splits its stream between DataLoader workers (read from the compiled
    code, so a comment or docstring that names it does not count)."""
    for klass in cls.__mro__:
        if klass is IterableDataset or klass.__module__.startswith("torch."):
            break
        for member in vars(klass).values():
            function = getattr(member, "__func__", member)
            code = getattr(function, "__code__", None)
            if code is not None and _names(code, "get_worker_info"):
                return True
    return False


def _names(code: types.CodeType, name: str) -> bool:
    """``name`` is referenced by ``code`` or a function nested in it."""
    return name in code.co_names or any(
        _names(const, name) for const in code.co_consts if isinstance(const, types.CodeType))


def tuned_loader(dataset: Any, *args: Any, loop: TunedLoop | None = None,
                 splits_by_worker: bool | None = None, **kwargs: Any) -> TunedLoader:
    """A DataLoader over ``dataset`` (same arguments) with the tuned loader knobs.

    Args:
        dataset, *args, **kwargs: exactly ``DataLoader``'s. A keyword you pass is never
            tuned (``num_workers=4`` stays 4).
        loop: a ``tuned_loop`` to move batches to its device (``non_blocking`` when
            pinned) and to share its telemetry. Optional; create them in any order.
        splits_by_worker: for an ``IterableDataset``: whether it splits its stream between
            workers. Tuned workers are applied only when it does (default: detected from
            its code calling ``get_worker_info()``); otherwise each would yield every sample.

    Tuned: ``num_workers``, ``pin_memory``, ``prefetch_factor``, ``persistent_workers``.
    Batches, their order and ``len()`` are the DataLoader's; tuned workers are not applied
    where they would change a shuffle's order (one warning says why: docs/runtime.md). Under an initialised process
    group, a map-style dataset without a sampler of yours is shared out between the ranks
    by a ``DistributedSampler`` (see docs/distributed.md). Example::

        loader = tuned_loader(dataset, batch_size=256, shuffle=True)
        for x, y in loader: ...
    """
    return TunedLoader(dataset, *args, loop=loop, splits_by_worker=splits_by_worker, **kwargs)


def _serve_accelerate() -> None:
    """Have ``accelerator.prepare`` prepare tuned loaders as DataLoaders, once accelerate is
    loaded (now, if it is): :mod:`tuneup.integrations.accelerate`. A script that never
    imports accelerate pays one name comparison per import."""
    global _accelerate_watched
    if not _accelerate_watched:
        _accelerate_watched = True
        after_import("accelerate.accelerator", _install_accelerate)


def _install_accelerate(module: types.ModuleType) -> None:
    from tuneup.integrations import accelerate  # only scripts that load accelerate pay for it

    accelerate.install(module)
