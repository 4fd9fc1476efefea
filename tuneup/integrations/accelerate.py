"""``accelerator.prepare(model, optimizer, tuned_loader(...))``: a tuned loader prepared as a
DataLoader, and ``tuned_loop(..., accelerator=accelerator)`` stepping through the accelerator.

accelerate prepares what is a ``torch.utils.data.DataLoader`` (a ``TunedLoader`` is one) by
building a new loader from its sampler and keywords. For a tuned loader that would drop
what makes it tuned (timing, autotune switching knobs between trials), so
``Accelerator.prepare_data_loader`` is wrapped, once, when the script has both loaded: a
tuned loader's inner DataLoader is prepared exactly as accelerate prepares any (the same
``BatchSamplerShard`` indices per process, batches on the accelerator's device, its
generator synchronised), and the tuned loader, returned in its place, iterates that. When
its knobs change it builds a DataLoader over the same batch sampler and prepares it again.
Any other object goes to accelerate's own method untouched.

Imported only by scripts that load accelerate (``tuned_loader`` arranges it); see
docs/integrations.md.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from torch.utils.data import DataLoader

from tuneup.runtime.loader import TunedLoader

_WRAPPED = "__tuneup_wrapped__"


def install(module: ModuleType) -> None:
    """Wrap ``module.Accelerator``'s ``prepare_data_loader`` (``module`` is
    ``accelerate.accelerator``) so that it prepares a :class:`TunedLoader` in place, and its
    ``skip_first_batches`` so that a prepared one skips as accelerate's loaders do.
    Idempotent; an accelerate without these methods is left as it is."""
    accelerator_class = getattr(module, "Accelerator", None)
    _wrap(accelerator_class, "prepare_data_loader", _prepare_data_loader)
    _wrap(accelerator_class, "skip_first_batches", _skip_first_batches)


def _wrap(owner: Any, name: str, wrapper: Any) -> None:
    """``owner.name`` replaced by a method calling ``wrapper(original, self, ...)``."""
    original = getattr(owner, name, None)
    if original is None or getattr(original, _WRAPPED, False):
        return

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return wrapper(original, self, *args, **kwargs)

    setattr(method, _WRAPPED, True)
    setattr(owner, name, method)


def _prepare_data_loader(original: Any, accelerator: Any, data_loader: Any, *args: Any,
                         **kwargs: Any) -> Any:
    if not isinstance(data_loader, TunedLoader):
        return original(accelerator, data_loader, *args, **kwargs)
    if not data_loader.prepared:
        data_loader.prepare_with(_Preparation(accelerator, original, args, kwargs))
    return data_loader


def _skip_first_batches(original: Any, accelerator: Any, dataloader: Any, *args: Any,
                        **kwargs: Any) -> Any:
    """A prepared tuned loader's batches after the first ones skipped (resuming an epoch):
    accelerate's own skipping loader over its shard, with the tuned knobs in effect (not
    timed: autotune and the watcher's feed follow the tuned loader's own passes)."""
    if isinstance(dataloader, TunedLoader) and dataloader.prepared:
        dataloader = dataloader.dataloader
    return original(accelerator, dataloader, *args, **kwargs)


class _Preparation:
    """accelerate's own ``prepare_data_loader`` with the arguments of the first call, applied
    to each DataLoader the tuned loader builds. The accelerator keeps the latest one only
    among its loaders (what ``save_state`` and ``skip_first_batches`` read)."""

    def __init__(self, accelerator: Any, original: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:
        self.accelerator, self.original = accelerator, original
        self.args, self.kwargs = args, kwargs
        self.latest: Any = None

    def __call__(self, dataloader: DataLoader) -> Any:
        known = getattr(self.accelerator, "_dataloaders", None)
        if isinstance(known, list) and self.latest is not None:
            known[:] = [loader for loader in known if loader is not self.latest]
        self.latest = self.original(self.accelerator, dataloader, *self.args, **self.kwargs)
        if getattr(self.latest, "batch_size", 0) is None and dataloader.batch_size is not None:
            # a shard keeps its batch size in its batch sampler: what each process trains on is
            # what autotune's figures and the watcher's feed read as the loader's batch size
            split = getattr(self.accelerator, "split_batches", False)
            processes = getattr(self.accelerator, "num_processes", 1) if split else 1
            self.latest.batch_size = dataloader.batch_size // processes
        return self.latest
