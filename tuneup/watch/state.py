"""The daemon's state directory: where it lies, who holds it, and what the daemon last said.

``daemon.lock`` carries an exclusive ``flock`` that the running daemon holds for its whole
life: a second daemon on the same directory cannot take it and refuses to start, and a
daemon that dies (even by SIGKILL) releases it with nothing to clean up. ``daemon.pid``
names the daemon for ``status`` and ``stop``; one left by a daemon that is gone is stale and
the next start removes it. ``status.json`` is replaced atomically every tick, so a reader
never sees half of it. The log (``watch.jsonl``, rotated) and ``daemon.stderr`` lie beside.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import Any

import psutil

from tuneup.errors import UsageError
from tuneup.files import write_atomic

DAEMON_MODULE = "tuneup.watch.daemon"  # the daemon's command line names it: ``python -m ...``
MAX_STATUS_BYTES = 1 << 22


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
        try:
            self.path.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise UsageError(f"cannot create the state directory {self.path} "
                             f"({exc.strerror or exc})") from None

    def lock(self) -> int:
        """Take the directory's lock and return its descriptor (held until the process
        ends); raises :class:`UsageError` naming the daemon that holds it already."""
        self.create()
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            pid = self.read_pid()
            raise UsageError(f"a daemon already watches with {self.path}"
                             + (f" (pid {pid})" if pid else "")
                             + ": `tuneup watch stop` it first, or give another --state-dir")
        return fd

    def read_pid(self) -> int | None:
        try:
            text = self.pid_file.read_text(encoding="ascii", errors="replace").strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def running_pid(self) -> int | None:
        """The daemon's pid when it runs; ``None`` with no pid file or a stale one (the
        process is gone, a zombie, or some other program that took the pid over)."""
        pid = self.read_pid()
        if pid is None:
            return None
        try:
            process = psutil.Process(pid)
            alive = (process.status() != psutil.STATUS_ZOMBIE
                     and DAEMON_MODULE in process.cmdline())
        except psutil.Error:
            return None
        return pid if alive else None

    def write_pid(self, pid: int) -> None:
        write_atomic(self.pid_file, f"{pid}\n")

    def remove_pid(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.pid_file.unlink()

    def write_status(self, status: dict[str, Any]) -> None:
        write_atomic(self.status_file, json.dumps(status, indent=1) + "\n")

    def read_status(self) -> dict[str, Any] | None:
        """The last status the daemon wrote; ``None`` when there is none or it is unreadable."""
        try:
            with self.status_file.open("rb") as handle:
                raw = handle.read(MAX_STATUS_BYTES + 1)
            data = json.loads(raw) if len(raw) <= MAX_STATUS_BYTES else None
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None
