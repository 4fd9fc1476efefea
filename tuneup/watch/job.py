"""The watched process: one the watcher starts (with the runtime's feed installed), or one
it attaches to. Both wait the same way; only a started job has signals passed on to it
and an exit status to pass on."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import psutil

from tuneup.errors import UsageError
from tuneup.runtime.hooks import ENV_OBSERVERS
from tuneup.watch import feed


class StartedJob:
    """``command`` run as a child, in the watcher's process group, with the terminal's
    stdin, stdout and stderr: its output passes through untouched."""

    def __init__(self, command: Sequence[str], feed_directory: Path) -> None:
        self.command = list(command)
        self.feed_directory = feed_directory
        observers = [o for o in os.environ.get(ENV_OBSERVERS, "").split(",") if o.strip()]
        env = {**os.environ, feed.ENV_FEED: str(feed_directory),
               ENV_OBSERVERS: ",".join(dict.fromkeys([*observers, feed.OBSERVER]))}
        try:
            self.popen = subprocess.Popen(self.command, env=env)
        except FileNotFoundError:
            raise UsageError(f"no such command: {self.command[0]}") from None
        except PermissionError:
            raise UsageError(f"cannot run {self.command[0]}: permission denied") from None
        self.pid = self.popen.pid

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; True once the job has ended."""
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def exit_status(self) -> int | None:
        """The job's status as a shell reports it (128 + N when signal N ended it)."""
        code = self.popen.returncode
        return 128 - code if code is not None and code < 0 else code

    def pass_on(self, signum: int) -> None:
        """Send ``signum`` on, unless it is a Ctrl-C the terminal gave the job already (the
        job shares the watcher's foreground process group)."""
        if signum == signal.SIGINT and _terminal_foreground():
            return
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(signum)


def _terminal_foreground() -> bool:
    """True when this process group is its terminal's foreground group: a Ctrl-C typed
    there went to every member, the job included."""
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgrp()
        except (AttributeError, OSError, ValueError):
            continue
    return False


class AttachedJob:
    """A running process the watcher did not start: watched until it ends or the watcher
    is told to stop; signals are the watcher's alone, and its exit status is not known."""

    command = None

    def __init__(self, pid: int) -> None:
        if pid in (os.getpid(), os.getppid()):
            raise UsageError(f"--pid {pid} is the watcher itself (or its shell)")
        try:
            self.process = psutil.Process(pid)
        except psutil.NoSuchProcess:
            raise UsageError(f"--pid {pid}: no such process") from None
        except psutil.Error as exc:
            raise UsageError(f"--pid {pid}: cannot watch it ({exc})") from None
        self.pid = pid
        self.feed_directory = self._feed_directory()

    def _feed_directory(self) -> Path | None:
        """The feed of a job started with the watcher's observer and directory in its
        environment (readable for one's own processes only)."""
        try:
            environ = self.process.environ()
        except psutil.Error:
            return None
        if feed.OBSERVER not in environ.get(ENV_OBSERVERS, "") or not environ.get(feed.ENV_FEED):
            return None
        return Path(environ[feed.ENV_FEED])

    def wait(self, timeout: float) -> bool:
        try:
            self.process.wait(timeout)
        except psutil.TimeoutExpired:
            return False
        return True

    def exit_status(self) -> None:
        return None

    def pass_on(self, signum: int) -> None:
        """Nothing: stopping the watcher leaves the job alone."""


Job = StartedJob | AttachedJob
