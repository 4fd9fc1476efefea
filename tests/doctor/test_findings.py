"""The finding registry and its reference page stay in step."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tuneup.doctor.findings import AREAS, REGISTRY, finding

DOCS = Path(__file__).parents[2] / "docs" / "findings.md"
REQUIRED = {
    "arch-unsupported",
    "driver-too-old",
    "cpu-only-build",
    "cudnn-mismatch",
    "nccl-problem",
    "no-gpu-visible",
    "rocm-build",
    "python-unsupported",
}


def test_every_code_is_documented_with_its_category() -> None:
    text = DOCS.read_text()
    documented = dict(re.findall(r"^### (TU\d{3}) `([a-z-]+)`", text, re.MULTILINE))
    assert documented == {code: entry.category for code, entry in REGISTRY.items()}


def test_required_categories_and_areas_exist() -> None:
    assert REQUIRED <= {entry.category for entry in REGISTRY.values()}
    assert {entry.area for entry in REGISTRY.values()} <= set(AREAS)


def test_findings_only_from_registered_codes_and_severities() -> None:
    made = finding("TU201", "error", "m", "f")
    assert (made.category, made.area) == ("driver-too-old", "driver")
    with pytest.raises(KeyError):
        finding("TU999", "error", "m")
    with pytest.raises(ValueError):
        finding("TU201", "fatal", "m")
