"""The job's process tree through psutil: CPU, threads, memory and reads per process, with
DataLoader workers told apart from the process that trains.

CPU shares come from each process's (and thread's) own CPU times between two samples, so a
process seen for the first time has no share yet, and nothing depends on psutil's global
``cpu_percent`` state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from pathlib import Path

import psutil

from tuneup.watch.samples import HELPER, MAIN, WORKER, ProcessSample

BUSY_THREAD = 0.2  # a thread using at least this share of a core counts as busy
# Command lines of multiprocessing's own helpers and torch's compile workers: never trainers.
HELPER_MARKS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver",
                "multiprocessing.semaphore_tracker", "_inductor/compile_worker")
WORKER_MARKS = ("spawn_main",)  # a spawned multiprocessing child (DataLoader workers with spawn)


def role_of(cmdline: list[str], parent_cmdline: list[str] | None,
            same_user: bool = True) -> str:
    """A process's role from its command line and its parent's.

    A DataLoader worker is a Python multiprocessing child of the training process, run by
    the job's user: forked (the parent's command line, unchanged) or spawned
    (``spawn_main``). Helpers are the multiprocessing trackers and torch's compile workers.
    Everything else may train: a shell's subshell, or another user's process under an
    attached ``--pid 1``, is no DataLoader worker.
    """
    if not same_user or not cmdline or not Path(cmdline[0]).name.startswith("python"):
        return MAIN
    joined = " ".join(cmdline)
    if any(mark in joined for mark in HELPER_MARKS):
        return HELPER
    if any(mark in joined for mark in WORKER_MARKS):
        return WORKER
    if parent_cmdline is not None and cmdline == parent_cmdline:
        return WORKER
    return MAIN


class ProcessTree:
    """Samples ``root`` and its descendants; raises ``psutil.Error`` if ``root`` is gone."""

    def __init__(self, root: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.root = psutil.Process(root)
        self.user = self.root.uids().real
        self.clock = clock
        self._cpu: dict[int, tuple[float, float]] = {}  # pid -> (CPU seconds, when)
        self._threads: dict[tuple[int, int], float] = {}  # (pid, tid) -> CPU seconds
        self._roles: dict[int, str] = {}  # a role does not change: read the command line once

    def sample(self, trainers: Collection[int] = ()) -> tuple[ProcessSample, ...]:
        """Every live process of the tree; ``trainers`` (pids the runtime's feed named) are MAIN."""
        try:
            members = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return ()
        samples = []
        for process in members:
            try:
                samples.append(self._one(process, trainers))
            except psutil.Error:  # ended between the listing and the reading
                continue
        live = {s.pid for s in samples}
        self._cpu = {pid: v for pid, v in self._cpu.items() if pid in live}
        self._threads = {key: v for key, v in self._threads.items() if key[0] in live}
        self._roles = {pid: v for pid, v in self._roles.items() if pid in live}
        return tuple(samples)

    def _one(self, process: psutil.Process, trainers: Collection[int]) -> ProcessSample:
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
        role = MAIN if process.pid in trainers else self._role(process)
        return ProcessSample(pid=process.pid, role=role, cpu_percent=cpu, busy_threads=busy,
                             threads=len(threads), rss=rss, read_bytes=read_bytes)

    def _role(self, process: psutil.Process) -> str:
        if process.pid not in self._roles:
            parent = process.parent() if process.pid != self.root.pid else None
            parent_cmdline = parent.cmdline() if parent is not None else None
            self._roles[process.pid] = role_of(process.cmdline(), parent_cmdline,
                                               process.uids().real == self.user)
        return self._roles[process.pid]
