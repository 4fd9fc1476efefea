"""Render a diagnosis: a rich terminal report grouped by area, or one JSON object."""

from __future__ import annotations

import json
import re
from typing import IO, Any

from tuneup import __version__
from tuneup.doctor.findings import AREAS, ERROR, WARNING, Finding
from tuneup.doctor.rules.context import Diagnosis
from tuneup.machine.snapshot import Snapshot

MARKS = {ERROR: ("✗", "bold red"), WARNING: ("⚠", "yellow"), "info": ("•", "cyan")}
# the readers' note on a report listing more GPUs than they read (readers.bounded)
GPUS_CUT = re.compile(r"only the first (\d+) of (\d+) gpus were read")


def to_json(snapshot: Snapshot, diagnosis: Diagnosis) -> dict[str, Any]:
    """The ``--format json`` object (its ``environment`` reads back with ``--from``)."""
    return {
        "tuneup": __version__,
        "environment": snapshot.to_dict(),
        "findings": [f.to_dict() for f in diagnosis.findings],
        "summary": {"errors": diagnosis.errors, "warnings": diagnosis.warnings},
        "unchecked": [f"{area}: {text}" for area, text in diagnosis.unchecked],
        "passed": [f"{area}: {text}" for area, text in diagnosis.passed],
    }


def write_json(snapshot: Snapshot, diagnosis: Diagnosis, out: IO[str]) -> None:
    json.dump(to_json(snapshot, diagnosis), out, indent=2, allow_nan=False)
    out.write("\n")


def environment_line(snapshot: Snapshot) -> str:
    """One line naming the facts the diagnosis rests on."""
    torch = snapshot.torch
    parts = []
    if torch.version:
        build = (
            f" (CUDA {torch.cuda})" if torch.cuda else f" (ROCm {torch.hip})" if torch.hip else ""
        )
        parts.append(f"torch {torch.version}{build}")
    elif torch.installed is False:
        parts.append("torch not installed")
    if snapshot.driver.version:
        parts.append(f"driver {snapshot.driver.version}")
    if snapshot.gpus:
        names = ", ".join(g.name or "?" for g in snapshot.gpus)
        listed = _gpus_listed(snapshot)
        count = (f"only {len(snapshot.gpus)} of {listed} GPUs read" if listed is not None
                 else f"{len(snapshot.gpus)} GPU")
        parts.append(f"{count}: {names}")
    elif snapshot.gpus == []:
        parts.append("no GPU")
    if snapshot.platform.python_version:
        parts.append(f"Python {snapshot.platform.python_version}")
    if snapshot.platform.os:
        parts.append(snapshot.platform.os)
    return " · ".join(parts) or "no facts"


def _gpus_listed(snapshot: Snapshot) -> int | None:
    """How many GPUs the report listed, when the reader kept only the first of them."""
    for note in snapshot.notes:
        cut = GPUS_CUT.fullmatch(note)
        if cut is not None:
            return int(cut[2])
    return None


def write_text(snapshot: Snapshot, diagnosis: Diagnosis, out: IO[str] | None = None) -> None:
    """Terminal report; rich drops colour by itself when ``out`` is not a terminal."""
    from tuneup import terminal
    from rich.markup import escape

    console = terminal.console(file=out, highlight=False, soft_wrap=True)
    source = "this machine" if snapshot.source == "live" else f"a {snapshot.source} report"
    console.print(f"[bold]tuneup doctor[/bold] — {source}")
    console.print(escape(environment_line(snapshot)))
    for note in snapshot.notes:  # what the fact reader took from free text, quoted (issue 39)
        if note.startswith(("read from the text: ", "no collect_env report")):
            console.print(f"  [dim]{escape(note)}[/dim]")
    for area, title in AREAS.items():
        findings = [f for f in diagnosis.findings if f.area == area]
        passed = [text for a, text in diagnosis.passed if a == area]
        unchecked = [text for a, text in diagnosis.unchecked if a == area]
        if not (findings or passed or unchecked):
            continue
        console.print(f"\n[bold]{title}[/bold]")
        for f in _by_severity(findings):
            mark, style = MARKS[f.severity]
            console.print(f"  [{style}]{mark}[/{style}] {f.code} {escape(f.message)}")
            if f.fix:
                console.print(f"      fix: {escape(f.fix)}")
        for text in passed:
            console.print(f"  [green]✓[/green] {escape(text)}")
        for text in unchecked:
            console.print(f"  [dim]? not checked: {escape(text)}[/dim]")
    console.print(f"\n{_summary(diagnosis)}")


def _by_severity(findings: list[Finding]) -> list[Finding]:
    order = {ERROR: 0, WARNING: 1}
    return sorted(findings, key=lambda f: order.get(f.severity, 2))


def _summary(diagnosis: Diagnosis) -> str:
    errors, warnings = diagnosis.errors, diagnosis.warnings
    infos = len(diagnosis.findings) - errors - warnings
    text = f"{errors} error(s), {warnings} warning(s), {infos} note(s)"
    if diagnosis.unchecked:
        text += f", {len(diagnosis.unchecked)} check(s) not possible from the facts at hand"
    return text
