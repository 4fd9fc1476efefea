"""Real reports from threads the doctor's rules were not written from (tests/data/doctor-unseen).

Each case's expectation comes from its thread and was recorded before the doctor ran on it.
Score on first measurement (before any change made for these cases): 11/18
(cases 09, 11, 12, 13, 15, 16, 18 missed: a capability warning pasted without a version line,
"Torch not compiled with CUDA enabled" next to an nvidia-smi header, an NCCL symbol error retyped
without its colon). After generalising the reader and the build rules: 18/18; case08 went from a
TU102 warning to a TU101 error once the suffixed version in prose and the nvidia-smi -L line were read.
A case the doctor still gets wrong is listed in KNOWN_MISSES with the reason (strict xfail: a
fix that makes it pass must move it out of the list).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuneup.doctor.readers import ReportError, read_report
from tuneup.doctor.rules import diagnose

UNSEEN = Path(__file__).parents[1] / "data" / "doctor-unseen"
CASES = sorted(p.name for p in UNSEEN.glob("case*"))
KNOWN_MISSES: dict[str, str] = {}


def verdict(case: str) -> tuple[bool, list[str]]:
    """(correct, what the doctor said) for one case, judged as tests/doctor/test_corpus.py does."""
    meta = json.loads((UNSEEN / case / "meta.json").read_text())
    try:
        diagnosis = diagnose(read_report((UNSEEN / case / "collect_env.txt").read_text()))
    except ReportError as error:  # the reader refused the text: a miss, not a crash
        return False, [f"refused: {error}"]
    said = [f"{f.code} {f.category} {f.severity}" for f in diagnosis.findings]
    expect = meta["expect"]
    if expect == ["healthy"]:
        return diagnosis.errors == 0, said
    found = {f.category for f in diagnosis.findings}
    fixes = all(f.fix for f in diagnosis.findings if f.category in expect and f.severity == "error")
    return set(expect) <= found and fixes, said


def test_unseen_corpus_is_present() -> None:
    assert len(CASES) >= 15


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=pytest.mark.xfail(reason=KNOWN_MISSES[c], strict=True))
     if c in KNOWN_MISSES else c for c in CASES],
)
def test_unseen_case(case: str) -> None:
    correct, said = verdict(case)
    assert correct, said
