"""The trials' temporary folder: inside the run's work folder, so that what a killed trial
leaves there (multiprocessing's ``pymp-*`` folders, inductor's cache) goes with it.

Unless that makes the path too long for a Unix socket: multiprocessing binds its socket at
``$TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX``, and past the 107 bytes of ``sun_path`` the bind
fails in a DataLoader worker's feeder thread, unseen, and the loop waits for that batch
forever (a TMPDIR of 50 characters was enough). There the trials keep the user's TMPDIR.
"""

from __future__ import annotations

from pathlib import Path

UNIX_SOCKET_PATH_MAX = 107  # Linux's sun_path, less its terminating NUL
PYMP_SOCKET = len("/pymp-XXXXXXXX/listener-XXXXXXXX")  # what multiprocessing appends


def trial_tmpdir(workdir: Path) -> Path | None:
    """``workdir/tmp``, made; None where a socket under it could not be bound (the trials
    then keep the user's TMPDIR)."""
    scratch = workdir / "tmp"
    if len(str(scratch).encode()) + PYMP_SOCKET > UNIX_SOCKET_PATH_MAX:
        return None
    scratch.mkdir(exist_ok=True)
    return scratch
