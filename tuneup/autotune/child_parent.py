"""The child's tie to ``tuneup autotune``: a trial process never outlives its parent.

A parent-death signal where Linux offers one, and a check of the parent's liveness at every
step (one syscall): under torchrun the direct parent is its agent and ``tuneup autotune``
an ancestor, so both are checked.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

import psutil

from tuneup.autotune import protocol


def die_with_parent(parent_pid: int | None) -> None:
    """Never outlive ``tuneup autotune``: a parent-death signal (Linux), and a check now in
    case the parent is already gone; :func:`parent_gone` checks again at every step."""
    if parent_pid is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid and not descends_from(parent_pid):
        os._exit(protocol.EXIT_TRIAL_FAILED)


def descends_from(pid: int) -> bool:
    try:
        return any(parent.pid == pid for parent in psutil.Process().parents())
    except psutil.Error:
        return False


def parent_gone(parent_pid: int, direct_parent: int) -> bool:
    """The direct parent changed (it died), or ``tuneup autotune`` above it is gone."""
    if os.getppid() != direct_parent:
        return True
    return direct_parent != parent_pid and not protocol.alive(parent_pid)
