"""Replaying a write guard's journal: each path the trial changed goes back as it was.

Not just the bytes: a file the trial wrote in place gets its original bytes back in the same
inode (its other hard links, a DVC cache or an rsync snapshot, see them too); a symbolic link
the trial removed, replaced or renamed comes back as the same link; mode, owner (when root
tunes another user's script) and times come back, and so does a ``chmod`` or ``utime`` the
trial made. A replayed journal is renamed aside: replaying twice would remove files made
since, so a journal is replayed once, by whoever holds its work folder (runner, sentinel or
the next start's sweep).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from tuneup.files import copy_atomic

REPLAYED_SUFFIX = ".replayed"


def metadata(status: os.stat_result) -> dict[str, int]:
    """What of a path's status comes back with it (and tells an in-place write from a new file)."""
    return {"mode": stat.S_IMODE(status.st_mode), "uid": status.st_uid, "gid": status.st_gid,
            "atime_ns": status.st_atime_ns, "mtime_ns": status.st_mtime_ns,
            "ino": status.st_ino, "dev": status.st_dev}


def restore(journal: Path, until: float | None = None, left: list[str] | None = None
            ) -> list[str]:
    """Put back every path the journal names, newest first; returns those that had something
    to put back (a copy, a link, metadata, or a path that did not exist), for the report. A
    journal line cut by a kill is ignored: its change had not started.

    ``until``: the time (of the file system's clock) the run was last known alive; a path
    changed after it was changed by someone else since the run died (the user's next real
    run) and stays as it is, named in ``left``, as is a path that could not be put back
    (one the script made unwritable)."""
    try:
        lines = journal.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    entries = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("path"), str):
            entries.append(entry)
    late = {entry["path"] for entry in entries
            if until is not None and _changed_after(entry["path"], until)}
    failed = set()
    for entry in reversed(entries):
        if entry["path"] not in late and not put_back(entry):
            failed.add(entry["path"])
    with contextlib.suppress(OSError):
        os.replace(journal, journal.with_name(journal.name + REPLAYED_SUFFIX))
    if left is not None:
        left.extend(sorted(late | failed))
    return list(dict.fromkeys(entry["path"] for entry in entries
                              if _changed(entry) and entry["path"] not in late | failed))


def _changed_after(path: str, until: float) -> bool:
    try:
        return os.lstat(path).st_ctime > until
    except OSError:
        return False


def armed(journal: Path) -> bool:
    """Whether the guard made ``journal`` (replayed since, or not yet)."""
    return journal.exists() or journal.with_name(journal.name + REPLAYED_SUFFIX).exists()


def _changed(entry: dict[str, Any]) -> bool:
    return bool(entry.get("copy") or entry.get("link") is not None or not entry.get("existed")
                or entry.get("meta_only"))


def put_back(entry: dict[str, Any]) -> bool:
    """One journal entry, undone; False when it could not be (a path the script made
    unwritable stays as it is)."""
    path, copy, source = entry["path"], entry.get("copy"), entry.get("renamed_from")
    meta, link = entry.get("meta"), entry.get("link")
    try:
        if entry.get("meta_only"):  # a chmod, chown or utime undone (content entries come first)
            if os.path.lexists(path):
                _apply(path, meta)
            return True
        if source and not os.path.lexists(source) and os.path.isdir(path):
            os.rename(path, source)  # a folder moved whole goes back whole
        if copy:
            if not os.path.exists(copy):
                return True  # put back already (a replay cut short, run again)
            _put_back_file(path, Path(copy), meta)
            os.unlink(copy)
        elif link is not None:
            if not (os.path.islink(path) and os.readlink(path) == link):
                remove(path)
                os.symlink(link, path)
            _apply(path, meta)
        elif entry.get("folder") and entry.get("existed"):
            os.makedirs(path, exist_ok=True)  # removed (rmtree): its files follow, newest first
            _apply(path, meta, times=False)  # its times change with every file put back
        elif not entry.get("existed"):
            remove(path)
        elif os.path.lexists(path):
            _apply(path, meta)  # the same bytes: only owner, mode or times changed
    except OSError:
        return False
    return True


def _put_back_file(path: str, copy: Path, meta: dict[str, int] | None) -> None:
    """The original bytes at ``path``: into the same inode when the trial wrote in place,
    else as a new file (atomically, through no other user's link)."""
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        status = None
    same = (status is not None and stat.S_ISREG(status.st_mode) and meta is not None
            and (status.st_ino, status.st_dev) == (meta["ino"], meta["dev"]))
    if same:
        if not status.st_mode & stat.S_IWUSR:
            os.chmod(path, stat.S_IMODE(status.st_mode) | stat.S_IWUSR)  # a trial's chmod 0444
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "wb") as target, copy.open("rb") as original:
            shutil.copyfileobj(original, target, 1 << 20)
            target.flush()
            os.fsync(target.fileno())
    else:
        if status is not None and (stat.S_ISLNK(status.st_mode) or stat.S_ISDIR(status.st_mode)):
            remove(path)
        copy_atomic(copy, Path(path))
    _apply(path, meta)


def _apply(path: str, meta: dict[str, int] | None, times: bool = True) -> None:
    """Owner (as root, or when it is this user's to give), mode and times, never through a
    link (a link's own mode means nothing on Linux)."""
    if not meta:
        return
    link = os.path.islink(path)
    if (meta["uid"], meta["gid"]) != _owner(path):
        with contextlib.suppress(OSError):
            os.chown(path, meta["uid"], meta["gid"], follow_symlinks=False)
    if not link:
        os.chmod(path, meta["mode"])
    if times:
        with contextlib.suppress(NotImplementedError, OSError):
            os.utime(path, ns=(meta["atime_ns"], meta["mtime_ns"]), follow_symlinks=False)


def _owner(path: str) -> tuple[int, int]:
    status = os.lstat(path)
    return status.st_uid, status.st_gid


def remove(path: str) -> None:
    """A file or link; a folder only when empty (one filled since, by whom?, stays)."""
    if os.path.isdir(path) and not os.path.islink(path):
        os.rmdir(path)
    elif os.path.lexists(path):
        os.unlink(path)
