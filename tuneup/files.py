"""Writing a file so that a reader sees the old version or the new one, never half of one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: str | bytes, *, durable: bool = True) -> None:
    """``data`` (text, as UTF-8, or bytes) into ``path`` through a temporary file beside it
    and a rename.

    The file gets the permissions of any new file (the umask decides; the temporary file's
    0600 is not kept). ``durable`` syncs it to disk before the rename, so a crash of the
    machine leaves the old file rather than an empty one; a file rewritten every second for
    a live reader can skip that. A failed write leaves no temporary file behind.
    """
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it: put it straight back
    os.umask(mask)
    return mask
