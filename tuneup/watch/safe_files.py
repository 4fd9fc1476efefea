"""Opening files another user may have planted, for a watcher that often runs as root.

A job's script and its feed directory belong to whoever started the job, and so may hold a
symbolic link to a root-only file or a named pipe: following the link reads or appends to a
file the planter could not touch, and opening a pipe blocks until someone writes to it,
freezing the daemon for every job. So files here are opened with ``O_NOFOLLOW`` (a link at
the name is refused), ``O_NONBLOCK`` (a pipe or a device answers at once) and ``O_CLOEXEC``
(no job the watcher starts inherits them), read only when ``fstat`` says they are regular
files, and never past a bound.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def read_regular(path: Path, limit: int, *, tail: bool = False) -> bytes | None:
    """At most ``limit`` bytes of ``path`` (its last ones with ``tail``); ``None`` when it
    is missing, unreadable, a link, or no regular file."""
    try:
        fd = os.open(path, READ_FLAGS)
    except OSError:
        return None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            return None
        if tail and status.st_size > limit:
            os.lseek(fd, status.st_size - limit, os.SEEK_SET)
        chunks: list[bytes] = []
        left = limit
        while left > 0 and (chunk := os.read(fd, left)):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def open_append(path: Path) -> int:
    """A descriptor appending to ``path`` (created ``0600``); raises ``OSError`` when the
    name is a link or no regular file, rather than write through it."""
    fd = os.open(path, APPEND_FLAGS, 0o600)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    os.set_blocking(fd, True)
    return fd
