"""The version each system cuDNN library states.

``ldconfig -p`` lists a system cuDNN by its soname (``libcudnn.so.9``): the major alone,
which cannot tell a second cuDNN 9 build from the very version torch loads. So each library
is asked, most direct first: its own ``cudnnGetVersion()`` (in a child process, bounded: a
library that crashes or hangs on load costs the doctor nothing), the full version in the name
of the file the soname links to (``libcudnn.so.9.1.0``), and the ``cudnn_version.h`` beside
it (a header is the last resort: it may belong to another copy, so it counts only when its
major is the soname's).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tuneup.machine import versions
from tuneup.machine.snapshot import LibraryVersion

GET_VERSION = "import ctypes, sys; print(ctypes.CDLL(sys.argv[1]).cudnnGetVersion())"
CALL_TIMEOUT_S = 10.0
MAX_LIBRARIES = 8  # distinct files asked; a library path of hundreds is not read whole
HEADERS = ("cudnn_version.h", "cudnn_version_v{major}.h")  # the latter: Debian's packages
HEADER_DIRS = ("../include", "/usr/include", "/usr/include/{multiarch}", "/usr/local/cuda/include")
DEFINE = re.compile(r"^\s*#\s*define\s+CUDNN_(MAJOR|MINOR|PATCHLEVEL)\s+(\d+)", re.MULTILINE)


def library_versions(paths: list[str], notes: list[str]) -> list[LibraryVersion]:
    """The version each of ``paths`` states, for those whose name gives less than major.minor
    (each file asked once, however many names link to it)."""
    by_file: dict[str, list[str]] = {}
    for path in paths:
        if not _full(versions.library_version(path)):
            by_file.setdefault(os.path.realpath(path), []).append(path)
    if len(by_file) > MAX_LIBRARIES:
        notes.append(f"cuDNN versions read from the first {MAX_LIBRARIES} of {len(by_file)} "
                     "libraries only")
    found = []
    for names in list(by_file.values())[:MAX_LIBRARIES]:
        read = read_version(names[0])
        if read is not None:
            found.extend(LibraryVersion(name, read.version, read.read_from) for name in names)
    return found


def read_version(path: str) -> LibraryVersion | None:
    """What ``path`` says of its version, or ``None`` when nothing does."""
    called = cudnn_get_version(path)
    if called is not None:
        return LibraryVersion(path, called, "cudnnGetVersion")
    named = versions.library_version(os.path.realpath(path))
    if _full(named):
        return LibraryVersion(path, named, "file name")
    header = _header_version(path)
    if header is not None:
        return LibraryVersion(path, header[0], header[1])
    return None


def cudnn_get_version(path: str, timeout_s: float = CALL_TIMEOUT_S) -> str | None:
    """``cudnnGetVersion()`` of the library at ``path``, loaded in a child process."""
    try:
        done = subprocess.run([sys.executable, "-I", "-c", GET_VERSION, path],
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    answer = done.stdout.strip()
    if done.returncode != 0 or not answer.isdigit():
        return None
    return versions.cudnn_from_int(int(answer))


def parse_header(text: str) -> str | None:
    """``CUDNN_MAJOR`` / ``MINOR`` / ``PATCHLEVEL`` of a ``cudnn_version.h`` -> ``"9.1.0"``."""
    parts = dict(DEFINE.findall(text))
    if "MAJOR" not in parts or "MINOR" not in parts:
        return None
    return f"{parts['MAJOR']}.{parts['MINOR']}.{parts.get('PATCHLEVEL', '0')}"


def _header_version(path: str) -> tuple[str, str] | None:
    major = versions.library_version(path)
    if not major:
        return None
    folder = Path(path).parent
    multiarch = f"{os.uname().machine}-linux-gnu" if hasattr(os, "uname") else ""
    for directory in HEADER_DIRS:
        for name in HEADERS:
            header = (folder / directory.format(multiarch=multiarch) /
                      name.format(major=major.split(".")[0]))
            try:
                text = header.read_text(errors="replace")[:1 << 16]
            except OSError:
                continue
            version = parse_header(text)
            if version and version.split(".")[0] == major.split(".")[0]:
                return version, str(header.resolve())
    return None


def _full(version: str | None) -> bool:
    """At least major.minor: a version that tells builds of one major apart."""
    return version is not None and len(versions.release(version) or ()) >= 2
