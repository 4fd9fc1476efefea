"""The runtime -> watcher channel: both sides of one small contract.

``tuneup watch`` starts the job with ``TUNEUP_OBSERVERS`` naming :func:`install` and
``TUNEUP_WATCH_FEED`` naming a directory. Inside the job, :class:`Feed` (a runtime observer:
the runtime never imports this module) publishes the loader's own counters — steps,
samples, time waiting for data, time copying to the device — as ``<pid>.json`` in that
directory, replaced atomically, at most once per :data:`PERIOD_S`, at the end of each
epoch (so a job killed later still leaves its counters) and once more at exit.
One file per training process, so several ranks never overwrite each other. The watcher
reads them with :func:`read`, as files of the job's user: by their known names (the
job's pids; the folder is never listed), no link followed, no named pipe waited on, a
bounded number of bounded files, so a job cannot stall the watcher (or a daemon running
as root) through its feed directory. Without the variable no observer is
installed and the runtime's cost is what it always was; with it, a batch costs one clock
read more.

This module imports no torch at import time: the watcher reads the feed without it.
"""

from __future__ import annotations

import atexit
import dataclasses
import itertools
import json
import os
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuneup.files import write_atomic
from tuneup.site import ENV_FEED
from tuneup.runtime import hooks
from tuneup.watch.child_exit import publish_when_child_ends
from tuneup.watch.safe_files import read_regular
from tuneup.watch.samples import RuntimeSample

if TYPE_CHECKING:
    from tuneup.runtime.loader import TunedLoader

OBSERVER = "tuneup.watch.feed:install"
PERIOD_S = 1.0
MAX_BYTES = 1 << 16  # a feed file is a few hundred bytes
MAX_LOOKUPS = 1024  # names tried a tick: a job's training processes and its workers
_FIELDS = {field.name: field for field in dataclasses.fields(RuntimeSample)}


def install() -> Feed | None:
    """The observer ``TUNEUP_OBSERVERS`` names: a feed when a watcher gave a directory."""
    directory = os.environ.get(ENV_FEED)
    if not directory:
        return None
    feed = Feed(Path(directory))
    atexit.register(feed.publish)  # the final counters, for the watcher's summary
    return feed


class Feed(hooks.Observer):
    """Publishes the training loader's counters for the watcher."""

    def __init__(self, directory: Path, period_s: float = PERIOD_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = directory
        self.period_s = period_s
        self.clock = clock
        self.broken = False
        self._start_over()
        _start_over_when_forked(self)

    def _start_over(self) -> None:
        """Follow no loader yet, as this process: in a forked child (a helper, a DataLoader
        worker, a trainer forked by a launcher) the parent's loader and counters are the
        parent's, never to be published under the child's pid; a child that trains
        publishes its own loader's once it iterates one."""
        self.owner = os.getpid()
        self.path = self.directory / f"{self.owner}.json"
        self.loader: TunedLoader | None = None
        self.due = 0.0  # the clock reading from which the next publish may happen

    def loader_created(self, loader: TunedLoader) -> None:
        """A loader linked to a training loop: say at once that this process trains (zero
        counters), before its first batch: Hogwild's trainers, spawned by the script, were
        called DataLoader workers, and the job input-bound, until then. Which loader the
        feed follows is still decided by the batches, and the first one is published."""
        if self.loader is None and loader.loop is not None:
            self.loader = loader
            self.publish()
            self.loader, self.due = None, 0.0

    def batches(self, loader: TunedLoader, source: Iterator[Any]) -> Iterator[Any]:
        """Follow the first loader iterated, or the first linked to a loop (which counts
        optimizer steps) once one is: an eval loader on its own does not replace it."""
        if self.loader is None or (self.loader.loop is None and loader.loop is not None):
            self.loader = loader
            publish_when_child_ends(self, self.publish)
        start = getattr(source, "start", None)
        if start is not None:
            start()  # the DataLoader's seed draws happen at iter(), as without a watcher
        return self._publishing(loader, source)

    def _publishing(self, loader: TunedLoader, source: Iterator[Any]) -> Iterator[Any]:
        clock = self.clock
        try:
            for batch in source:
                if clock() >= self.due:
                    self.publish()
                yield batch
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()
            if loader is self.loader:
                self.publish()

    def publish(self) -> None:
        """Write the counters now (atomically: the watcher never reads half a file)."""
        if self.loader is None or self.broken or os.getpid() != self.owner:
            return  # nothing to say, or a fork no handler told (``os.fork`` from C code)
        self.due = self.clock() + self.period_s
        try:
            # no fsync: a live reader needs whole files, not files that outlive a crash
            write_atomic(self.path, json.dumps(dataclasses.asdict(self._record())),
                         durable=False)
        except OSError as exc:  # the watcher's directory is gone: training goes on, unwatched
            self.broken = True
            print(f"tuneup: the watch feed stopped ({exc.strerror or exc})", file=sys.stderr)

    def _record(self) -> RuntimeSample:
        import torch  # already loaded by the runtime that calls this

        loader = self.loader
        stats, dataloader = loader.stats(), loader.dataloader
        return RuntimeSample(
            pid=os.getpid(), steps=stats.steps, samples=stats.samples,
            elapsed_s=stats.elapsed_s, data_wait_s=stats.data_wait_s, copy_s=stats.copy_s,
            device=_device(loader.loop),
            num_workers=dataloader.num_workers, pin_memory=bool(dataloader.pin_memory),
            prefetch_factor=dataloader.prefetch_factor, batch_size=dataloader.batch_size,
            torch_threads=torch.get_num_threads(),
        )


def _device(loop: Any) -> str | None:
    """The loop's device type; None where a CPU model shares its process with CUDA work
    (parameters offloaded to the CPU, a model without parameters): the watcher then judges
    the job by the GPUs too."""
    import torch  # already loaded by the runtime that calls this

    if loop is None:
        return None
    device = loop.device.type
    return None if device == "cpu" and torch.cuda.is_initialized() else device


def _start_over_when_forked(feed: Feed) -> None:
    """Tell ``feed`` in every child forked from now on (a feed let go is not kept alive)."""
    reference = weakref.ref(feed)

    def start_over() -> None:
        alive = reference()
        if alive is not None:
            alive._start_over()

    os.register_at_fork(after_in_child=start_over)


def read(directory: Path, pids: Iterable[int]) -> tuple[RuntimeSample, ...]:
    """The latest counters of the training processes among ``pids`` (the job's, as the
    watcher knows them; the first :data:`MAX_LOOKUPS`), each read by its known name
    ``<pid>.json``: the folder is never listed, so a job's user who fills it with files
    costs the watcher nothing. A file whose record names another pid is not that process's."""
    found = []
    for pid in itertools.islice(dict.fromkeys(pids), MAX_LOOKUPS):
        record = _parse(directory / f"{pid}.json")
        if record is not None and record.pid == pid:
            found.append(record)
    return tuple(sorted(found, key=lambda record: record.pid))


def _parse(path: Path) -> RuntimeSample | None:
    """One feed file, or ``None`` when it is not one (too big, not JSON, wrong fields)."""
    raw = read_regular(path, MAX_BYTES + 1)
    try:
        data = json.loads(raw) if raw is not None and len(raw) <= MAX_BYTES else None
    except ValueError:
        return None
    if not isinstance(data, dict) or not all(_valid(name, data.get(name)) for name in _FIELDS):
        return None
    return RuntimeSample(**{name: data.get(name) for name in _FIELDS})


def _valid(name: str, value: Any) -> bool:
    declared = _FIELDS[name].type  # a string: ``from __future__ import annotations``
    if value is None:
        return "None" in declared
    if isinstance(value, bool):
        return declared.startswith("bool")
    if declared.startswith("int"):
        return isinstance(value, int)
    if declared.startswith("float"):
        return isinstance(value, (int, float))
    return isinstance(value, str)
