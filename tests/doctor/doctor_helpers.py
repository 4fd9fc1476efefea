"""Builders for hand-made snapshots in the rule tests."""

from __future__ import annotations

from typing import Any

from tuneup.doctor.rules import diagnose
from tuneup.doctor.rules.context import Diagnosis
from tuneup.machine.snapshot import GPU, Driver, Platform, Snapshot, TorchBuild


def machine(
    torch: dict[str, Any] | None = None,
    driver: str | None = None,
    gpus: list[str] | None = None,
    os: str = "Ubuntu 22.04.4 LTS (x86_64)",
    python: str = "3.11.9",
    **extra: Any,
) -> Snapshot:
    """A report-like snapshot: ``torch`` holds TorchBuild fields, ``gpus`` GPU names."""
    return Snapshot(
        source="collect_env",
        platform=Platform(python_version=python, os=os),
        torch=TorchBuild(**{"installed": True, **(torch or {})}),
        driver=Driver(version=driver),
        gpus=[GPU(index=i, name=name) for i, name in enumerate(gpus)] if gpus is not None else None,
        **extra,
    )


def cuda_torch(version: str, available: bool | None = True) -> dict[str, Any]:
    local = version.split("+")[1]
    cuda = f"{int(local[2:-1])}.{local[-1]}"
    return {"version": version, "build": "cuda", "cuda": cuda, "cuda_available": available}


def run(snapshot: Snapshot, **requested: str) -> Diagnosis:
    return diagnose(snapshot, **requested)


def categories(diagnosis: Diagnosis) -> set[str]:
    return {f.category for f in diagnosis.findings}


def codes(diagnosis: Diagnosis) -> set[str]:
    return {f.code for f in diagnosis.findings}


def only(diagnosis: Diagnosis, code: str):
    found = [f for f in diagnosis.findings if f.code == code]
    assert len(found) == 1, [f.code for f in diagnosis.findings]
    return found[0]
