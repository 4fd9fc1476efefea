"""The daemon's state directory: where it lies, who holds it, and what the daemon last said.

``daemon.lock`` carries an exclusive ``flock`` that the running daemon holds for its whole
life: a second daemon on the same directory cannot take it and refuses to start, and a
daemon that dies (even by SIGKILL) releases it with nothing to clean up. ``daemon.pid``
names the daemon for ``status`` and ``stop``; one left by a daemon that is gone is stale and
the next start removes it. ``status.json`` is replaced atomically every tick, so a reader
never sees half of it. The log (``watch.jsonl``, rotated) and ``daemon.stderr`` lie beside.

The daemon often runs as root and logs every job's command line: a directory another user
can write to would let them plant a link that turns those appends into writes to a
root-only file. So a daemon keeps its state only in a directory of its own user that no one
else can write to (a new one is made ``0700``), and opens every file there without
following a link. Whether a daemon runs rests on the lock, never on the pid file alone: a
stale pid may by now name another directory's daemon.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
from pathlib import Path
from typing import Any

import psutil

from tuneup.errors import UsageError
from tuneup.files import trusted_path, write_atomic
from tuneup.watch.safe_files import READ_FLAGS, open_append, read_regular

DAEMON_MODULE = "tuneup.watch.daemon"  # the daemon's command line names it: ``python -m ...``
MAX_STATUS_BYTES = 1 << 22
MAX_PID_BYTES = 32
LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


def not_private(status: os.stat_result) -> str | None:
    """Why a file or directory is not this user's alone to write (``None``: it is)."""
    if status.st_uid != os.geteuid():
        return f"belongs to user {status.st_uid}"
    if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "can be written by other users"
    return None


def check_log(path: Path) -> None:
    """Raise :class:`UsageError` unless ``--log``'s folder, and the log when it exists, are
    this user's and no one else can write to them (the state directory's rule): the log
    holds every job's command line, secrets included, and a folder another user owns lets
    them read it, plant a link or swap the file between rotations. A link at the name is
    left to the opening, which never follows one."""
    try:
        problem = not_private(os.stat(trusted_path(path.parent)))
        problem = f"its folder {path.parent} {problem}" if problem else None
        with contextlib.suppress(FileNotFoundError):
            status = os.lstat(path)
            if problem is None and stat.S_ISREG(status.st_mode):
                problem = not_private(status)
    except OSError as exc:
        raise UsageError(f"cannot write the log {path} ({exc.strerror or exc})") from None
    if problem is not None:
        raise UsageError(f"the log {path}: {problem}; it holds every job's command line, so "
                         "it must be a file of your own in a folder of your own that no one "
                         "else can write to: give another --log (e.g. in a new 0700 folder), "
                         "or none (the state directory's)")


def default_directory() -> Path:
    """``$XDG_STATE_HOME/tuneup/watch``, by default ``~/.local/state/tuneup/watch``."""
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "tuneup" / "watch"


class StateDir:
    """The files of one daemon's state directory."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = (path or default_directory()).expanduser().absolute()
        self.pid_file = self.path / "daemon.pid"
        self.lock_file = self.path / "daemon.lock"
        self.status_file = self.path / "status.json"
        self.log_file = self.path / "watch.jsonl"
        self.stderr_file = self.path / "daemon.stderr"

    def create(self) -> None:
        """Make the directory (``0700``) unless it exists, then :meth:`check` it."""
        try:
            self.path.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise UsageError(f"cannot create the state directory {self.path} "
                             f"({exc.strerror or exc})") from None
        self.check()

    def check(self) -> None:
        """Raise :class:`UsageError` unless the directory is this user's and no one else
        can write to it: the daemon's log and lock must not be reachable by others' links."""
        try:
            status = os.stat(trusted_path(self.path))
        except OSError as exc:
            raise UsageError(f"cannot use the state directory {self.path} "
                             f"({exc.strerror or exc})") from None
        problem = ("is not a directory" if not stat.S_ISDIR(status.st_mode)
                   else not_private(status))
        if problem is not None:
            raise UsageError(f"the state directory {self.path} {problem}: the daemon keeps "
                             "its log and lock only in a directory of its own user that no "
                             "one else can write to; give another --state-dir (a new one is "
                             "made 0700)")

    def lock(self) -> int:
        """Take the directory's lock and return its descriptor (held until the process
        ends); raises :class:`UsageError` naming the daemon that holds it already."""
        self.create()
        try:
            fd = os.open(self.lock_file, LOCK_FLAGS, 0o600)
        except OSError as exc:
            raise UsageError(f"cannot open {self.lock_file} ({exc.strerror or exc})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            pid = self.read_pid()
            raise UsageError(f"a daemon already watches with {self.path}"
                             + (f" (pid {pid})" if pid else "")
                             + ": `tuneup watch stop` it first, or give another --state-dir")
        return fd

    def open_stderr(self) -> int:
        """A descriptor appending to ``daemon.stderr`` (never through a link)."""
        return open_append(self.stderr_file)

    def read_pid(self) -> int | None:
        raw = read_regular(self.pid_file, MAX_PID_BYTES)
        text = raw.decode("ascii", errors="replace").strip() if raw is not None else ""
        return int(text) if text.isdigit() else None

    def locked(self) -> bool:
        """Some process holds the directory's lock now (a daemon runs with it): tried
        without blocking, and let go at once."""
        try:
            fd = os.open(self.lock_file, READ_FLAGS)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False
        finally:
            os.close(fd)  # closing lets go of the shared lock just taken
        return False

    def running_pid(self) -> int | None:
        """The daemon's pid when one holds this directory's lock and the pid file names
        it; ``None`` otherwise (no daemon, a stale pid file, or a pid now another
        directory's daemon or another program)."""
        pid = self.read_pid()
        if pid is None or not self.locked():
            return None
        try:
            process = psutil.Process(pid)
            alive = (process.status() != psutil.STATUS_ZOMBIE
                     and self.names_me(process.cmdline()))
        except psutil.Error:
            return None
        return pid if alive else None

    def names_me(self, cmdline: list[str]) -> bool:
        """``cmdline`` is a daemon's whose ``--state-dir`` is this directory."""
        if DAEMON_MODULE not in cmdline:
            return False
        given = [value for flag, value in zip(cmdline, cmdline[1:]) if flag == "--state-dir"]
        return any(os.path.realpath(value) == os.path.realpath(self.path) for value in given)

    def write_pid(self, pid: int) -> None:
        write_atomic(self.pid_file, f"{pid}\n")

    def remove_pid(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.pid_file.unlink()

    def write_status(self, status: dict[str, Any]) -> None:
        write_atomic(self.status_file, json.dumps(status, indent=1) + "\n")

    def read_status(self) -> dict[str, Any] | None:
        """The last status the daemon wrote; ``None`` when there is none or it is unreadable."""
        raw = read_regular(self.status_file, MAX_STATUS_BYTES + 1)
        try:
            data = json.loads(raw) if raw is not None and len(raw) <= MAX_STATUS_BYTES else None
        except ValueError:
            return None
        return data if isinstance(data, dict) else None
