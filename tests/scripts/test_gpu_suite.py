"""scripts/gpu_suite.sh: the suite on a lent GPU machine, its failures named in a file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def suite(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu_suite.sh"), str(out), "120", *args],
                          capture_output=True, text=True, timeout=180, check=False,
                          env={**os.environ, "PYTHON": sys.executable}, cwd=out.parent)


def test_a_passing_run_names_its_result_and_leaves_the_log(tmp_path: Path) -> None:
    done = suite(tmp_path / "out", "tests/doctor/test_knowledge.py", "-k", "release")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("gpu_suite: exit 0; ") and " 0 failed or errored" in done.stdout
    assert (tmp_path / "out" / "failures.txt").read_text() == ""
    assert "PASSED" in (tmp_path / "out" / "pytest.log").read_text()


def test_each_failure_is_named_once(tmp_path: Path) -> None:
    tests = tmp_path / "test_planted.py"
    tests.write_text("def test_fine():\n    pass\n\n\ndef test_broken():\n    assert 0\n")
    done = suite(tmp_path / "out", str(tests))
    assert done.returncode == 1 and "1 passed, 1 failed or errored" in done.stdout
    named = (tmp_path / "out" / "failures.txt").read_text().splitlines()
    assert len(named) == 1 and named[0].startswith("FAILED ")
    assert named[0].endswith("test_planted.py::test_broken")
