"""One :class:`Sample` per tick, from the job's process tree, the machine, NVML and the
runtime's feed."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tuneup.watch import feed
from tuneup.watch.host import Host
from tuneup.watch.nvml import GpuReader
from tuneup.watch.procs import ProcessTree
from tuneup.watch.samples import RuntimeSample, Sample


class Sampler:
    """Reads every source once per :meth:`sample`; a missing source (no GPU, no feed) gives
    empty figures, never an error."""

    def __init__(self, tree: ProcessTree, host: Host, gpus: GpuReader | None,
                 feed_directory: Path | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.tree = tree
        self.host = host
        self.gpus = gpus
        self.feed_directory = feed_directory
        self.clock = clock
        self.started = clock()

    def runtime(self) -> tuple[RuntimeSample, ...]:
        """The feed's latest counters, one per training process."""
        return feed.read(self.feed_directory) if self.feed_directory is not None else ()

    def sample(self) -> Sample:
        runtime = self.runtime()
        trainers = {record.pid for record in runtime}
        processes = self.tree.sample(trainers)
        gpus = self.gpus.read({p.pid for p in processes}) if self.gpus is not None else ()
        return Sample(t=self.clock() - self.started, gpus=gpus, processes=processes,
                      host=self.host.sample(), runtime=runtime)
