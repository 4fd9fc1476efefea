"""The job's process tree through psutil: CPU, threads, memory and reads per process, with
DataLoader workers told apart from the processes that train.

A multiprocessing child is only a *candidate*: Hogwild-style scripts train in
``mp.Process`` children that look exactly like forked or spawned DataLoader workers. Its
role is settled by evidence at each sample (:func:`settle`): its own feed file makes it a
trainer; its parent's feed naming a training loader with ``num_workers > 0`` makes it a
DataLoader worker; without either it stays a :data:`CHILD` of unknown role.

CPU shares come from each process's (and thread's) own CPU times between two samples, so a
process seen for the first time has no share yet, and nothing depends on psutil's global
``cpu_percent`` state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

import psutil

from tuneup.watch.samples import CHILD, HELPER, MAIN, WORKER, ProcessSample

BUSY_THREAD = 0.2  # a thread using at least this share of a core counts as busy
# Command lines of multiprocessing's own helpers and torch's compile workers: never trainers.
HELPER_MARKS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver",
                "multiprocessing.semaphore_tracker", "_inductor/compile_worker")
CHILD_MARKS = ("spawn_main",)  # a spawned multiprocessing child (worker or trainer)


def role_of(cmdline: list[str], parent_cmdline: list[str] | None,
            same_user: bool = True) -> str:
    """A process's candidate role from its command line and its parent's.

    A Python multiprocessing child run by the job's user, forked (the parent's command
    line, unchanged) or spawned (``spawn_main``), is a :data:`CHILD`: a DataLoader worker
    or a trainer, which only evidence tells (:func:`settle`). Helpers are the
    multiprocessing trackers and torch's compile workers. Everything else may train: a
    shell's subshell, or another user's process under an attached ``--pid 1``.
    """
    if not same_user or not cmdline or not Path(cmdline[0]).name.startswith("python"):
        return MAIN
    joined = " ".join(cmdline)
    if any(mark in joined for mark in HELPER_MARKS):
        return HELPER
    if any(mark in joined for mark in CHILD_MARKS):
        return CHILD
    if parent_cmdline is not None and cmdline == parent_cmdline:
        return CHILD
    return MAIN


def settle(candidate: str, pid: int, parent: int | None,
           loaders: Mapping[int, int | None]) -> str:
    """The role the evidence supports. ``loaders`` maps each process that publishes a feed
    (it made a training loader) to that loader's ``num_workers``. A process with a feed
    trains; a child of a process whose training loader has workers is one of them; any
    other child stays :data:`CHILD` (neither called a worker nor counted as training)."""
    if pid in loaders:
        return MAIN
    if candidate != CHILD:
        return candidate
    return WORKER if parent is not None and loaders.get(parent) else CHILD


class ProcessTree:
    """Samples ``root`` and its descendants; raises ``psutil.Error`` if ``root`` is gone."""

    def __init__(self, root: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.root = psutil.Process(root)
        self.user = self.root.uids().real
        self.clock = clock
        self._cpu: dict[int, tuple[float, float]] = {}  # pid -> (CPU seconds, when)
        self._threads: dict[tuple[int, int], float] = {}  # (pid, tid) -> CPU seconds
        # pid -> (candidate role, parent pid): neither changes, so the command line is read once
        self._roles: dict[int, tuple[str, int | None]] = {}

    def sample(self, trainers: Collection[int] = (),
               loaders: Mapping[int, int | None] | None = None) -> tuple[ProcessSample, ...]:
        """Every live process of the tree, roles settled by the feed: ``loaders`` maps each
        process that publishes one to its training loader's ``num_workers``; ``trainers``
        (pids with a feed whose loader is not known) count as publishing a loader without
        workers."""
        loaders = {**dict.fromkeys(trainers), **(loaders or {})}
        try:
            members = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return ()
        samples = []
        for process in members:
            try:
                samples.append(self._one(process, loaders))
            except psutil.Error:  # ended between the listing and the reading
                continue
        live = {s.pid for s in samples}
        self._cpu = {pid: v for pid, v in self._cpu.items() if pid in live}
        self._threads = {key: v for key, v in self._threads.items() if key[0] in live}
        self._roles = {pid: v for pid, v in self._roles.items() if pid in live}
        return tuple(samples)

    def _one(self, process: psutil.Process, loaders: Mapping[int, int | None]) -> ProcessSample:
        with process.oneshot():
            now = self.clock()
            times = process.cpu_times()
            used = times.user + times.system
            threads = process.threads()
            rss = process.memory_info().rss
            try:
                read_bytes: int | None = process.io_counters().read_bytes
            except (psutil.AccessDenied, AttributeError):  # another user's job; macOS
                read_bytes = None
        previous = self._cpu.get(process.pid)
        self._cpu[process.pid] = (used, now)
        cpu = busy = None
        if previous is not None and now > previous[1]:
            elapsed = now - previous[1]
            cpu = max(0.0, used - previous[0]) / elapsed * 100
            busy = 0
            for thread in threads:
                key = (process.pid, thread.id)
                spent = thread.user_time + thread.system_time
                if key in self._threads and spent - self._threads[key] >= BUSY_THREAD * elapsed:
                    busy += 1
        for thread in threads:
            self._threads[(process.pid, thread.id)] = thread.user_time + thread.system_time
        candidate, parent = self._candidate(process)
        role = settle(candidate, process.pid, parent, loaders)
        return ProcessSample(pid=process.pid, role=role, cpu_percent=cpu, busy_threads=busy,
                             threads=len(threads), rss=rss, read_bytes=read_bytes)

    def _candidate(self, process: psutil.Process) -> tuple[str, int | None]:
        if process.pid not in self._roles:
            parent = process.parent() if process.pid != self.root.pid else None
            parent_cmdline = parent.cmdline() if parent is not None else None
            role = role_of(process.cmdline(), parent_cmdline, process.uids().real == self.user)
            self._roles[process.pid] = (role, parent.pid if parent is not None else None)
        return self._roles[process.pid]
