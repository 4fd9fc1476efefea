"""The script's folder as it was before the first trial: the second line behind the journal.

The write guard journals what Python's audit hook and the wrapped native writers see; a
writer it does not see (another native library, a process the script spawns, a file written
through a descriptor from elsewhere) would change the user's files unnoticed. So before the
first trial the runner records the script's folder tree (path, kind, size, mtime, mode,
owner, link target) and keeps a copy of each small file; after every trial process, once its
journal is replayed, the folder is compared with that record: a file changed or removed is
put back from its copy, a link as the link, a mode as it was; a new file or folder is
removed; a changed file with no copy (too big to copy up front) is named as not put back.
Bounded: at most :data:`MAX_ENTRIES` entries are recorded (version control and cache folders
skipped), files above :data:`MAX_FILE_BYTES` or past :data:`MAX_TOTAL_BYTES` are not copied;
a world-writable folder (the script in ``/tmp`` itself) is not recorded. Only changes made
while a trial process ran count as the trials': anyone's change to the folder in that time
is undone too, and named in the report.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuneup.autotune.put_back import metadata, put_back, remove

MAX_ENTRIES = 20_000
MAX_FILE_BYTES = 4 << 20
MAX_TOTAL_BYTES = 128 << 20
SKIPPED = frozenset({".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".pytest_cache",
                     ".ruff_cache", ".ipynb_checkpoints"})
SKIPPED_PREFIXES = ("tuneup-autotune-", "tuneup-watch-", ".tuneup-born-")  # tuneup's own folders
MANIFEST = "manifest.json"


@dataclass
class Comparison:
    """After a trial process: what the folder compare put back, and what it could not."""

    put_back: list[str] = field(default_factory=list)
    not_put_back: list[str] = field(default_factory=list)


class FolderSnapshot:
    """The record of one folder tree, kept in ``store`` (so a sweep after a SIGKILL reads it)."""

    def __init__(self, root: str, entries: dict[str, dict[str, Any]], complete: bool,
                 store: Path, owner: int) -> None:
        self.root, self.entries, self.complete, self.store = root, entries, complete, store
        self.owner = owner  # of the script's folder

    @classmethod
    def take(cls, root: Path, store: Path, exclude: tuple[Path, ...] = ()) -> FolderSnapshot:
        """Record ``root`` (and copy its small files into ``store``), leaving ``exclude``
        (the run's own work folder) out."""
        store.mkdir(parents=True, exist_ok=True)
        root_path = os.path.realpath(root)
        excluded = {os.path.realpath(p) for p in exclude}
        entries: dict[str, dict[str, Any]] = {}
        copied = 0
        root_status = os.stat(root_path)
        shared = bool(root_status.st_mode & stat.S_IWOTH)  # /tmp itself: not one user's folder
        complete = not shared
        for path, status in [] if shared else _walk(root_path, excluded):
            if len(entries) >= MAX_ENTRIES:
                complete = False
                break
            entry = {"kind": _kind(status), **metadata(status), "size": status.st_size}
            if entry["kind"] == "link":
                entry["link"] = os.readlink(path)
            elif (entry["kind"] == "file" and status.st_size <= MAX_FILE_BYTES
                  and copied + status.st_size <= MAX_TOTAL_BYTES):
                copy = store / f"{len(entries)}"
                with contextlib.suppress(OSError):
                    shutil.copyfile(path, copy)
                    entry["copy"] = str(copy)
                    copied += status.st_size
            entries[path] = entry
        snapshot = cls(root_path, entries, complete, store, root_status.st_uid)
        (store / MANIFEST).write_text(json.dumps({"root": root_path, "complete": complete,
                                                  "owner": root_status.st_uid,
                                                  "entries": entries}), encoding="utf-8")
        return snapshot

    @classmethod
    def load(cls, store: Path) -> FolderSnapshot | None:
        """The record a run kept in ``store``, or ``None``."""
        try:
            data = json.loads((store / MANIFEST).read_text(encoding="utf-8"))
            return cls(data["root"], data["entries"], bool(data["complete"]), store,
                       int(data["owner"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def compare_and_put_back(self, since: float | None = None, until: float | None = None
                             ) -> Comparison:
        """Make the folder as recorded again, as far as changes of the trials go: ``since``,
        ``until`` (file system times) bound when a change counts as theirs: one made before
        the trial process started, or after a dead run's last sign of life (the user's own
        work), stays. New entries of another user (root tuning in a shared folder) stay."""
        result = Comparison()
        owners = {os.geteuid(), self.owner}

        def theirs(status: os.stat_result | None) -> bool:
            return status is None or ((since is None or status.st_ctime >= since)
                                      and (until is None or status.st_ctime <= until))

        for path, entry in self.entries.items():  # parents before children: folders first
            status = _lstat(path)
            if not _same(path, entry, status) and theirs(status):
                self._put_back_one(path, entry, status, result)
        if not self.complete:
            return result  # what is new cannot be told from what was not recorded
        current = dict(_walk(self.root, {os.path.realpath(self.store.parent)}))
        for path in sorted(set(current) - set(self.entries), reverse=True):  # children first
            if not theirs(current[path]) or current[path].st_uid not in owners:
                continue
            try:
                remove(path)
                result.put_back.append(path)
            except OSError:
                result.not_put_back.append(path)
        return result

    def _put_back_one(self, path: str, entry: dict[str, Any], status: os.stat_result | None,
                      result: Comparison) -> None:
        kind = entry["kind"]
        copy = entry.get("copy")
        same_bytes = (status is not None and _kind(status) == "file" and kind == "file"
                      and (status.st_size, status.st_mtime_ns)
                      == (entry["size"], entry["mtime_ns"]))
        if kind == "other" or (kind == "file" and not copy and not same_bytes):
            result.not_put_back.append(path)  # changed, and no copy of what it was
            return
        journal_entry: dict[str, Any] = {"path": path, "existed": True, "meta": entry,
                                         "folder": kind == "dir", "link": entry.get("link")}
        if kind == "file" and not same_bytes:
            kept = self.store / f"{Path(copy).name}.put-back"  # put_back consumes its copy
            shutil.copyfile(copy, kept)
            journal_entry["copy"] = str(kept)
        put_back(journal_entry)
        if _same(path, entry, _lstat(path)):
            result.put_back.append(path)
        else:
            result.not_put_back.append(path)


def _walk(root: str, excluded: set[str]) -> list[tuple[str, os.stat_result]]:
    """Every entry under ``root`` (not following links), folders before their contents,
    at most one more than :data:`MAX_ENTRIES`."""
    found: list[tuple[str, os.stat_result]] = []
    pending = [root]
    while pending and len(found) <= MAX_ENTRIES:
        folder = pending.pop()
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            path = os.path.join(folder, name)
            status = _lstat(path)
            if (status is None or name in SKIPPED or name.startswith(SKIPPED_PREFIXES)
                    or path in excluded):
                continue
            found.append((path, status))
            if stat.S_ISDIR(status.st_mode):
                pending.append(path)
    found.sort(key=lambda item: item[0].split(os.sep))
    return found


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _kind(status: os.stat_result) -> str:
    if stat.S_ISLNK(status.st_mode):
        return "link"
    if stat.S_ISDIR(status.st_mode):
        return "dir"
    return "file" if stat.S_ISREG(status.st_mode) else "other"


def _same(path: str, entry: dict[str, Any], status: os.stat_result | None) -> bool:
    """Unchanged as far as the record tells (a folder's times change with its contents)."""
    if status is None or _kind(status) != entry["kind"]:
        return False
    if entry["kind"] == "dir":
        return stat.S_IMODE(status.st_mode) == entry["mode"]
    if entry["kind"] == "link":
        try:
            return os.readlink(path) == entry["link"]
        except OSError:
            return False
    return (status.st_size, status.st_mtime_ns, stat.S_IMODE(status.st_mode), status.st_uid,
            status.st_gid) == (entry["size"], entry["mtime_ns"], entry["mode"], entry["uid"],
                               entry["gid"])


