"""Which processes on the machine are training jobs, for the daemon.

A job is a Python process that holds a GPU context (NVML's per-process list), or that runs
with the tuneup runtime: its environment names tuneup's observers or the watcher's feed
(``TUNEUP_OBSERVERS``, ``TUNEUP_WATCH_FEED``), or its command line imports tuneup (``-c``
code, or the script it runs). A job's descendants (DataLoader workers, the ranks under a
launcher) belong to its process tree, not to jobs of their own; tuneup's own commands (the
daemon, ``tuneup watch``, ``tuneup autotune``) are never jobs. A Python process whose
environment cannot be read (another user's) is skipped and said once per user.

What a process is does not change until it runs ``exec`` again, so each is read once per
identity: its start time and name, and for a Python process its command line, checked every
tick with a read of ``/proc`` (a few microseconds each). A wrapper that ``exec``s the job
(``docker-entrypoint``, an sbatch script, ``source venv; exec python ...``) and a pid reused
by a new process are read anew; a job turned zombie is read once more, as no job, and stays
that until it is reaped. A young fork that has not exec'd (its parent's command line, its
parent's environment) and one caught inside ``exec`` are read again next tick, and the GPU
list every tick. A job's script is another user's file: it is read through :func:`~tuneup.watch.safe_files.read_regular` (no link followed, a named pipe
never waited on, a bounded read), so no job can stall the daemon.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import psutil

from tuneup.runtime.hooks import ENV_OBSERVERS
from tuneup.watch import feed
from tuneup.watch.nvml import GpuReader
from tuneup.watch.safe_files import read_regular

GPU, RUNTIME, IMPORTS = "gpu context", "tuneup runtime", "imports tuneup"
IMPORTS_TUNEUP = re.compile(  # ``from tuneup...``, ``import tuneup``, ``import os, tuneup as t``
    rb"^[ \t]*(?:from[ \t]+tuneup\b|import[ \t]+(?:[\w.]+(?:[ \t]+as[ \t]+\w+)?[ \t]*,[ \t]*)*"
    rb"tuneup\b)", re.MULTILINE)
MAX_SCRIPT_BYTES = 1 << 20  # a training script's imports are near its top
FORK_GRACE_S = 10.0  # a fork still without exec after this is read as it is
MAX_COMMAND_CHARS = 4096  # of a job's command line as stored, logged and shown
MAX_IDENTITY_BYTES = 8192  # of a command line compared tick to tick: an exec changes its start
HAS_PROC = os.path.isdir("/proc")  # Linux; elsewhere psutil reads the identity
TOOL_MODULES = ("tuneup.cli", "tuneup.watch.daemon")


@dataclass(frozen=True)
class Found:
    """A training job: its root process, how it was recognised, and its runtime feed."""

    pid: int
    command: tuple[str, ...]
    user: str | None
    found_by: str  # GPU, RUNTIME or IMPORTS
    feed_directory: Path | None


class _NotYet(Exception):
    """The process is in the middle of ``exec`` (its name is new, its command line still
    empty): read it again next tick rather than decide on nothing."""


@dataclass(frozen=True)
class _Seen:
    """What a Python process is, read once: ``marked`` when tuneup's runtime runs in it
    (a job with or without a GPU), otherwise a job only while it holds a GPU context."""

    command: tuple[str, ...]
    user: str | None
    marked: str | None  # RUNTIME, IMPORTS or None
    feed_directory: Path | None


def bounded(cmdline: list[str]) -> tuple[str, ...]:
    """The command line as the daemon keeps it: its first :data:`MAX_COMMAND_CHARS`
    characters (a space counted between words), the cut word marked with how much is left
    out. Any local user can start a process with a 2 MB command line; every job's is in the
    status file, the log and ``watch status``, whose size must not depend on it."""
    kept: list[str] = []
    left = MAX_COMMAND_CHARS
    for index, word in enumerate(cmdline):
        if len(word) + 1 > left:
            rest = sum(len(w) + 1 for w in cmdline[index:]) - 1
            kept.append(f"{word[:max(left - 1, 0)]}…[{rest - max(left - 1, 0)} more characters]")
            break
        kept.append(word)
        left -= len(word) + 1
    return tuple(kept)


class Identity(NamedTuple):
    """What changes when a pid names another process (its start) or it has run ``exec`` (its
    name; its command line's start, as a Python that ``exec``s Python keeps its name)."""

    start: object
    name: object
    command: object  # None unless asked for


def identity(pid: int, with_command: bool) -> Identity | None:
    """``pid``'s :class:`Identity` (``None`` once it is gone), read from ``/proc`` where
    there is one: every tick for every process, so without psutil's cost."""
    if not HAS_PROC:
        try:
            process = psutil.Process(pid)
            return Identity(process.create_time(), process.name(),
                            tuple(process.cmdline()) if with_command else None)
        except psutil.Error:
            return None
    stat = _proc(pid, "stat", 4096)
    if not stat:
        return None
    name, _, fields = stat[stat.find(b"(") + 1:].rpartition(b")")
    start = fields.split()[19:20]  # the 22nd field; the name may hold spaces and parentheses
    command = _proc(pid, "cmdline", MAX_IDENTITY_BYTES) if with_command else None
    return Identity(start, name, command)


def _proc(pid: int, name: str, limit: int) -> bytes | None:
    """The start of the kernel's ``/proc/PID/NAME`` (no one plants links there), or ``None``."""
    try:
        fd = os.open(f"/proc/{pid}/{name}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def is_python(name: str, cmdline: list[str]) -> bool:
    """``python3.11 train.py``, and scripts with a Python shebang (``torchrun``: the
    process's name is the script's, its command line starts with the interpreter)."""
    first = Path(cmdline[0]).name if cmdline else ""
    return name.startswith("python") or first.startswith("python")


def is_tuneup_tool(cmdline: list[str]) -> bool:
    """tuneup's own commands: the console script, ``-m tuneup.cli``, the daemon."""
    if len(cmdline) > 1 and Path(cmdline[1]).name == "tuneup":
        return True
    return any(word == "-m" and module in TOOL_MODULES
               for word, module in zip(cmdline, cmdline[1:]))


def imports_tuneup(cmdline: list[str], cwd: str | None) -> bool:
    """The ``-c`` code or the first ``*.py`` script of ``cmdline`` imports tuneup."""
    for word, following in zip(cmdline, [*cmdline[1:], ""]):
        if word == "-c":
            return bool(IMPORTS_TUNEUP.search(following.encode(errors="replace")))
        if word.endswith(".py"):
            code = read_regular(Path(word) if cwd is None else Path(cwd) / word,
                                MAX_SCRIPT_BYTES)
            return code is not None and bool(IMPORTS_TUNEUP.search(code))
    return False


def feed_directory(environ: dict[str, str]) -> Path | None:
    """The watcher's feed a process publishes to, when its environment installs it."""
    if feed.OBSERVER in environ.get(ENV_OBSERVERS, "") and environ.get(feed.ENV_FEED):
        return Path(environ[feed.ENV_FEED])
    return None


def gpu_pids(gpus: GpuReader | None) -> set[int]:
    """Processes holding a compute context on any GPU (none without NVML)."""
    pids: set[int] = set()
    for handle in gpus.handles if gpus is not None else ():
        try:
            pids.update(p.pid for p in gpus.nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        except Exception:  # NVMLError: no process list for this GPU
            continue
    return pids


class Finder:
    """Finds the jobs among the machine's processes; ``list_pids``, ``open_process`` and
    ``identify`` are psutil's and :func:`identity` unless a test hands in others (a process
    of another user, a pid reused)."""

    def __init__(self, list_pids: Callable[[], Iterable[int]] = psutil.pids,
                 open_process: Callable[[int], psutil.Process] = psutil.Process,
                 own_pid: int | None = None,
                 identify: Callable[[int, bool], Identity | None] = identity) -> None:
        self.list_pids = list_pids
        self.open_process = open_process
        self.identify = identify
        self.own_pid = own_pid if own_pid is not None else psutil.Process().pid
        # pid -> (its identity when read, what it is: None is no job while that identity holds)
        self._seen: dict[int, tuple[Identity, _Seen | None]] = {}
        self._parents: dict[int, int] = {}
        self._denied_users: set[str] = set()
        self.notes: list[str] = []  # said once each; the daemon takes them

    def find(self, on_gpu: Collection[int] = ()) -> list[Found]:
        """The jobs now: marked Python processes, and those holding a GPU context."""
        pids = set(self.list_pids())
        self._seen = {pid: seen for pid, seen in self._seen.items() if pid in pids}
        self._parents = {pid: parent for pid, parent in self._parents.items() if pid in pids}
        for pid in pids:
            if pid in self._seen and self._unchanged(pid, *self._seen[pid]):
                continue
            before = self.identify(pid, True)
            try:
                seen = self._read(pid, holds_gpu=pid in on_gpu)
            except _NotYet:
                seen = before = None
            if before is None:  # gone, or to be read again next tick
                self._seen.pop(pid, None)
            else:
                self._seen[pid] = (before, seen)
        jobs = {pid: seen for pid, (_, seen) in self._seen.items()
                if seen is not None and (seen.marked or pid in on_gpu)}
        return [Found(pid=pid, command=seen.command, user=seen.user,
                      found_by=seen.marked or GPU, feed_directory=seen.feed_directory)
                for pid, seen in sorted(jobs.items())
                if not any(parent in jobs for parent in self._ancestors(pid))]

    def _unchanged(self, pid: int, known: Identity, seen: _Seen | None) -> bool:
        """``pid`` is still the process read, and has not run ``exec`` since."""
        now = self.identify(pid, seen is not None)
        return now is not None and now[:2] == known[:2] and (
            seen is None or now.command == known.command)

    def _read(self, pid: int, holds_gpu: bool = False) -> _Seen | None:
        """What the process is, or ``None`` when it is no job (not Python, a tuneup tool,
        the daemon itself, gone, or unreadable)."""
        if pid == self.own_pid:
            return None
        try:
            process = self.open_process(pid)
            self._parents[pid] = process.ppid()
            cmdline, name = process.cmdline(), process.name()
            if not cmdline and name.startswith("python") and (
                    process.status() != psutil.STATUS_ZOMBIE):
                raise _NotYet  # kernel threads too have no command line, but other names
            if cmdline and not holds_gpu and self._forked(process, cmdline):
                raise _NotYet  # it may exec into a job yet: read it again next tick
            if not is_python(name, cmdline) or is_tuneup_tool(cmdline):
                return None
            user = _user(process)
            try:
                environ = process.environ()
                cwd = process.cwd()
            except psutil.AccessDenied:
                self._denied(user)
                return None
        except psutil.Error:  # gone meanwhile, or even its command line is hidden
            return None
        if environ.get(ENV_OBSERVERS) or environ.get(feed.ENV_FEED):
            marked: str | None = RUNTIME
        elif imports_tuneup(cmdline, cwd):
            marked = IMPORTS
        else:
            marked = None
        return _Seen(command=bounded(cmdline), user=user, marked=marked,
                     feed_directory=feed_directory(environ))

    def _forked(self, process: psutil.Process, cmdline: list[str]) -> bool:
        """A young process with its parent's command line: a fork that has not exec'd yet (a
        shell starting ``python train.py``, a Python launcher). One older than
        :data:`FORK_GRACE_S` never will (a DataLoader worker, a fork pool's member) and is
        read as it is."""
        try:
            parent = process.ppid()
            return (bool(parent) and time.time() - process.create_time() < FORK_GRACE_S
                    and self.open_process(parent).cmdline() == cmdline)
        except psutil.Error:
            return False

    def _denied(self, user: str | None) -> None:
        name = user or "another user"
        if name not in self._denied_users:
            self._denied_users.add(name)
            self.notes.append(f"Python processes of {name} cannot be read (permission denied): "
                              "skipped; run the daemon as that user (or root) to watch them")

    def _ancestors(self, pid: int) -> Iterable[int]:
        """The parents of ``pid`` up to the root, as far as they were read."""
        seen = {pid}
        while (pid := self._parents.get(pid, 0)) and pid not in seen:
            seen.add(pid)
            yield pid


def _user(process: psutil.Process) -> str | None:
    try:
        return process.username()
    except (psutil.Error, KeyError):  # a uid with no name in this container
        return None
