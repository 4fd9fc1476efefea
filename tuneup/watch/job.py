"""The watched process: one the watcher starts (with the runtime's feed installed), or one
it attaches to. Both wait the same way; only a started job has signals passed on to it
and an exit status to pass on.

A started job's feed directory is made by ``mkdtemp`` (a name nobody can know in advance)
under the temporary folder and holds a lock the watcher keeps for its life
(:mod:`tuneup.owned_dirs`): a watcher killed by SIGKILL cannot remove it, so the next
watcher removes those whose lock is free (:func:`sweep_stale_feeds`), as ``tuneup
autotune`` does with its work directories."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil

from tuneup import owned_dirs
from tuneup.errors import UsageError
from tuneup.runtime.hooks import ENV_OBSERVERS
from tuneup.site import SITE_DIR
from tuneup.watch import feed

FEED_PREFIX = "tuneup-watch-"  # + mkdtemp's random part; holds the watcher's lock file
POLL_S = 0.1  # how often an attached job is checked for having ended


def sweep_stale_feeds() -> list[Path]:
    """Remove the feed directories of watchers that are gone (killed with SIGKILL, say):
    this user's folders whose lock no watcher holds, in whatever pid namespace it ran (a
    pid says nothing across containers sharing ``/tmp``). Returns what was removed."""
    return owned_dirs.sweep(FEED_PREFIX)


@contextlib.contextmanager
def new_feed_directory() -> Iterator[Path]:
    """A new feed directory for a started job, locked while the watcher lives and removed
    when it ends."""
    sweep_stale_feeds()
    with owned_dirs.owned_dir(FEED_PREFIX) as folder:
        yield folder


class StartedJob:
    """``command`` run as a child, in the watcher's process group, with the terminal's
    stdin, stdout and stderr: its output passes through untouched."""

    def __init__(self, command: Sequence[str], feed_directory: Path) -> None:
        self.command = list(command)
        self.feed_directory = feed_directory
        observers = [o for o in os.environ.get(ENV_OBSERVERS, "").split(",") if o.strip()]
        python_path = [str(SITE_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]
        env = {**os.environ, feed.ENV_FEED: str(feed_directory),
               ENV_OBSERVERS: ",".join(dict.fromkeys([*observers, feed.OBSERVER])),
               # the plain-DataLoader probe: its sitecustomize loads in the job's Pythons only
               "PYTHONPATH": os.pathsep.join(python_path)}
        try:
            self.popen = subprocess.Popen(self.command, env=env)
        except FileNotFoundError:
            raise UsageError(f"no such command: {self.command[0]}") from None
        except PermissionError:
            raise UsageError(f"cannot run {self.command[0]}: permission denied") from None
        except OSError as exc:  # ENOEXEC: an executable script without a #! line, a binary
            hint = (f": run it as `tuneup watch -- python {self.command[0]}`, or give it a "
                    "#! line" if self.command[0].endswith(".py") else "")
            raise UsageError(f"cannot run {self.command[0]} ({exc.strerror or exc}){hint}") from None
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
        except (psutil.NoSuchProcess, ValueError, OverflowError):
            raise UsageError(f"--pid {pid}: no such process") from None
        except psutil.Error as exc:
            raise UsageError(f"--pid {pid}: cannot watch it ({exc})") from None
        self.pid = pid
        self._feed: Path | None = None

    @property
    def feed_directory(self) -> Path | None:
        """The feed of a job started with the watcher's observer and directory in its
        environment (readable for one's own processes only). Read again until found: a
        process caught between fork and exec still shows its parent's environment."""
        if self._feed is None:
            try:
                environ = self.process.environ()
            except psutil.Error:
                return None
            if feed.OBSERVER in environ.get(ENV_OBSERVERS, "") and environ.get(feed.ENV_FEED):
                self._feed = Path(environ[feed.ENV_FEED])
        return self._feed

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; True once the process has exited, a zombie its
        parent has not reaped included (``psutil``'s wait would wait for the reaping)."""
        end = time.monotonic() + timeout
        while not self.ended():
            left = end - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(POLL_S, left))
        return True

    def ended(self) -> bool:
        """Exited (zombie or reaped), or its pid taken over by another process."""
        try:
            return (not self.process.is_running()
                    or self.process.status() == psutil.STATUS_ZOMBIE)
        except psutil.NoSuchProcess:
            return True
        except psutil.Error:
            return False

    def exit_status(self) -> None:
        return None

    def pass_on(self, signum: int) -> None:
        """Nothing: stopping the watcher leaves the job alone."""


Job = StartedJob | AttachedJob
