"""scripts/gpu_suite.sh: the suite on a lent GPU machine, its failures named in a file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_run_names_its_result_and_leaves_the_log(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_suite.sh"), str(tmp_path), "120",
         "tests/doctor/test_knowledge.py", "-k", "release"],
        capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable},
        timeout=180, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("gpu_suite: exit 0; ") and " 0 failed or errored" in done.stdout
    assert (tmp_path / "failures.txt").read_text() == ""
    assert "PASSED" in (tmp_path / "pytest.log").read_text()
