"""The watcher's probe inside a job that uses a plain ``torch.utils.data.DataLoader``.

``tuneup watch -- python train.py`` puts :data:`tuneup.site.SITE_DIR` first on ``PYTHONPATH``; Python
imports its ``sitecustomize``, which calls :func:`install_from_environment` and then runs the job's own
``sitecustomize`` if it has one. :func:`install` only adds an import hook: nothing is loaded
until the job imports ``torch.utils.data.dataloader`` (a job that never imports torch pays
nothing). Then each DataLoader iterator is timed: how long ``next()`` waited for a batch,
batches, samples. The figures are published like the wrappers' feed (:mod:`tuneup.watch.feed`),
as ``<pid>.json`` in ``TUNEUP_WATCH_FEED``, so the watcher tells input-bound from
compute-bound on scripts nobody changed.

It changes nothing the script computes: no random draw, no batch touched, the iterator's own
``__next__`` called as it was; it prints nothing. A process whose ``tuned_loader`` the
wrappers' feed follows publishes through that feed instead (the probe stands down); one that
only loaded tuneup (a ``Trainer`` with ``tuned_trainer``, say, which iterates plain
DataLoaders) is measured by the probe. The record names the trainer whose code iterates the
DataLoader (``"trainer"``: ``"transformers"``, ``"lightning"`` or null), read from the stack
once a publish. Cost: two clock reads and a few additions per batch.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tuneup.after_import import after_import
from tuneup.site import ENV_FEED
from tuneup.watch.child_exit import publish_when_child_ends

TARGET = "torch.utils.data.dataloader"
PERIOD_S = 1.0
# the trainer whose loop iterates the DataLoader, by the module of a frame on the stack
TRAINERS = (("transformers.", "transformers"), ("lightning.", "lightning"),
            ("pytorch_lightning.", "lightning"))


@dataclasses.dataclass
class Counters:
    """What the followed loader's iterators did, cumulative."""

    loader: Any = None  # the first DataLoader iterated: its settings are reported
    started: float | None = None
    latest: float = 0.0
    data_wait_s: float = 0.0
    batches: int = 0
    samples: int = 0
    due: float = 0.0
    trainer: str | None = None  # the latest one seen iterating


def trainer_on_stack(frame: Any) -> str | None:
    """The trainer (transformers, Lightning) one of whose frames is on the stack from
    ``frame`` up, or ``None``: the code that iterates the DataLoader says which trainer runs
    the job, where the modules loaded would not (a Lightning job may import transformers
    for its model)."""
    while frame is not None:
        module = frame.f_globals.get("__name__") or ""
        for prefix, trainer in TRAINERS:
            if module.startswith(prefix):
                return trainer
        frame = frame.f_back
    return None


def batch_size(loader: Any) -> int | None:
    """Samples a batch of ``loader`` holds: its ``batch_size``, else its batch sampler's
    (accelerate, which runs the transformers ``Trainer``, batches through a sampler)."""
    size = getattr(loader, "batch_size", None)
    if size is None:
        size = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    return size if isinstance(size, int) else None


def _feed_follows_a_loader() -> bool:
    """tuneup's wrappers publish this process's figures: their feed is installed and follows
    a ``tuned_loader``. Loaded alone (a ``tuned_trainer`` job) it publishes nothing, so the
    probe does."""
    feed, hooks = sys.modules.get("tuneup.watch.feed"), sys.modules.get("tuneup.runtime.hooks")
    if feed is None or hooks is None:
        return False
    return any(isinstance(observer, feed.Feed) and observer.loader is not None
               for observer in getattr(hooks, "_installed", ()))


class _Probe:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.counters = Counters()
        self.owner = os.getpid()
        self.broken = False
        os.register_at_fork(after_in_child=self._start_over)

    def _start_over(self) -> None:
        """In a forked child the counters are the parent's: never publish them under the
        child's pid; a child that iterates DataLoaders counts its own from zero."""
        self.counters = Counters()
        self.owner = os.getpid()

    def patch(self, module: Any) -> None:
        """Wrap the iterator base class's ``__next__`` (every DataLoader iterator's)."""
        base = module._BaseDataLoaderIter
        original_init, original_next = base.__init__, base.__next__
        probe = self

        def __init__(iterator: Any, loader: Any) -> None:
            original_init(iterator, loader)
            iterator._tuneup_batch = batch_size(loader) or 1
            if probe.counters.loader is None:
                probe.counters.loader = loader

        def __next__(iterator: Any) -> Any:
            started = time.perf_counter()
            batch = original_next(iterator)  # StopIteration passes through uncounted
            probe.count(iterator, started, time.perf_counter())
            return batch

        base.__init__, base.__next__ = __init__, __next__
        atexit.register(self.publish)

    def count(self, iterator: Any, started: float, ended: float) -> None:
        counters = self.counters
        if counters.started is None:
            counters.started = started
            publish_when_child_ends(self, self.publish)
        counters.latest = ended
        counters.data_wait_s += ended - started
        counters.batches += 1
        counters.samples += getattr(iterator, "_tuneup_batch", 1)
        if ended >= counters.due:  # at the first batch, then once a period
            counters.due = ended + PERIOD_S
            counters.trainer = trainer_on_stack(sys._getframe(1)) or counters.trainer
            self.publish()

    def publish(self) -> None:
        """The counters as a feed record, replaced atomically; silent on failure (the job's
        training matters more than its watcher)."""
        counters = self.counters
        if (self.broken or counters.started is None or os.getpid() != self.owner
                or _feed_follows_a_loader()):
            return  # nothing yet, a fork no handler told, or the wrappers' feed publishes
        loader = counters.loader
        torch = sys.modules.get("torch")
        record = {
            "pid": os.getpid(), "steps": counters.batches, "samples": counters.samples,
            "elapsed_s": counters.latest - counters.started,
            "data_wait_s": counters.data_wait_s, "copy_s": 0.0, "device": None,
            "num_workers": getattr(loader, "num_workers", None),
            "pin_memory": bool(getattr(loader, "pin_memory", False)),
            "prefetch_factor": getattr(loader, "prefetch_factor", None),
            "batch_size": batch_size(loader),
            "torch_threads": torch.get_num_threads() if torch is not None else None,
            "trainer": counters.trainer,
        }
        try:
            from tuneup.files import write_atomic

            write_atomic(self.directory / f"{os.getpid()}.json", json.dumps(record),
                         durable=False)  # this process's pid: a forked trainer has its own
        except Exception:  # noqa: BLE001 - a watcher gone, a full disk: training goes on
            self.broken = True


def install_from_environment() -> None:
    """Arm the probe when a watcher gave a feed directory (``TUNEUP_WATCH_FEED``)."""
    directory = os.environ.get(ENV_FEED)
    if directory:
        after_import(TARGET, _Probe(Path(directory)).patch)
