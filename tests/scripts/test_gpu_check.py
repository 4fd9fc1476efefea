"""scripts/gpu_check.py: its quick run on this machine (GPU or not), and how a run treats
checks that fail, need a GPU, or would end past the run's limit (fake checks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import gpu_check  # noqa: E402  (a script, not a package)

QUICK_ON_GPU = {"float16 + GradScaler", "micro-batch under OOM", "pin_memory + non_blocking"}


def test_the_quick_run_writes_every_check_and_exits_0(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPTS / "gpu_check.py"), "--out",
                           str(tmp_path), "--quick"], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    statuses = {check["name"]: check["status"] for check in report["checks"]}
    gpu = torch.cuda.is_available()
    assert list(statuses) == [check.name for check in gpu_check.checks(gpu, 100.0)]
    assert statuses["doctor"] == "ok"
    for name in QUICK_ON_GPU:
        assert statuses[name] == ("ok" if gpu else "not run (no GPU)"), report
    assert statuses["doctor --distributed"] == "not run (--quick)"
    assert "| doctor | ok |" in done.stdout and report["machine"]["gpu"] is gpu


def fake(name: str, outcome: str, limit: float = 1.0, needs_gpu: bool = False):
    def run(_: gpu_check.Run) -> gpu_check.Result:
        if outcome == "fails":
            raise gpu_check.CheckFailed("loss differs", {"loss": 1.0})
        if outcome == "bug":
            raise KeyError("steps")
        return gpu_check.Result(name, gpu_check.OK, summary="fine")
    return gpu_check.Check(name, run, limit, needs_gpu=needs_gpu)


@pytest.mark.parametrize("gpu", [False, True])
def test_a_failing_check_is_reported_and_the_others_still_run(tmp_path, monkeypatch, gpu):
    monkeypatch.setattr(gpu_check, "CPU_TOTAL_S", 100.0)
    monkeypatch.setattr(gpu_check, "GPU_TOTAL_S", 100.0)
    monkeypatch.setattr(gpu_check, "checks", lambda gpu, budget: [
        fake("fails", "fails"), fake("bug", "bug"), fake("cuda", "ok", needs_gpu=True),
        fake("too long", "ok", limit=1000.0), fake("last", "ok")])
    results = gpu_check.run_all(gpu_check.Run(tmp_path, gpu, 100.0), quick=False)
    assert [(r.name, r.status) for r in results] == [
        ("fails", "failed"), ("bug", "failed"),
        ("cuda", "ok" if gpu else "not run (no GPU)"),
        ("too long", "not run (time limit)"), ("last", "ok")]
    assert results[0].details == {"loss": 1.0} and results[1].summary == "KeyError: 'steps'"
