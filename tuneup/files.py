"""Writing files safely on a shared machine: atomically, and never through another user's link.

tuneup is often run as root on machines where other users can write to the script's folder
or to ``/tmp``. A symbolic link planted there must not turn a settings file, a summary or a
log into a write to a file the planter could not touch. So every write here goes to a
fresh ``mkstemp`` name (``O_EXCL``: never an existing file, never a link) that is then
renamed over the target (a rename replaces a link, it never follows one); a link in the
target's path is followed only when this user (or root) owns it.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

MAX_LINK_HOPS = 40  # as the kernel's own limit on nested links (ELOOP)


class ForeignLinkError(OSError):
    """A symbolic link on the way to a file tuneup writes belongs to another user."""

    def __init__(self, link: Path, owner: int) -> None:
        super().__init__(errno.ELOOP, f"{link} is a symbolic link owned by user {owner}; "
                         "tuneup writes through no other user's link: remove it or "
                         "write elsewhere", str(link))


def write_atomic(path: Path, data: str | bytes, *, durable: bool = True) -> None:
    """``data`` (text, as UTF-8, or bytes) into ``path`` through a temporary file beside it
    and a rename.

    A symbolic link at ``path`` (or on its way) that this user or root owns is written
    through: its target is replaced, the link stays; another user's link raises
    :class:`ForeignLinkError` before anything is written. The file gets the permissions of
    any new file (the umask decides; the temporary file's 0600 is not kept). ``durable``
    syncs it to disk before the rename, so a crash of the machine leaves the old file
    rather than an empty one; a file rewritten every second for a live reader can skip
    that. A failed write leaves no temporary file behind.
    """
    _replace(trusted_path(path), lambda fd, temporary: _fill(fd, data, durable))


def copy_atomic(source: Path, path: Path) -> None:
    """``source``'s bytes, mode and times at ``path``, as :func:`write_atomic` writes (a
    temporary file beside it, then a rename: an interrupted copy never leaves half a file),
    streamed, so a checkpoint of gigabytes is never held in memory. Makes ``path``'s folder."""
    target = trusted_path(path)
    target.parent.mkdir(parents=True, exist_ok=True)

    def fill(fd: int, temporary: str) -> None:
        os.close(fd)
        shutil.copy2(source, temporary)  # the source may lie on another file system

    _replace(target, fill)


def _replace(target: Path, fill: Callable[[int, str], None]) -> None:
    """``fill(fd, name)`` a new temporary file beside ``target``, then rename it over it; a
    failure leaves no temporary file behind."""
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        fill(fd, temporary)
        os.replace(temporary, target)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise


def write_new(directory: Path, prefix: str, data: str | bytes) -> Path:
    """``data`` in a new file of ``directory`` whose name nobody could know in advance
    (for copies kept in a shared temporary folder); returns its path."""
    fd, name = tempfile.mkstemp(prefix=prefix, dir=trusted_path(directory))
    try:
        _fill(fd, data, durable=True)
    except BaseException:
        os.unlink(name)
        raise
    return Path(name)


def trusted_path(path: Path) -> Path:
    """``path`` made absolute with every symbolic link on it resolved, each checked to be
    owned by this user or root; raises :class:`ForeignLinkError` at the first that is not.

    Links that do not exist yet are fine (the path is where a new file will be created).
    """
    pending = list(Path(os.path.abspath(path)).parts[1:])
    resolved = Path(Path(os.path.abspath(path)).anchor)
    hops = 0
    while pending:
        name = pending.pop(0)
        if name == "..":
            resolved = resolved.parent
            continue
        candidate = resolved / name
        try:
            status = os.lstat(candidate)
        except (FileNotFoundError, NotADirectoryError):
            return candidate.joinpath(*pending)
        if not stat.S_ISLNK(status.st_mode):
            resolved = candidate
            continue
        if status.st_uid not in {os.geteuid(), 0}:
            raise ForeignLinkError(candidate, status.st_uid)
        hops += 1
        if hops > MAX_LINK_HOPS:
            raise OSError(errno.ELOOP, "too many levels of symbolic links", str(path))
        link = Path(os.readlink(candidate))
        if link.is_absolute():
            resolved = Path(link.anchor)
        pending[:0] = [part for part in link.parts if part != link.anchor]
    return resolved


def _fill(fd: int, data: str | bytes, durable: bool) -> None:
    """Write and close ``fd`` with the permissions any new file gets."""
    with os.fdopen(fd, "wb") as handle:
        os.fchmod(handle.fileno(), 0o666 & ~_umask())
        handle.write(data.encode("utf-8") if isinstance(data, str) else data)
        if durable:
            handle.flush()
            os.fsync(handle.fileno())


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it: put it straight back
    os.umask(mask)
    return mask
