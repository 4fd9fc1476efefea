"""One :class:`Sample` per tick, from the job's process tree, the machine, NVML, the
runtime's feed and, when nothing else can tell loading from compute, the job's stacks."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tuneup.watch import feed
from tuneup.watch.host import Host
from tuneup.watch.nvml import GpuReader
from tuneup.watch.procs import ProcessTree
from tuneup.watch.samples import MAIN, WORKER, GpuSample, ProcessSample, RuntimeSample, Sample
from tuneup.watch.stacks import StackSampler


class Sampler:
    """Reads every source once per :meth:`sample`; a missing source (no GPU, no feed) gives
    empty figures, never an error."""

    def __init__(self, tree: ProcessTree, host: Host, gpus: GpuReader | None,
                 feed_directory: Path | None, stacks: StackSampler | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.tree = tree
        self.host = host
        self.gpus = gpus
        self.feed_directory = feed_directory
        self.stacks = stacks
        self.clock = clock
        self.started = clock()
        self.publishers: set[int] = set()  # pids whose feed file was read: after the job too
        self.members: set[int] = {tree.root.pid}  # the tree at the last sample

    def runtime(self) -> tuple[RuntimeSample, ...]:
        """The feed's latest counters, one per training process: the files of the processes
        that published before and of the tree's members, by name (a new process's from the
        tick after it is first sampled)."""
        if self.feed_directory is None:
            return ()
        records = feed.read(self.feed_directory, [*sorted(self.publishers),
                                                  *sorted(self.members)])
        self.publishers.update(record.pid for record in records)
        return records

    def sample(self) -> Sample:
        runtime = self.runtime()
        processes = self.tree.sample(loaders={r.pid: r.num_workers for r in runtime})
        self.members = {p.pid for p in processes} or self.members
        gpus = self.gpus.read({p.pid for p in processes}) if self.gpus is not None else ()
        stacks = (self.stacks.poll(stack_target(runtime, processes, gpus))
                  if self.stacks is not None else None)
        return Sample(t=self.clock() - self.started, gpus=gpus, processes=processes,
                      host=self.host.sample(), runtime=runtime, stacks=stacks)


def stack_target(runtime: Sequence[RuntimeSample], processes: Sequence[ProcessSample],
                 gpus: Sequence[GpuSample]) -> int | None:
    """The process whose stacks are wanted: the busiest training process, but only when no
    feed, no GPU memory of the job and no DataLoader workers can tell loading from compute
    (children of unknown role do not: the main process's stacks may show it loading)."""
    if runtime or any(g.job_memory for g in gpus) or any(p.role == WORKER for p in processes):
        return None
    mains = [p for p in processes if p.role == MAIN]
    return max(mains, key=lambda p: p.cpu_percent or 0.0).pid if mains else None
