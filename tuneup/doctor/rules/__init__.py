"""The rules: pure functions from a snapshot to findings, one module per area."""

from __future__ import annotations

from tuneup.doctor import messages
from tuneup.doctor.readers.facts import noted_value
from tuneup.doctor.rules import (
    build,
    cpu,
    cudnn,
    driver,
    nccl,
    nvml,
    pasted,
    performance,
    python,
    rocm,
    visibility,
)
from tuneup.doctor.rules.context import Context, Diagnosis
from tuneup.machine.snapshot import Snapshot

# Order matters: visibility reads the driver's findings; pasted says what no other rule placed.
RULES = (build, driver, nvml, cudnn, nccl, visibility, rocm, python, performance, cpu, pasted)


def diagnose(
    snapshot: Snapshot, requested_torch: str | None = None, requested_python: str | None = None
) -> Diagnosis:
    """Run every rule over ``snapshot``; ``requested_*`` judge a torch/Python the user plans to use."""
    if requested_torch is None and snapshot.torch.version is None:
        text = " ".join(snapshot.messages)
        requested_torch = messages.requested_torch(text) or _installed_failed(snapshot, text)
    ctx = Context(snapshot, requested_torch, requested_python)
    for rule in RULES:
        rule.check(ctx)
    return ctx.diagnosis


def _installed_failed(snapshot: Snapshot, text: str) -> str | None:
    """The torch version an install command in the text asked for, when an installer's
    resolver error in the same text says it found none (uv's debug log names no version)."""
    failed = any(messages.BY_NAME[name].category == "python-unsupported"
                 for name in messages.recognised(text))
    return noted_value(snapshot, "install.torch") if failed else None
