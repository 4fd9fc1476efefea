"""What a training script writes during autotune's trials is put back afterwards.

Trials run the user's own loop, and with it whatever the loop writes: nanoGPT's in-loop
``torch.save(..., 'ckpt.pt')`` overwrote a real checkpoint with a trial's weights. The child
installs an audit hook (PEP 578) that sees every file the script opens for writing, renames,
replaces or removes, and every folder it makes; before the first change to a path it keeps a
copy of what was there in the work directory and appends a line to a journal. The runner, once
the process has ended for whatever reason (SIGKILL included: nothing here relies on the child
cleaning up), replays the journal backwards (:mod:`tuneup.autotune.put_back`: copies go back
into the same inode, links as links, with owner, mode and times; new files and empty new
folders go away); if the run itself dies, its sentinel or the next start does. The user's
real run is not affected: the hook exists only in autotune's child.

``torch.save``, ``torch.jit.save`` and safetensors write from C++ and Rust: they are
wrapped (see :data:`NATIVE_WRITERS`); sqlite3's files are named by its ``sqlite3.connect``
event. Other native writers (an HDF5 library, a logger's native client) and processes the
script spawns rather than forks are not seen here: the user's folders are compared with a
snapshot after each trial process instead (:mod:`tuneup.autotune.snapshot`).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import sysconfig
import tempfile
import threading
import urllib.parse
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tuneup.after_import import after_import
from tuneup.autotune.put_back import metadata
from tuneup.site import ENV_JOURNAL

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
WRITE_MODES = set("wax+")
ENV_SCRIPT_DIR = "TUNEUP_WRITE_SCRIPT_DIR"  # the script's folder: never exempt
COMPILE_CACHE_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
ENVIRONMENT = {  # loggers that would send a trial's metrics somewhere the user keeps them
    "WANDB_MODE": "disabled",
    "MLFLOW_TRACKING_URI": "",  # set to a folder of the work directory by :func:`environment`
    "COMET_MODE": "disabled",
    "NEPTUNE_MODE": "offline",
}


def environment(workdir: Path) -> dict[str, str]:
    """Variables for the child: remote loggers off, MLflow into the work directory."""
    return {**ENVIRONMENT, "MLFLOW_TRACKING_URI": (workdir / "mlruns").as_uri()}


class WriteGuard:
    """The audit hook's state: where copies go, what is already journaled, what is exempt.

    A path is journaled as the script names it (its folder resolved, its last part not):
    removing, replacing or renaming a symbolic link changes the link, not its target, and
    the link is what comes back. Writing through a link changes its target's bytes: those
    are journaled under the target's real path."""

    def __init__(self, journal: Path, copies: Path, exempt: Iterable[Path]) -> None:
        self.journal = journal
        self.copies = copies
        self.exempt = tuple(os.path.realpath(p) + os.sep for p in exempt)
        self.seen: set[str] = set()
        self.seen_metadata: set[str] = set()
        self.local = threading.local()  # .busy: this thread is copying (its opens are ours)
        self.lock = threading.Lock()

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if getattr(self.local, "busy", False):
            return
        if event == "open" and _writes(args):
            if not getattr(self.local, "opening_at", False):  # os.open(dir_fd=): see open_at
                self.before_change(args[0], follow=True)
        elif event in ("os.rename", "os.replace"):  # (src, dst, src_dir_fd, dst_dir_fd)
            source, target = _at(args[0], args[2]), _at(args[1], args[3])
            if isinstance(source, str) and os.path.isdir(source) and not os.path.islink(source):
                self.before_change(target, renamed_from=source)  # a folder moves whole
            else:
                self.before_change(source)
                self.before_change(target)
        elif event in ("os.link", "os.symlink"):  # (src, dst, ..., dst_dir_fd)
            self.before_change(_at(args[1], args[-1]))
        elif event in ("os.remove", "os.rmdir", "os.mkdir"):  # (path, [mode,] dir_fd)
            self.before_change(_at(args[0], args[-1]))  # rmtree removes relative to a dir_fd
        elif event == "os.truncate":
            self.before_change(args[0], follow=True)
        elif event in ("os.chmod", "os.chown", "os.utime"):  # (path, ..., dir_fd): follows links
            self.before_change(_at(args[0], args[-1]), follow=True, metadata_only=True)
        elif event == "sqlite3.connect":  # (database,): it and the files beside it
            for name in _sqlite_files(args[0] if args else None):
                self.before_change(name, follow=True)

    def before_change(self, target: Any, renamed_from: Any = None, follow: bool = False,
                      metadata_only: bool = False) -> None:
        """Journal ``target`` (and keep a copy) unless it was already, or is exempt;
        ``follow``: the change goes through a link at ``target`` to its target."""
        if not isinstance(target, (str, bytes, os.PathLike)):
            return  # a file descriptor: opened (and journaled) before
        path = _named(target, follow)
        if path.startswith(self.exempt) or path.endswith(".pyc"):
            return
        source = _named(renamed_from, False) if renamed_from else None
        with self.lock:
            if path in self.seen and source is None:
                return
            if metadata_only and path in self.seen_metadata:
                return
            self.local.busy = True
            try:
                (self.seen_metadata if metadata_only else self.seen).add(path)
                self._record(path, source, metadata_only)
            except OSError as exc:  # no copy, no write: a trial must never cost a user's file
                raise PermissionError(f"tuneup autotune could not keep a copy of {path} before "
                                      f"the script changes it ({exc.strerror or exc})") from None
            finally:
                self.local.busy = False

    def _record(self, path: str, renamed_from: str | None, metadata_only: bool) -> None:
        try:
            status: os.stat_result | None = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            status = None
        copy = None
        if status is not None and stat.S_ISREG(status.st_mode) and not metadata_only:
            fd, copy = tempfile.mkstemp(prefix=f"{os.getpid()}-",  # unique across ranks, workers
                                        suffix=f"-{os.path.basename(path)}", dir=self.copies)
            os.close(fd)
            shutil.copyfile(path, copy)
        is_link = status is not None and stat.S_ISLNK(status.st_mode)
        entry = {"path": path, "copy": copy, "existed": status is not None,
                 "folder": status is not None and stat.S_ISDIR(status.st_mode),
                 "link": os.readlink(path) if is_link else None,
                 "meta": metadata(status) if status is not None else None,
                 "meta_only": metadata_only, "renamed_from": renamed_from}
        with open(self.journal, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")
            handle.flush()

    def open_at(self, original: Callable[..., int]) -> Callable[..., int]:
        """``os.open`` that journals the path its ``dir_fd`` names: the audit event of
        ``os.open`` carries the bare name, which would be taken as relative to the cwd."""

        def open_at(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
            if dir_fd is None or not isinstance(flags, int) or not flags & WRITE_FLAGS:
                return original(path, flags, mode, dir_fd=dir_fd)
            self.before_change(_at(path, dir_fd), follow=True)
            self.local.opening_at = True
            try:
                return original(path, flags, mode, dir_fd=dir_fd)
            finally:
                self.local.opening_at = False

        open_at.__wrapped__ = original  # type: ignore[attr-defined]
        return open_at


def _named(target: Any, follow: bool) -> str:
    """``target`` as an absolute path: its folder resolved, its last part resolved only
    when the change follows a link there."""
    path = os.path.abspath(os.fsdecode(os.fspath(target)))
    if follow:
        return os.path.realpath(path)
    folder, name = os.path.split(path)
    return os.path.join(os.path.realpath(folder), name) if name else os.path.realpath(path)


def _sqlite_files(database: Any) -> list[str]:
    """The database file sqlite3 opens and the files it keeps beside it."""
    if not isinstance(database, (str, bytes, os.PathLike)):
        return []
    name = os.fsdecode(os.fspath(database))
    if name.startswith("file:"):  # a URI: its path, without the query
        name = urllib.parse.unquote(urllib.parse.urlsplit(name).path)
    if name in ("", ":memory:") or "mode=memory" in os.fsdecode(os.fspath(database)):
        return []
    return [name + suffix for suffix in ("", "-journal", "-wal", "-shm")]


def _at(path: Any, dir_fd: Any) -> Any:
    """``path`` as the call resolves it: relative to ``dir_fd`` when one is given."""
    if not isinstance(dir_fd, int) or isinstance(dir_fd, bool) or dir_fd < 0:
        return path
    if not isinstance(path, (str, bytes, os.PathLike)) or os.path.isabs(os.fsdecode(path)):
        return path
    try:
        return os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), os.fsdecode(path))
    except OSError:
        return path


def _writes(args: tuple[Any, ...]) -> bool:
    mode, flags = (args + (None, None))[1:3]
    if isinstance(mode, str):
        return bool(WRITE_MODES & set(mode))
    return isinstance(flags, int) and bool(flags & WRITE_FLAGS)


def install_from_environment() -> None:
    """Journal from the interpreter's start (the runner names the journal in the trial
    process's environment and puts :data:`SITE_DIR` first on its ``PYTHONPATH``)."""
    journal = Path(os.environ[ENV_JOURNAL])
    script_dir = os.environ.get(ENV_SCRIPT_DIR)
    install(journal, journal.with_suffix(".copies"), journal.parent,
            Path(script_dir) if script_dir else None)


def install(journal: Path, copies: Path, workdir: Path, script_dir: Path | None = None) -> None:
    """Start journaling in this process (the autotune child, before the script's loop runs).

    The work directory, this process's temporary folder (the runner points ``TMPDIR`` inside
    the work directory), caches (``~/.cache``, ``~/.triton`` and the folders
    ``TORCHINDUCTOR_CACHE_DIR`` / ``TRITON_CACHE_DIR`` name), the system's own folders and
    the interpreter's library folders are exempt: they hold no file of the user's, and
    torch's compile caches must stay warm. Not ``sys.prefix`` whole: a project that is its
    own virtualenv (``python -m venv .``) or an app under ``/usr/local`` lives there; and no
    folder that holds ``script_dir``. A user's folder under ``/tmp`` is guarded like any
    other."""
    copies.mkdir(parents=True, exist_ok=True)
    journal.touch()  # its presence tells the runner the guard is armed
    guard = WriteGuard(journal, copies, exempt_folders(workdir, script_dir))
    sys.addaudithook(guard)
    if getattr(os.open, "__wrapped__", None) is None:
        os.open = guard.open_at(os.open)  # type: ignore[assignment]
    for module, name, position, keyword in NATIVE_WRITERS:
        after_import(module, lambda loaded, writer=(name, position, keyword):
                     _guard_writer(loaded, *writer, guard))


def exempt_folders(workdir: Path, script_dir: Path | None) -> list[Path]:
    """Where a trial's writes are not journaled (see :func:`install`)."""
    paths = sysconfig.get_paths()
    libraries = sorted({paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")
                        if key in paths})
    # compile caches the user points elsewhere: writes there change no result, and a
    # trial's compiled code kept there warms the real run
    caches = [Path(os.environ[name]) for name in COMPILE_CACHE_VARIABLES if os.environ.get(name)]
    exempt = [Path(tempfile.gettempdir()), Path("/dev"), Path("/proc"), Path("/sys"),
              Path.home() / ".cache", Path.home() / ".triton", *caches, *map(Path, libraries)]
    if script_dir is not None:
        inside = os.path.realpath(script_dir) + os.sep
        exempt = [p for p in exempt if not inside.startswith(os.path.realpath(p) + os.sep)]
    return [workdir, *exempt]


# Functions that write a path from C++ or Rust (no audit event): (module, function or
# class.method, the path argument's position and keyword). safetensors is how transformers
# saves a model; ``torch.serialization.save`` is ``torch.save`` reached without ``torch.``.
NATIVE_WRITERS = (
    ("torch.serialization", "save", 1, "f"),
    ("torch", "save", 1, "f"),
    ("torch.jit", "save", 1, "f"),
    ("torch.jit._script", "RecursiveScriptModule.save", 1, "f"),
    ("safetensors.torch", "serialize_file", 1, "filename"),
    ("safetensors.numpy", "serialize_file", 1, "filename"),
)


def _guard_writer(module: Any, name: str, position: int, keyword: str,
                  guard: WriteGuard) -> None:
    """Journal the path ``module.name`` writes before it writes it."""
    *owners, attribute = name.split(".")
    owner = module
    for part in owners:
        owner = getattr(owner, part)
    original = getattr(owner, attribute)
    if getattr(original, "__wrapped__", None) is not None:
        return

    def write(*args: Any, **kwargs: Any) -> Any:
        target = args[position] if len(args) > position else kwargs.get(keyword)
        if isinstance(target, (str, bytes, os.PathLike)):
            guard.before_change(target, follow=True)
        return original(*args, **kwargs)

    write.__wrapped__ = original  # type: ignore[attr-defined]
    write.__doc__ = original.__doc__
    setattr(owner, attribute, write)
