"""Where the settings file lives, and reading/writing it safely.

Location, first match wins:
1. ``TUNEUP_SETTINGS=PATH`` (any file name; the format does not depend on the extension);
2. ``<script dir>/<script stem>.tuneup.json`` beside the training script that is running.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import warnings
from pathlib import Path

from tuneup.files import trusted_path, write_atomic
from tuneup.settings.schema import Settings, SettingsError

MAX_BYTES = 1 << 20  # a settings file is a few hundred bytes; anything near this is not one
ENV_PATH = "TUNEUP_SETTINGS"
ENV_DISABLE = "TUNEUP_DISABLE"
SUFFIX = ".tuneup.json"


class TuneupWarning(UserWarning):
    """A problem tuneup worked around; training goes on."""


def disabled() -> bool:
    """True when ``TUNEUP_DISABLE`` is set to a true value: wrappers become pass-through."""
    return os.environ.get(ENV_DISABLE, "").strip().lower() in {"1", "true", "yes", "on"}


def default_path(script: str | os.PathLike[str]) -> Path:
    """The per-script default: ``train.py`` -> ``train.tuneup.json`` beside it."""
    script = Path(script).resolve()
    return script.with_name(script.stem + SUFFIX)


def running_script() -> Path | None:
    """The script Python was started with, or ``None`` (REPL, ``-c``, notebook)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None) or (sys.argv[0] if sys.argv and sys.argv[0] else None)
    if not path or path in {"-c", "-m"}:
        return None
    path = Path(path)
    return path if path.suffix == ".py" else None


def resolve_path() -> Path | None:
    """The settings file this process should read (it may not exist)."""
    override = os.environ.get(ENV_PATH)
    if override:
        return Path(override).expanduser()
    script = running_script()
    return default_path(script) if script else None


def read(path: Path) -> Settings:
    """Parse and validate ``path``; raises :class:`SettingsError` with a one-line reason.

    Only a regular file of at most :data:`MAX_BYTES` is read, opened without blocking (a
    FIFO or a device such as ``/dev/zero`` is refused, never read), and every way JSON can
    fail — deep nesting, numbers too long for Python, NaN, bad bytes — is a SettingsError.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise SettingsError(f"cannot read it ({exc.strerror or exc})") from exc
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise SettingsError("it is not a regular file")
        if status.st_size > MAX_BYTES:
            raise SettingsError(f"it is {status.st_size:,} bytes; a settings file is at most "
                                f"{MAX_BYTES:,}")
        raw = os.read(fd, MAX_BYTES + 1)
    except OSError as exc:
        raise SettingsError(f"cannot read it ({exc.strerror or exc})") from exc
    finally:
        os.close(fd)
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"not valid JSON (line {exc.lineno}: {exc.msg})") from exc
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise SettingsError(f"not valid JSON ({_first_line(exc)})") from exc
    return Settings.from_dict(data)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:120]


def load(path: Path | None = None) -> Settings | None:
    """The settings to apply, or ``None`` for plain PyTorch behaviour.

    A missing file is silent. A broken one gives one :class:`TuneupWarning` and ``None``:
    the caller falls back to defaults and training runs.
    """
    if disabled():
        return None
    path = path or resolve_path()
    if path is None or not path.exists():
        if path is not None and os.environ.get(ENV_PATH):
            warn(f"{ENV_PATH}={path} does not exist; using PyTorch defaults")
        return None
    try:
        return read(path)
    except SettingsError as exc:
        warn(f"ignoring settings file {path}: {exc}; using PyTorch defaults "
             f"(re-run `tuneup autotune` or fix the file)")
        return None


def save(settings: Settings, path: Path) -> None:
    """Write atomically: a crash or Ctrl-C leaves the old file (or none), never half a file.

    The file gets the permissions of any new file (the umask decides, not 0600); a
    symbolic link of this user's is written through (its target is replaced, the link
    stays), another user's is refused (:class:`tuneup.files.ForeignLinkError`).
    """
    path = trusted_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, to_text(settings))


def to_text(settings: Settings) -> str:
    """The file's text: indented JSON, never NaN."""
    return json.dumps(settings.to_dict(), indent=2, sort_keys=False, allow_nan=False) + "\n"


def warn(message: str) -> None:
    """One-line tuneup warning (shown once per message by Python's warning filter),
    attributed to the user's line: the first caller outside tuneup and torch."""
    warnings.warn(f"tuneup: {message}", TuneupWarning, stacklevel=_user_stacklevel())


# the frameworks whose code calls tuneup's on the user's behalf (a Trainer's callback, the
# DataLoader): a warning points past them, at the user's own line
FRAMEWORKS = ("torch", "lightning", "pytorch_lightning", "transformers", "accelerate")


def _user_stacklevel() -> int:
    """``stacklevel`` for :func:`warn` that skips tuneup's and the frameworks' own frames."""
    loaded = [sys.modules.get(name) for name in ("tuneup", *FRAMEWORKS)]  # only those loaded
    skipped = tuple(str(Path(module.__file__).resolve().parent) + os.sep for module in loaded
                    if module is not None and getattr(module, "__file__", None))
    frame, level = sys._getframe(2), 2  # the caller of warn()
    while frame.f_back is not None and frame.f_code.co_filename.startswith(skipped):
        frame, level = frame.f_back, level + 1
    return level
