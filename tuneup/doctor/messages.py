"""The error and warning texts the doctor recognises: one registry for readers and rules.

People paste what they have: a few collect_env lines, or only the error torch, pip, uv, NCCL,
HIP, Windows or a container runtime printed. Each known text is evidence in its own right:
readers accept any text holding one, rules look them up by name instead of keeping their own
copy of the pattern, and :mod:`tuneup.doctor.rules.pasted` turns a text no other rule explains
into a finding of its category (or says it is a fault of the program, not the environment).

Two data files hold the texts, each row with its category, cause, fix and source:
``data/messages.csv`` (written from torch's, NCCL's, HIP's, the installers' and the container
toolkit's sources) and ``data/cuda_errors.csv`` (every ``cudaError_t`` and ``CUresult``,
harvested from a CUDA toolkit by ``scripts/harvest_cuda_errors.py``).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

DATA_DIR = Path(__file__).parent / "data"
MIN_BARE_TEXT = 30  # a cudaGetErrorString text this long is specific enough without a prefix
SCANNED_CHARS = 1 << 16  # of each end of a text: a traceback ends with its error


@dataclass(frozen=True)
class Message:
    name: str
    origin: str  # who prints it: torch, nccl, pip, cuda-runtime, ...
    pattern: re.Pattern[str]
    category: str  # a finding category, or "program-error" (not the environment's fault)
    severity: str  # what the text alone proves: "error", a lead ("warning"), or "info"
    means: str  # the cause, for the finding and the docs
    fix: str
    source: str
    example: str  # a real text it matches: the registry's own test reads each one


def _curated() -> list[Message]:
    with open(DATA_DIR / "messages.csv", newline="", encoding="utf-8") as handle:
        return [Message(row["name"], row["origin"], re.compile(row["pattern"], re.IGNORECASE),
                        row["category"], row["severity"], row["cause"], row["fix"], row["source"],
                        row["example"])
                for row in csv.DictReader(handle)]


def _cuda_codes() -> list[Message]:
    """A code is recognised by its name (``cudaErrorNoDevice``, ``CUDA_ERROR_NO_DEVICE``), or
    by its text after ``CUDA error:`` / ``Error 804:`` (a long text also on its own)."""
    with open(DATA_DIR / "cuda_errors.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    found = []
    for row in rows:
        forms = [rf"\b{row['name']}\b"]
        if row["text"]:
            text = re.escape(row["text"])
            forms.append(rf"(?:CUDA (?:driver )?error|Error {row['code']}):? {text}")
            if len(row["text"]) >= MIN_BARE_TEXT:
                forms.append(text)
        example = f"CUDA error: {row['text']}" if row["text"] else f"error {row['name']}"
        found.append(Message(row["name"], row["api"], re.compile("|".join(forms), re.IGNORECASE),
                             row["category"], row["severity"], row["cause"], row["fix"],
                             row["source"], example))
    return found


MESSAGES = tuple(_curated()) + tuple(_cuda_codes())
BY_NAME = {message.name: message for message in MESSAGES}
PIP_REQUEST = r"(?:No matching distribution found for|satisfies the requirement)\s+"
REQUESTED_TORCH = re.compile(
    PIP_REQUEST + r"(?:torch|pytorch)\s*==\s*(\d+\.\d+(?:\.\d+)?)", re.IGNORECASE,
)


def recognised(text: str) -> list[str]:
    """Names of the known messages ``text`` holds, in registry order (its first and last
    :data:`SCANNED_CHARS`: a long log is not read whole, and its error is at its end)."""
    if len(text) > 2 * SCANNED_CHARS:
        text = text[:SCANNED_CHARS] + "\n" + text[-SCANNED_CHARS:]
    return [message.name for message in MESSAGES if message.pattern.search(text)]


def says(text: str, name: str) -> bool:
    return find(text, name) is not None


def find(text: str, name: str) -> re.Match[str] | None:
    """The first place ``text`` holds the message ``name`` (its named groups are facts)."""
    return BY_NAME[name].pattern.search(text)


def requested_torch(text: str) -> str | None:
    """The torch version a pasted pip error asked for (``torch==2.5.1``), if any."""
    match = REQUESTED_TORCH.search(text)
    return match.group(1) if match else None
