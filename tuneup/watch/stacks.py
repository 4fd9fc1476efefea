"""The job's Python stacks through py-spy: how much of the training thread's time goes to
the DataLoader, for a job whose CPU alone cannot tell loading from compute.

A job with no runtime feed, no GPU and no DataLoader workers loads and computes in one
thread. py-spy (an optional extra, ``pip install 'tuneup[stacks]'``) reads that thread's
stacks from outside, by ptrace, and a sample is *loading* when one of its frames is the
DataLoader's own code (``torch/utils/data/``: ``__next__``, ``_next_data``, the fetcher,
collate; the dataset's ``__getitem__`` runs beneath them). Idle samples count too, so the
share is of wall time, as the runtime's data-wait share is.

:class:`StackSampler` runs ``py-spy record --format raw`` in windows of :data:`WINDOW_S`
seconds at :data:`RATE_HZ`, without pausing the job (``--nonblocking``), and only while the
watcher asks for it; :func:`parse` turns a window's output into plain counts.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sysconfig
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuneup.watch.samples import StackCounts

EXECUTABLE = "py-spy"
LOADER_CODE = "torch/utils/data/"  # the DataLoader, its fetchers, collate and samplers
RATE_HZ = 10  # samples a second: 50 a window; py-spy takes ~0.8 % of a core here
WINDOW_S = 5  # py-spy's --duration takes whole seconds
CLOSE_TIMEOUT_S = 2.0
MAX_FAILURES = 3  # windows in a row that read no stacks of a process before it is left alone
INSTALL_NOTE = ("py-spy is not installed, so loading could not be told from compute (no "
                "feed, GPU or DataLoader workers): pip install 'tuneup[stacks]'")
PTRACE_NOTE = ("py-spy may not read the job's stacks (ptrace refused), so loading could not "
               "be told from compute: run the watcher as root or as the job's user with "
               "`sysctl kernel.yama.ptrace_scope=0`; in a container, `--cap-add SYS_PTRACE`")

Spawn = Callable[..., "subprocess.Popen[bytes]"]


def parse(raw: str) -> StackCounts | None:
    """Counts from py-spy's raw output (``thread (TID): NAME;frame;frame COUNT`` per line,
    recorded with ``--threads``): of the thread with the most loading samples, else of the
    busiest thread. ``None`` when there is no sample."""
    threads: dict[str, list[int]] = {}  # thread -> [loading, total]
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        thread, _, frames = stack.partition(";")
        counts = threads.setdefault(thread, [0, 0])
        counts[0] += int(count) if LOADER_CODE in frames else 0
        counts[1] += int(count)
    if not threads:
        return None
    loading, total = max(threads.values())
    return StackCounts(loading, total) if total else None


def find_py_spy() -> str | None:
    """py-spy beside this Python (a virtualenv's scripts need not be on PATH), else on PATH."""
    beside = Path(sysconfig.get_path("scripts")) / EXECUTABLE
    return str(beside) if os.access(beside, os.X_OK) else shutil.which(EXECUTABLE)


def _refused(stderr: str) -> bool:
    text = stderr.lower()
    return "permission denied" in text or "operation not permitted" in text


def _error_line(stderr: str) -> str:
    """py-spy's own message, without its backtrace."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return next((line for line in lines if line.startswith("Error:")),
                lines[0] if lines else "no message")


class StackSampler:
    """py-spy in successive windows on the process :meth:`poll` names. ``note`` says what
    went wrong (not installed, not runnable, ptrace refused: it stops; a process py-spy
    failed to read :data:`MAX_FAILURES` times in a row, a shell say: that one is left
    alone) — ``None`` while it works or was never asked. ``spawn`` starts py-spy
    (``subprocess.Popen``'s signature)."""

    def __init__(self, executable: str | None, spawn: Spawn = subprocess.Popen) -> None:
        self.executable = executable
        self.spawn = spawn
        self.note: str | None = None
        self.stopped = False  # not installed, or ptrace refused: no window will read anything
        self.window: subprocess.Popen[bytes] | None = None
        self.target: int | None = None  # the process the window reads
        self.failures: dict[int, int] = {}  # pid -> windows in a row that read nothing
        self._folder: tempfile.TemporaryDirectory[str] | None = None

    def _path(self, name: str) -> Path:
        """A file of the sampler's own temporary directory (made when first needed)."""
        if self._folder is None:
            self._folder = tempfile.TemporaryDirectory(prefix="tuneup-stacks-")
        return Path(self._folder.name) / name

    def poll(self, pid: int | None) -> StackCounts | None:
        """The counts of a window that ended since the last call; then, when ``pid`` is
        given (its stacks are wanted) and no window runs, the next window on it."""
        ended = self.window is not None and self.window.poll() is not None
        counts = self._collect() if ended else None
        if (pid is not None and self.window is None and not self.stopped
                and self.failures.get(pid, 0) < MAX_FAILURES):
            self._start(pid)
        return counts

    def close(self) -> StackCounts | None:
        """Ends the running window (py-spy writes what it took on SIGINT) and returns its
        counts: the job's last seconds."""
        counts = None
        if self.window is not None:
            if self.window.poll() is None:
                self.window.send_signal(signal.SIGINT)
            try:
                self.window.wait(CLOSE_TIMEOUT_S)
                counts = self._collect()
            except subprocess.TimeoutExpired:
                self.window.kill()
                self.window.wait()
                self.window = None
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None
        return counts

    def __enter__(self) -> StackSampler:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _start(self, pid: int) -> None:
        if self.executable is None:
            self.note, self.stopped = INSTALL_NOTE, True
            return
        self.target = pid
        output = self._path("stacks.txt")
        output.unlink(missing_ok=True)
        with self._path("stderr.txt").open("wb") as stderr:  # a file: py-spy never blocks on it
            try:
                self.window = self.spawn(
                    [self.executable, "record", "--pid", str(pid), "--format", "raw",
                     "--rate", str(RATE_HZ), "--duration", str(WINDOW_S), "--idle", "--threads",
                     "--nonblocking", "--nolineno", "--full-filenames", "--output", str(output)],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                    start_new_session=True)  # a Ctrl-C meant for the job does not cut the window
            except OSError as exc:
                why = exc.strerror or exc
                self.note = f"py-spy could not be started ({self.executable}: {why})"
                self.stopped = True

    def _collect(self) -> StackCounts | None:
        """The ended window's counts, or why it read none."""
        assert self.window is not None
        window, self.window = self.window, None
        stderr = self._path("stderr.txt").read_text(errors="replace")
        output = self._path("stacks.txt")
        counts = parse(output.read_text(errors="replace")) if output.exists() else None
        pid = self.target
        assert pid is not None
        if counts is not None:
            self.failures.pop(pid, None)
            return counts
        if window.returncode and _refused(stderr):
            self.note, self.stopped = PTRACE_NOTE, True
        elif window.returncode:  # not Python (yet), or it ended: a later window may read it
            self.failures[pid] = self.failures.get(pid, 0) + 1
            if self.failures[pid] >= MAX_FAILURES:
                self.note = (f"py-spy could not read the stacks of process {pid}: "
                             f"{_error_line(stderr)}")
        return None
