"""The user's folders as they were before the first trial: the second line behind the journal.

The write guard journals what Python's audit hook and the wrapped native writers see; a
writer it does not see (another native library, a process the script spawns, a file written
through a descriptor from elsewhere) would change the user's files unnoticed. So before the
first trial the runner records the script's folder tree, the working directory's and those
of folders the script's arguments name (path, kind, size, mtime, mode, owner, link target)
and keeps a copy of each small file; after every trial process, once its journal is
replayed, the folders are compared with that record: a file changed or removed is
put back from its copy, a link as the link, a mode as it was; a new file or folder is
removed; a changed file with no copy (too big to copy up front) is named as not put back.
Bounded: at most :data:`MAX_ENTRIES` entries are recorded (version control and cache folders
skipped), files above :data:`MAX_FILE_BYTES` or past :data:`MAX_TOTAL_BYTES` are not copied;
a world-writable folder (the script in ``/tmp`` itself), the home folder or ``/`` whole
is not recorded. Only changes made
while a trial process ran count as the trials' (after a killed run: any made before its last
sign of life, the trials' start times died with it); but a change in that time may be the user's
own (an editor's save, a new notebook), so what a compare replaces or removes is first set
aside, not lost: in :func:`set_aside_root`, one folder a run, named in the report. Past
:data:`SET_ASIDE_BYTES` a run's compare leaves further changes as they are, named as not put
back, rather than drop a version it could not keep.
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
                     ".ruff_cache", ".ipynb_checkpoints", "site-packages", "dist-packages",
                     "node_modules"})
SKIPPED_PREFIXES = ("tuneup-autotune-", "tuneup-watch-", ".tuneup-born-")  # tuneup's own folders
CWD_LEVELS = 3
SET_ASIDE_BYTES = 512 << 20  # a run's set-aside versions: a few checkpoints, not a dataset
MANIFEST = "manifest.json"


@dataclass
class Comparison:
    """After a trial process: what the folder compare put back, and what it could not."""

    put_back: list[str] = field(default_factory=list)
    not_put_back: list[str] = field(default_factory=list)


def set_aside_root() -> Path:
    """``$XDG_STATE_HOME/tuneup/set-aside`` (``~/.local/state/...``): the versions of the
    user's files a folder compare replaced or removed, kept past the run (not in TMPDIR,
    which the run leaves empty)."""
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "tuneup" / "set-aside"


class FolderSnapshot:
    """The record of the user's folder trees, kept in ``store`` (so that a sweep after a
    SIGKILL reads it): the script's folder, the working directory, folders its arguments
    name (see :func:`user_folders`)."""

    def __init__(self, roots: dict[str, int], entries: dict[str, dict[str, Any]],
                 complete: bool, store: Path, own: list[str] | None = None) -> None:
        self.roots = roots  # each recorded folder, and its owner
        self.entries, self.complete, self.store = entries, complete, store
        self.own = own or []  # autotune's own output files: never recorded nor compared
        self.aside = set_aside_root() / store.resolve().parent.name  # one folder a run
        self.set_aside: list[str] = []  # paths whose found version was kept in ``aside``
        self._aside_bytes = 0

    @classmethod
    def take(cls, folders: list[Path], store: Path, exclude: tuple[Path, ...] = ()
             ) -> FolderSnapshot:
        """Record ``folders`` (and copy their small files into ``store``), leaving
        ``exclude`` (the run's own work folder) and autotune's own output out."""
        store.mkdir(parents=True, exist_ok=True)
        own = own_outputs()
        excluded = {os.path.realpath(p) for p in exclude} | set(own)
        roots = {root: os.stat(root).st_uid for root in user_folders(folders)}
        entries: dict[str, dict[str, Any]] = {}
        copied = 0
        complete = True
        for path, status in (item for root in roots for item in _walk(root, excluded)):
            if len(entries) >= MAX_ENTRIES:
                complete = False
                break
            entry = {"kind": _kind(status), **metadata(status), "size": status.st_size}
            if entry["kind"] == "link":
                try:
                    entry["link"] = os.readlink(path)
                except OSError:  # gone since the walk: nothing to record
                    continue
            elif (entry["kind"] == "file" and status.st_size <= MAX_FILE_BYTES
                  and copied + status.st_size <= MAX_TOTAL_BYTES):
                copy = store / f"{len(entries)}"
                with contextlib.suppress(OSError):
                    shutil.copyfile(path, copy)
                    entry["copy"] = str(copy)
                    copied += status.st_size
            entries[path] = entry
        (store / MANIFEST).write_text(json.dumps({"roots": roots, "complete": complete,
                                                  "entries": entries, "own": own}),
                                      encoding="utf-8")
        return cls(roots, entries, complete, store, own)

    @classmethod
    def load(cls, store: Path) -> FolderSnapshot | None:
        """The record a run kept in ``store``, or ``None``."""
        try:
            data = json.loads((store / MANIFEST).read_text(encoding="utf-8"))
            return cls({str(k): int(v) for k, v in data["roots"].items()}, data["entries"],
                       bool(data["complete"]), store, [str(p) for p in data.get("own", [])])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def compare_and_put_back(self, since: float | None = None, until: float | None = None
                             ) -> Comparison:
        """Make the folder as recorded again, as far as changes of the trials go: ``since``,
        ``until`` (file system times) bound when a change counts as theirs: one made before
        the trial process started, or after a dead run's last sign of life (the user's own
        work), stays. New entries of another user (root tuning in a shared folder) stay."""
        result = Comparison()
        owners = {os.geteuid(), *self.roots.values()}

        def theirs(status: os.stat_result | None) -> bool:
            return status is None or ((since is None or status.st_ctime >= since)
                                      and (until is None or status.st_ctime <= until))

        for path, entry in self.entries.items():  # parents before children: folders first
            status = _lstat(path)
            if not _same(path, entry, status) and theirs(status):
                try:
                    self._put_back_one(path, entry, status, result)
                except OSError:  # a copy lost, a full disk: this one stays, the rest go on
                    result.not_put_back.append(path)
        if not self.complete:
            return result  # what is new cannot be told from what was not recorded
        excluded = {os.path.realpath(self.store.parent), *self.own}
        current = dict(item for root in self.roots for item in _walk(root, excluded))
        for path in sorted(set(current) - set(self.entries), reverse=True):  # children first
            if not theirs(current[path]) or current[path].st_uid not in owners:
                continue
            if not self._keep_aside(path, current[path]):
                result.not_put_back.append(path)
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
        if status is not None and not same_bytes and not self._keep_aside(path, status):
            result.not_put_back.append(path)
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


    def _keep_aside(self, path: str, status: os.stat_result) -> bool:
        """Keep the version of ``path`` found now (a file's bytes, a link) under
        :attr:`aside` before it is replaced or removed; False when it cannot be kept (past
        the run's bound, or unreadable): then it is left as it is. Folders need nothing."""
        kind = _kind(status)
        if kind == "dir" or (kind == "file" and status.st_size == 0):
            return True
        if kind == "file" and self._aside_bytes + status.st_size > SET_ASIDE_BYTES:
            return False
        target = self.aside / path.lstrip(os.sep)
        try:
            self.aside.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            number = 1
            while os.path.lexists(target):  # a second version of it in this run
                number += 1
                target = target.with_name(f"{Path(path).name}.~{number}~")
            if kind == "link":
                os.symlink(os.readlink(path), target)
            elif kind == "file":
                with open(path, "rb") as source, open(target, "xb") as kept:
                    shutil.copyfileobj(source, kept)
            else:
                return False
        except OSError:
            return False
        self._aside_bytes += status.st_size
        self.set_aside.append(path)
        return True


def named_folders(script: Path, args: list[str]) -> list[Path]:
    """Where the script may keep the user's files: its folder; the working directory when
    the script lies at most :data:`CWD_LEVELS` below it (``cd project; python src/train.py``);
    each folder an argument names, and the folder of each file an argument names by a path
    (``--out runs/a``, ``--ckpt=ckpts/model.pt``)."""
    folder = script.resolve().parent
    found = [folder]
    cwd = Path.cwd().resolve()
    if cwd in folder.parents[:CWD_LEVELS]:
        found.append(cwd)
    for arg in args:
        for text in {arg, arg.partition("=")[2]} - {""}:
            with contextlib.suppress(OSError, ValueError):
                path = Path(text)
                if path.is_dir():
                    found.append(path)
                elif os.sep in text and path.exists():
                    found.append(path.parent)
    return found


def user_folders(candidates: list[Path]) -> list[str]:
    """The folders worth recording among ``candidates``: existing folders, resolved, none
    inside another; never ``/``, the home folder or one above it, nor a world-writable one
    (``/tmp`` itself): those hold far more than one project, and other people's files."""
    home = os.path.realpath(os.path.expanduser("~"))
    chosen: list[str] = []
    for candidate in candidates:
        folder = os.path.realpath(candidate)
        try:
            status = os.stat(folder)
        except OSError:
            continue
        if (not stat.S_ISDIR(status.st_mode) or status.st_mode & stat.S_IWOTH
                or (home + os.sep).startswith(folder.rstrip(os.sep) + os.sep)):
            continue
        chosen.append(folder)
    return sorted(f for f in set(chosen)
                  if not any(f.startswith(other + os.sep) for other in chosen if other != f))


def own_outputs() -> list[str]:
    """The files this process's stdout and stderr write to (``tuneup autotune train.py >
    tune.log 2>&1`` where the script lives): autotune's output, not a trial's change; put
    back, the file was cut while autotune kept writing at its offset (NUL bytes, lines lost)."""
    found: list[str] = []
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.fstat(fd).st_mode):
                found.append(os.path.realpath(f"/proc/self/fd/{fd}"))  # Linux; else no match
    return found


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
                    or path in excluded or _other_environment(path, status)):
                continue
            found.append((path, status))
            if stat.S_ISDIR(status.st_mode):
                pending.append(path)
    found.sort(key=lambda item: item[0].split(os.sep))
    return found


def _other_environment(path: str, status: os.stat_result) -> bool:
    """A virtualenv inside the folder (``.venv/``): installed code, not the user's files."""
    return stat.S_ISDIR(status.st_mode) and os.path.exists(os.path.join(path, "pyvenv.cfg"))


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


