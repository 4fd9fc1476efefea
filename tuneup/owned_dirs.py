"""Work folders under the temporary folder whose liveness is a lock their owner holds.

``tuneup autotune``'s work folder and ``tuneup watch``'s feed folder outlive an owner killed
by SIGKILL, so the next start sweeps them. A pid says nothing about liveness when the
temporary folder is shared across pid namespaces (a container with ``-v /tmp:/tmp``, a
cluster's shared ``TMPDIR``): there, the live run of another namespace looks dead. So each
folder holds a lock file its owner keeps an ``flock`` lock on for its whole life (the kernel
drops it when the owner dies, however it dies); a sweep removes a folder only once it holds
that lock itself, exclusively. Folders are born under a hidden name and renamed into view
only with their lock held, so a sweep never sees one before its owner locks it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

LOCK_NAME = "owner.lock"
BORN_PREFIX = ".tuneup-born-"  # a folder being made: not yet its final name
NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}  # flock unsupported


class OwnedDir:
    """A new folder ``<tmp>/<prefix><random>`` locked (shared) by this process until
    :meth:`release`; other holders (a sentinel) may take the same shared lock."""

    def __init__(self, prefix: str, parent: Path | None = None) -> None:
        parent = Path(parent or tempfile.gettempdir())
        born = Path(tempfile.mkdtemp(prefix=BORN_PREFIX, dir=parent))
        try:
            self.fd = hold(born / LOCK_NAME, create=True)
            final = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
            os.replace(born, final)  # an empty folder is replaced whole: atomic, lock inside
        except BaseException:
            shutil.rmtree(born, ignore_errors=True)
            raise
        self.path = final

    def beat(self) -> None:
        """Mark the lock file's mtime now: what a sweep takes as the owner's last sign of life
        (changes a dead run's journal did not make come after it)."""
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.utime(self.fd)

    def release(self) -> None:
        """Drop the lock (after the folder is removed: a sweep may take it from here on)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def hold(lock: Path, create: bool = False) -> int:
    """A descriptor of ``lock`` with a shared lock on it (not inherited by children). On a
    file system without locks (some FUSE mounts) it is held unlocked: no sweep can then take
    the folder (it cannot prove the owner dead), only the owner removes it."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(lock, flags, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except OSError as exc:
        if exc.errno not in NO_LOCKS:
            os.close(fd)
            raise
    except BaseException:
        os.close(fd)
        raise
    return fd


def take_if_dead(folder: Path) -> int | None:
    """A descriptor holding ``folder``'s lock exclusively when no owner holds it (the owner
    is dead, in whatever namespace it ran); ``None`` while one lives, or when the folder is
    not one of this user's (a link, another owner's, no lock file: not ours to judge)."""
    try:
        status = os.lstat(folder)
        if not stat.S_ISDIR(status.st_mode) or status.st_uid != os.geteuid():
            return None
        fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def last_beat(folder: Path) -> float:
    """When the owner of ``folder`` was last alive (see :meth:`OwnedDir.beat`)."""
    return os.lstat(folder / LOCK_NAME).st_mtime


def sweep(prefix: str, before_remove: Callable[[Path], object] = lambda folder: None,
          parent: Path | None = None) -> list[Path]:
    """Remove this user's folders ``<prefix>*`` (and half-born ones) whose owner is dead:
    ``before_remove(folder)`` first (put back what the dead run changed), while the lock
    is held, so that no second sweep works on the same folder. Returns what was removed."""
    parent = Path(parent or tempfile.gettempdir())
    removed = []
    for folder in [*parent.glob(f"{prefix}*"), *parent.glob(f"{BORN_PREFIX}*")]:
        fd = take_if_dead(folder)
        if fd is None:
            continue
        try:
            before_remove(folder)
            shutil.rmtree(folder)
            removed.append(folder)
        except OSError:
            pass  # left for the next sweep
        finally:
            os.close(fd)
    return removed


@contextlib.contextmanager
def owned_dir(prefix: str) -> Iterator[Path]:
    """An :class:`OwnedDir` for a ``with`` block: removed, then released, at its end."""
    owned = OwnedDir(prefix)
    try:
        yield owned.path
    finally:
        shutil.rmtree(owned.path, ignore_errors=True)
        owned.release()
