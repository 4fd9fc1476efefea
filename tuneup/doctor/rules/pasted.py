"""Pasted errors: a known message that no other rule explained becomes a finding of its own.

Runs after every other rule. Those know more (versions, tables, the GPU), so a category they
already reported is not repeated; what they could not place is still said, with the cause, the
fix and the confirming command from the message registry (:mod:`tuneup.doctor.messages`). A
message that is the program's fault, not the environment's, is said as such: the doctor never
refuses text that holds a known line.
"""

from __future__ import annotations

import re

from tuneup.doctor.findings import ERROR, INFO, WARNING
from tuneup.doctor.rules.context import Context

CODES = {  # category -> the finding code for "a pasted message says so"
    "arch-unsupported": "TU107",
    "cpu-only-build": "TU108",
    "driver-too-old": "TU203",
    "cudnn-mismatch": "TU305",
    "nccl-problem": "TU409",
    "no-gpu-visible": "TU505",
    "rocm-build": "TU606",
    "python-unsupported": "TU704",
    "program-error": "TU960",
}
SEVERITY = {"error": ERROR, "warning": WARNING, "info": INFO}
EXCERPT = 120


def check(ctx: Context) -> None:
    said: set[str] = set()
    for message, excerpt in ctx.pasted_messages:
        category = message.category
        code = CODES[category]
        settled = category in ctx.settled and not _about_another_package(excerpt)
        if category in said or ctx.has(category) or settled:
            continue  # said already, or a rule with the facts proved that part fine
        if ctx.explained(category):
            continue
        said.add(category)
        ctx.add(code, SEVERITY[message.severity],
                f"the pasted text says '{_short(excerpt)}': {message.means}.", message.fix)


def _about_another_package(excerpt: str) -> bool:
    """The installer's message names only packages other than torch (``torchvision==0.25.0``):
    what the rules proved of torch's wheels does not settle it."""
    named = {name.lower() for name in re.findall(r"([A-Za-z][\w.-]*)==", excerpt)}
    return bool(named) and not named & {"torch", "pytorch"}


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= EXCERPT else text[:EXCERPT - 1] + "…"

