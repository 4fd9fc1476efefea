"""What a training script writes during autotune's trials is put back afterwards.

Trials run the user's own loop, and with it whatever the loop writes: nanoGPT's in-loop
``torch.save(..., 'ckpt.pt')`` overwrote a real checkpoint with a trial's weights. The child
installs an audit hook (PEP 578) that sees every file the script opens for writing, renames,
replaces or removes, and every folder it makes; before the first change to a path it keeps a
copy of what was there in the work directory and appends a line to a journal. The runner, once
the process has ended for whatever reason (SIGKILL included: nothing here relies on the child
cleaning up), replays the journal backwards: copies go back, new files and empty new folders
go away. The user's real run is not affected: the hook exists only in autotune's child.

``torch.save`` and safetensors write from C++ and Rust: they are wrapped (see
:data:`NATIVE_WRITERS`). Not seen: writes of other native code that bypasses Python's
``open`` (an HDF5 library, a logger's native client) and of processes the script spawns
rather than forks.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tuneup.after_import import after_import
from tuneup.files import copy_atomic
from tuneup.site import ENV_JOURNAL

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
WRITE_MODES = set("wax+")
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
    """The audit hook's state: where copies go, what is already journaled, what is exempt."""

    def __init__(self, journal: Path, copies: Path, exempt: Iterable[Path]) -> None:
        self.journal = journal
        self.copies = copies
        self.exempt = tuple(os.path.realpath(p) + os.sep for p in exempt)
        self.seen: set[str] = set()
        self.local = threading.local()  # .busy: this thread is copying (its opens are ours)
        self.lock = threading.Lock()

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if getattr(self.local, "busy", False):
            return
        if event == "open" and _writes(args):
            self.before_change(args[0])
        elif event in ("os.rename", "os.replace"):  # (src, dst, src_dir_fd, dst_dir_fd)
            source, target = _at(args[0], args[2]), _at(args[1], args[3])
            if isinstance(source, str) and os.path.isdir(source):
                self.before_change(target, renamed_from=source)  # a folder moves whole
            else:
                self.before_change(source)
                self.before_change(target)
        elif event in ("os.link", "os.symlink"):  # (src, dst, ..., dst_dir_fd)
            self.before_change(_at(args[1], args[-1]))
        elif event in ("os.remove", "os.rmdir", "os.mkdir"):  # (path, [mode,] dir_fd)
            self.before_change(_at(args[0], args[-1]))  # rmtree removes relative to a dir_fd
        elif event == "os.truncate":
            self.before_change(args[0])

    def before_change(self, target: Any, renamed_from: Any = None) -> None:
        """Journal ``target`` (and keep a copy) unless it was already, or is exempt."""
        if not isinstance(target, (str, bytes, os.PathLike)):
            return  # a file descriptor: opened (and journaled) before
        path = os.path.realpath(os.fsdecode(os.fspath(target)))
        if path.startswith(self.exempt) or path.endswith(".pyc"):
            return
        source = os.path.realpath(os.fsdecode(os.fspath(renamed_from))) if renamed_from else None
        with self.lock:
            if path in self.seen and source is None:
                return
            self.local.busy = True
            try:
                self.seen.add(path)
                self._record(path, source)
            except OSError as exc:  # no copy, no write: a trial must never cost a user's file
                raise PermissionError(f"tuneup autotune could not keep a copy of {path} before "
                                      f"the script changes it ({exc.strerror or exc})") from None
            finally:
                self.local.busy = False

    def _record(self, path: str, renamed_from: str | None) -> None:
        copy = None
        if os.path.isfile(path) and not os.path.islink(path):
            fd, copy = tempfile.mkstemp(prefix=f"{os.getpid()}-", suffix=f"-{os.path.basename(path)}",
                                        dir=self.copies)  # unique across ranks and workers
            os.close(fd)
            shutil.copy2(path, copy)
        entry = {"path": path, "copy": copy, "existed": os.path.lexists(path),
                 "folder": os.path.isdir(path) and not os.path.islink(path),
                 "renamed_from": renamed_from}
        with open(self.journal, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")
            handle.flush()


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
    install(journal, journal.with_suffix(".copies"), journal.parent)


def install(journal: Path, copies: Path, workdir: Path) -> None:
    """Start journaling in this process (the autotune child, before the script's loop runs).

    The work directory, this process's temporary folder (the runner points ``TMPDIR`` inside
    the work directory), caches and the system's own folders are exempt: they hold no file of
    the user's, and torch's compile caches must stay warm. A user's folder under ``/tmp`` is
    guarded like any other."""
    copies.mkdir(parents=True, exist_ok=True)
    journal.touch()  # its presence tells the runner the guard is armed
    exempt = [workdir, Path(tempfile.gettempdir()), Path("/dev"), Path("/proc"), Path("/sys"),
              Path.home() / ".cache", Path.home() / ".triton", Path(sys.prefix)]
    guard = WriteGuard(journal, copies, exempt)
    sys.addaudithook(guard)
    for module, name, position, keyword in NATIVE_WRITERS:
        after_import(module, lambda loaded, writer=(name, position, keyword):
                     _guard_writer(loaded, *writer, guard))


# Functions that write a path from C++ or Rust (no audit event): (module, function, the path
# argument's position and keyword). safetensors is how transformers saves a model.
NATIVE_WRITERS = (
    ("torch", "save", 1, "f"),
    ("safetensors.torch", "serialize_file", 1, "filename"),
    ("safetensors.numpy", "serialize_file", 1, "filename"),
)


def _guard_writer(module: Any, name: str, position: int, keyword: str,
                  guard: WriteGuard) -> None:
    """Journal the path ``module.name`` writes before it writes it."""
    original = getattr(module, name)
    if getattr(original, "__wrapped__", None) is not None:
        return

    def write(*args: Any, **kwargs: Any) -> Any:
        target = args[position] if len(args) > position else kwargs.get(keyword)
        if isinstance(target, (str, bytes, os.PathLike)):
            guard.before_change(target)
        return original(*args, **kwargs)

    write.__wrapped__ = original  # type: ignore[attr-defined]
    write.__doc__ = original.__doc__
    setattr(module, name, write)


def restore(journal: Path) -> list[str]:
    """Put back every path the journal names, newest first; returns those that had something
    to put back (a copy, or a path that did not exist), for the report. A journal line cut
    by a kill is ignored: its change had not started."""
    try:
        lines = journal.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    entries = []
    for line in lines:
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue
    for entry in reversed(entries):
        _put_back(entry)
    return [entry["path"] for entry in entries if entry.get("copy") or not entry.get("existed")]


def _put_back(entry: dict[str, Any]) -> None:
    path, copy, source = entry["path"], entry.get("copy"), entry.get("renamed_from")
    try:
        if source and not os.path.lexists(source) and os.path.isdir(path):
            os.rename(path, source)  # a folder moved whole goes back whole
        if copy:
            if os.path.islink(path) or os.path.isdir(path):
                _remove(path)
            copy_atomic(Path(copy), Path(path))  # atomic, through no other user's link
            os.unlink(copy)
        elif entry.get("folder") and entry.get("existed"):
            os.makedirs(path, exist_ok=True)  # removed (rmtree): its files follow, newest first
        elif not entry.get("existed"):
            _remove(path)
    except OSError:
        pass  # a path the script made unwritable, or a folder not empty: leave it


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        os.rmdir(path)  # only when empty: a folder filled since (by whom?) stays
    elif os.path.lexists(path):
        os.unlink(path)
