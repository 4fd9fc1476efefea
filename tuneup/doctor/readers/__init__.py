"""Snapshots from reports: collect_env text or tuneup's JSON, auto-detected. Never imports torch."""

from __future__ import annotations

import json
import sys
import unicodedata

from tuneup.doctor.readers.collect_env import parse_collect_env
from tuneup.doctor.readers.tuneup_json import environment_of, snapshot_from_json
from tuneup.errors import UsageError
from tuneup.machine.snapshot import Snapshot, printable

__all__ = ["ReportError", "read_path", "read_report"]

MAX_REPORT_BYTES = 20 * 2**20
MAX_LINE = 4000  # characters of one report line (a pip list line is < 100)
MAX_GPUS = 64  # more than any machine holds
MAX_MESSAGES = 50
HOW_TO_GET_ONE = (
    "run `python -m torch.utils.collect_env > report.txt` (or `tuneup doctor --format json`)"
)


class ReportError(UsageError):
    """The input is not a report we can read; the message is one line naming the fix."""


def read_report(text: str) -> Snapshot:
    """Snapshot from report text: tuneup JSON (full output or bare environment) or collect_env."""
    if _control_share(text) > 0.02:
        raise ReportError(f"the input is binary data, not a text report: {HOW_TO_GET_ONE}")
    return bounded(_parse(visible(text)))


def visible(text: str) -> str:
    """``text`` without the invisible characters that copying from a web page or chat adds:
    format characters (zero-width spaces and joiners, byte-order marks, direction marks) are
    removed and Unicode spaces become plain ones, so ``550\u200b.54.15`` reads as 550.54.15,
    not as 54.15."""
    odd = {char for char in set(text) if ord(char) > 127
           and unicodedata.category(char) in ("Cf", "Zs", "Zl", "Zp")}
    if not odd:
        return text
    return text.translate({ord(char): None if unicodedata.category(char) == "Cf" else
                           ("\n" if unicodedata.category(char) in ("Zl", "Zp") else " ")
                           for char in odd})


def _parse(text: str) -> Snapshot:
    stripped = text.strip()
    if stripped.startswith("{") or stripped.startswith("[") and _is_json(stripped):
        return _read_json(stripped)
    text = "\n".join(printable(line, MAX_LINE) for line in text.splitlines())
    stripped = text.strip()
    if not stripped:
        raise ReportError(f"the report is empty: {HOW_TO_GET_ONE}")
    snapshot = parse_collect_env(text)
    if snapshot is not None:
        return snapshot
    document = _embedded_json(stripped)
    if document is not None and environment_of(document) is not None:
        return _snapshot_of(document)  # e.g. JSON below the command line that printed it
    # Any other text is still read: what it states is reported, the rest stays unchecked.
    return parse_collect_env(text, require_evidence=False)


def bounded(snapshot: Snapshot) -> Snapshot:
    """At most :data:`MAX_GPUS` GPUs and :data:`MAX_MESSAGES` messages: a report of 400,000
    GPU lines is read in seconds, and says what it left out."""
    for name, limit in (("gpus", MAX_GPUS), ("messages", MAX_MESSAGES)):
        items = getattr(snapshot, name) or []
        if len(items) > limit:
            setattr(snapshot, name, items[:limit])
            snapshot.notes.append(f"only the first {limit} of {len(items)} {name} were read")
    return snapshot


def read_path(path: str) -> Snapshot:
    """Snapshot from a file (``-`` = standard input)."""
    name = "standard input" if path == "-" else path
    try:
        if path == "-":
            if sys.stdin is None or sys.stdin.closed:
                raise ReportError("standard input is closed: pipe a report into it, "
                                  "or give a file")
            data = sys.stdin.buffer.read(MAX_REPORT_BYTES + 1)
        else:
            with open(path, "rb") as handle:
                data = handle.read(MAX_REPORT_BYTES + 1)
    except FileNotFoundError:
        raise ReportError(f"{name}: no such file; check the path") from None
    except IsADirectoryError:
        raise ReportError(f"{name} is a directory; give the report file inside it") from None
    except PermissionError:
        raise ReportError(f"{name}: permission denied; make the file readable") from None
    except (OSError, ValueError) as error:  # ValueError: a closed or detached stream
        raise ReportError(
            f"{name}: cannot read ({getattr(error, 'strerror', None) or error}); check the file"
        ) from None
    if len(data) > MAX_REPORT_BYTES:
        raise ReportError(
            f"{name} is larger than {MAX_REPORT_BYTES >> 20} MiB: not an environment report"
        )
    try:
        return read_report(_decode(data))
    except ReportError as error:
        raise ReportError(f"{name}: {error}") from None


def _decode(data: bytes) -> str:
    """UTF-8, or UTF-16 (what PowerShell's `>` writes); undecodable bytes are replaced."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16", errors="replace")
    if len(data) >= 4 and data[1::2].count(0) > len(data) // 4 and data[0::2].count(0) == 0:
        return data.decode("utf-16-le", errors="replace")  # UTF-16 without a BOM
    text = data.decode("utf-8", errors="replace")
    if text.count("\ufffd") > max(8, len(text) // 100):
        raise ReportError(f"the input is binary data, not a text report: {HOW_TO_GET_ONE}")
    return text


def _control_share(text: str) -> float:
    sample = text[:65536]
    if not sample:
        return 0.0
    control = sum(1 for char in sample if ord(char) < 32 and char not in "\n\r\t\f\v\x1b")
    return control / len(sample)


def _read_json(text: str) -> Snapshot:
    try:
        document = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as error:
        raise ReportError(
            f"the JSON is invalid or cut short (line {error.lineno}, column {error.colno}): "
            "feed the complete output of `tuneup doctor --format json`"
        ) from None
    except (ValueError, RecursionError) as error:  # NaN, 5,000-digit numbers, deep nesting
        raise ReportError(f"the JSON is not a report ({_first_line(error)}): feed the output "
                          "of `tuneup doctor --format json`") from None
    return _snapshot_of(document)


def _is_json(text: str) -> bool:
    """The whole text is one JSON document (a ``[pip3] ...`` line is not)."""
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return (lines[0] if lines else type(error).__name__)[:120]


def _embedded_json(text: str) -> object | None:
    """The JSON document that starts at some line of ``text`` and runs to its end, if any."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(("{", "["))][:20]
    decoder = json.JSONDecoder()
    for start in starts:
        try:
            return decoder.raw_decode("\n".join(lines[start:]))[0]  # trailing text is allowed
        except (ValueError, RecursionError):
            continue
    return None


def _snapshot_of(document: object) -> Snapshot:
    environment = environment_of(document)
    if environment is None:
        raise ReportError(
            'the JSON is not a tuneup report (no "environment" object): '
            "feed the output of `tuneup doctor --format json`"
        )
    gpus = environment.get("gpus")
    listed = len(gpus) if isinstance(gpus, list) else 0
    if listed > MAX_GPUS:  # cut before parsing: 10,000 GPU objects took 7 s to build
        environment = {**environment, "gpus": gpus[:MAX_GPUS]}
    try:
        snapshot = snapshot_from_json(environment)
    except (ValueError, TypeError) as error:
        raise ReportError(
            f"the tuneup JSON has a malformed environment ({error}); regenerate it"
        ) from None
    if listed > MAX_GPUS:
        snapshot.notes.append(f"only the first {MAX_GPUS} of {listed} gpus were read")
    return snapshot
