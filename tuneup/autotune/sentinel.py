"""When a ``tuneup autotune`` run dies (SIGKILL, the OOM killer): its trials die with it, and
what they changed in the user's files is put back at once, not only at the next start.

A trial process is started through :data:`DIE_WITH_PARENT`, so it gets SIGKILL when the run
dies: a process killed that way cannot put anything back itself. So the run starts a
sentinel with its first trial: a small process in a session of its own that holds the work
folder's lock (shared, so no sweep takes the folder while it waits) and blocks reading a
pipe only the run can write. The pipe ends when the run does, however it ends; then the
sentinel kills what is left of the trials (processes carrying the run's marker), takes the
lock alone, and, if the run did not remove its folder itself, replays its journals and
snapshot and removes it. Killed together with the run (a cgroup's kill), the next start's
sweep does the same.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tuneup import owned_dirs
from tuneup.autotune.leftovers import Recovered, replay_workdir
from tuneup.autotune.protocol import ENV_MARKER

if TYPE_CHECKING:
    import psutil

# `python -c DIE_WITH_PARENT PARENT_PID PROGRAM ARGS...`: ask for SIGKILL when the parent
# dies (Linux), then exec PROGRAM, which keeps it. So a SIGKILLed `tuneup autotune` takes the
# script with it even while it imports, and under torchrun the agent, whose death kills the
# ranks in turn (each sets the same signal) — even a rank stuck in a collective. (Set here,
# not in a preexec_fn: forking a threaded parent makes that unsafe.)
DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG\n"
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(3)  # the parent died before the signal was set\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


class Sentinel:
    """The run's side: the sentinel process and the pipe's write end."""

    def __init__(self, workdir: Path, marker_prefix: str) -> None:
        read, self.write = os.pipe()  # neither inherited by the trials
        try:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", __name__, str(workdir), marker_prefix, str(read)],
                pass_fds=(read,), start_new_session=True, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        finally:
            os.close(read)

    def stop(self) -> None:
        """After the run removed its folder: the sentinel finds nothing to do, and ends."""
        if self.write >= 0:
            os.close(self.write)
            self.write = -1
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=10)


def watch(workdir: Path, marker_prefix: str, pipe: int) -> None:
    """The sentinel's life: wait for the run's end, then clean up after it if it died."""
    try:
        lock = owned_dirs.hold(workdir / owned_dirs.LOCK_NAME)
    except OSError:
        return  # the run has ended already, and removed its folder
    while os.read(pipe, 4096):
        pass  # nothing is ever written: the end of the pipe is the message
    if not os.path.isdir(workdir):
        return  # the run ended itself: trials ended, files put back, folder removed
    kill_marked(marker_prefix, prefix=True)  # a process the script detached outlives its trial
    with contextlib.suppress(OSError):  # no locks on this file system: no sweep takes it
        fcntl.flock(lock, fcntl.LOCK_EX)  # the run's lock is gone with it; a sweep may hold it
    if os.path.isdir(workdir):
        replay_workdir(workdir, Recovered())
        shutil.rmtree(workdir, ignore_errors=True)


def kill_marked(marker: str, passes: int = 5, *, prefix: bool = False) -> None:
    """SIGKILL this user's processes whose environment carries ``marker`` (see
    :data:`protocol.ENV_MARKER`; with ``prefix``, any marker it begins: every trial of a
    run), and wait for them: a process the script detached with a double fork was
    reparented out of its tree, where ``kill_tree`` cannot see it, and one in a session of
    its own is out of reach once the script has exited. Looked for again while one is
    found (it may have forked as it was killed). About 25 ms on a machine of 80 processes."""
    import psutil

    for _ in range(passes):
        found = [process for process in psutil.process_iter(["uids"])
                 if _carries(process, marker, prefix)]
        if not found:
            return
        for process in found:
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(found, timeout=1.0)


def _carries(process: psutil.Process, marker: str, prefix: bool) -> bool:
    """Whether ``process`` (of this user, not this one) was started with ``marker``."""
    import psutil

    uids = process.info.get("uids")
    if process.pid == os.getpid() or uids is None or uids.real != os.getuid():
        return False
    try:
        carried = process.environ().get(ENV_MARKER, "")
    except psutil.Error:  # gone, a zombie, or unreadable
        return False
    return carried.startswith(marker) if prefix else carried == marker


if __name__ == "__main__":
    watch(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
