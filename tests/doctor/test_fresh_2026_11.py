"""Real pastes that are mostly not collect_env output (tests/data/doctor-fresh-2026-11, issue 39).

Collected and given their expectations from the threads before any change for issue 39. First
run: 20/41 right (18 refused as "no fact the doctor knows"). After the fact reader and never
refusing text: 29/41; after the registry rows (container toolkit, uv/pip, capability warnings):
38/41; after TU607 and the per-package installer check: 41/41 — those last steps were made
looking at this set, so the figure a maintainer's unseen set gives is the one that counts.
"""

from __future__ import annotations

import json
from pathlib import Path


from tuneup.doctor.readers import read_report
from tuneup.doctor.rules import diagnose

SET = Path(__file__).parents[1] / "data" / "doctor-fresh-2026-11"
CASES = sorted(p.name for p in SET.glob("case*"))


def verdict(case: str) -> tuple[bool, bool]:
    """(the report alone holds the thread's categories, it claims an error the thread did not)."""
    meta = json.loads((SET / case / "meta.json").read_text())
    diagnosis = diagnose(read_report((SET / case / "collect_env.txt").read_text()))
    expect = meta["expect"]
    errors = {f.category for f in diagnosis.findings if f.severity == "error"}
    right = diagnosis.errors == 0 if expect == ["healthy"] else (
        set(expect) <= {f.category for f in diagnosis.findings})
    return right, bool(errors - set(expect))


def test_the_set_is_mostly_not_collect_env() -> None:
    kinds = [json.loads((SET / c / "meta.json").read_text())["kind"] for c in CASES]
    assert len(CASES) >= 40 and sum("collect_env" not in k for k in kinds) >= len(CASES) / 3


def test_the_report_alone_is_right_on_nine_in_ten_without_false_errors() -> None:
    results = [verdict(case) for case in CASES]
    assert sum(right for right, _ in results) >= 0.9 * len(CASES)
    assert not any(false for _, false in results)


HOLDOUT = Path(__file__).parents[1] / "data" / "doctor-holdout-2026-11"


def test_the_holdout_set_gets_no_error_its_thread_did_not_confirm() -> None:
    """Six pastes no rule was written from (first and only run: 3/6 right; the misses are prose
    in Chinese, a driver named only in a sentence about upgrading it, and a thread whose fix
    contradicts the wheel tables). Their score is reported, not asserted; a false error is not
    allowed."""
    for case in sorted(p.name for p in HOLDOUT.glob("case*")):
        meta = json.loads((HOLDOUT / case / "meta.json").read_text())
        diagnosis = diagnose(read_report((HOLDOUT / case / "collect_env.txt").read_text()))
        errors = {f.category for f in diagnosis.findings if f.severity == "error"}
        assert not errors - set(meta["expect"]), (case, errors)
