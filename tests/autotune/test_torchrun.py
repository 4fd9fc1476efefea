"""Trials under torchrun (2 ranks on gloo, a real DDP script): one merged result per trial
at the slowest rank's pace, and a rank that fails, dies or hangs ends the trial on every
rank with one record naming it, leaving no process and no file behind."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from tuneup.autotune.protocol import CRASH, ERROR, HANG, OK
from tuneup.autotune.runner import Runner
from tuneup.autotune.trials import Trial
from tuneup.cli import main
from tuneup.settings import Knobs, read

pytestmark = pytest.mark.slow

DDP_SCRIPT = textwrap.dedent("""
    import os, sys, time, torch, torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from tuneup import tuned_loader, tuned_loop

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    fault, at = sys.argv[1], int(sys.argv[2])
    entered = sys.argv[3] if len(sys.argv) > 3 else None  # a file made as the fault begins
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(16, 4))
    data = torch.utils.data.TensorDataset(torch.randn(1024, 16), torch.randint(0, 4, (1024,)))
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.05))
    loader = tuned_loader(data, batch_size=32, shuffle=True, loop=loop)
    steps = 0

    def fail_here():
        if entered:
            open(entered, "w").close()
        if fault == "raise":
            raise ValueError("a bad sample on rank 1")
        if fault == "kill":
            os.kill(os.getpid(), 9)
        if fault == "hang":
            time.sleep(600)

    for epoch in range(100):
        for batch in loader:
            steps += 1
            if rank == 1 and steps == at:
                fail_here()
            loop.train_step(batch, lambda b: F.cross_entropy(loop.model(b[0]), b[1]))
""")
WINDOW = {"warmup_steps": 1, "measure_steps": 4, "min_measure_seconds": 0.2,
          "max_measure_steps": 12, "check_steps": 2}


def run(tmp_path: Path, fault: str, at: int, trials: list[Trial],
        timeout: float = 60.0) -> tuple[Runner, list]:
    script = tmp_path / "train_ddp.py"
    script.write_text(DDP_SCRIPT)
    with Runner(script, [fault, str(at)], nproc_per_node=2, timeout=timeout,
                plan=WINDOW) as runner:
        results = runner.run(trials)
        workdir = runner._workdir
    assert not workdir.exists()
    assert psutil.Process().children(recursive=True) == []  # torchrun and every rank gone
    return runner, results


def test_each_trial_is_one_result_at_the_slowest_ranks_pace(tmp_path):
    trials = [Trial("baseline", Knobs(), check=True),
              Trial("micro", Knobs(micro_batch_size=8), check=True)]
    runner, (baseline, micro) = run(tmp_path, "none", 0, trials)
    assert baseline.status == micro.status == OK, (baseline.message, micro.message)
    assert runner.facts.effective_batch == 32 and runner.facts.usable_cores >= 1
    # the ranks agreed on one window, each step at the slower rank's time
    assert 3 <= len(baseline.step_s_all) <= 12
    assert baseline.samples_per_s == pytest.approx(2 * 32 / baseline.step_s, rel=0.01)
    # the same start and batches on each rank: a micro-batched trial checks the same losses
    assert micro.micro_batch_size == 8
    assert micro.check_losses == pytest.approx(baseline.check_losses, rel=1e-4)


@pytest.mark.parametrize(("fault", "statuses", "says"), [
    ("raise", {ERROR}, ("rank 1: ValueError: a bad sample on rank 1",)),
    # rank 0 records the lost peer, or the agent stops it first: rank 1 is named either way
    ("kill", {ERROR, CRASH}, ("rank 1 failed first (exit code -9 (SIGKILL))",
                              "rank 1 died (exit code -9 (SIGKILL))")),
    ("hang", {HANG}, ("no progress in 6 s during the trial",)),
])
def test_a_failing_rank_ends_the_trial_on_all_ranks_with_one_record(tmp_path, fault, statuses,
                                                                      says):
    _, (result,) = run(tmp_path, fault, 3, [Trial("baseline", Knobs())], timeout=6.0)
    assert result.status in statuses and result.message.startswith(says), result.message


def test_the_command_tunes_a_ddp_script_and_writes_one_settings_file(tmp_path, budget_for_load):
    script = tmp_path / "train_ddp.py"
    script.write_text(DDP_SCRIPT)
    out = tmp_path / "ddp.tuneup.json"
    result = CliRunner().invoke(main, [
        "autotune", str(script), "--nproc-per-node", "2", "--budget", str(budget_for_load(45)),
        "--only", "loader",
        "--output", str(out), "--format", "json", "--", "none", "0"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{"):])
    assert summary["ranks"] == 2 and summary["effective_batch"] == 32
    assert any("torchrun with 2 local ranks" in note for note in summary["notes"])
    settings = read(out)
    assert settings.measured.effective_batch_size == 32 and settings.measured.baseline_samples_per_s > 0
    assert sorted(tmp_path.iterdir()) == sorted([script, out])  # no rank's file left


def test_a_killed_tuneup_takes_torchrun_and_a_stuck_rank_along(tmp_path):
    """SIGKILL while rank 1 sleeps and rank 0 waits in an all-reduce for it: neither ever
    reaches another step to notice, so the parent-death signals must end them."""
    script = tmp_path / "train_ddp.py"
    script.write_text(DDP_SCRIPT)
    hanging = tmp_path / "hanging"
    parent = subprocess.Popen(
        [sys.executable, "-m", "tuneup.cli", "autotune", str(script), "--nproc-per-node", "2",
         "--budget", "300", "--output", str(tmp_path / "out.json"), "--", "hang", "3",
         str(hanging)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not hanging.exists():  # rank 1 at its third step
        time.sleep(0.2)
    assert hanging.exists(), "rank 1 never reached its hang"
    time.sleep(1)  # rank 0 reaches the step's all-reduce and waits there
    tree = psutil.Process(parent.pid).children(recursive=True)
    assert len(tree) >= 3, tree  # the agent and its two ranks
    parent.kill()
    parent.wait()
    _, left = psutil.wait_procs(tree, timeout=15)
    assert [p for p in left if p.status() != psutil.STATUS_ZOMBIE] == []
