"""Real training jobs under the watcher (on the CPU; the images example on the GPU where there
is one): the verdicts come from what was measured while they ran (the runtime's feed, or
process CPU without it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from tuneup.cli import main
from tuneup.runtime.hooks import ENV_OBSERVERS
from tuneup.watch import feed

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def defaults(monkeypatch):
    """PyTorch's defaults, whatever settings file an autotune run left beside the examples."""
    monkeypatch.setenv("TUNEUP_DISABLE", "1")


def watch(tmp_path: Path, *command: str) -> dict:
    summary = tmp_path / "summary.json"
    result = CliRunner().invoke(main, ["watch", "--interval", "0.25", "--summary", str(summary),
                                       "--", sys.executable, *command])
    assert result.exit_code == 0, result.output
    return json.loads(summary.read_text())


def test_the_image_example_is_input_bound(tmp_path):
    result = watch(tmp_path, str(EXAMPLES / "train_images.py"), "--steps", "8")
    verdict = result["verdict"]
    assert verdict["kind"] == "input-bound", verdict
    assert verdict["evidence"]["data_wait_share"] >= 0.10 and verdict["evidence"]["workers"] == 0
    assert "num_workers=0" in verdict["action"]
    assert "`tuneup autotune" in verdict["action"] and "--only loader`" in verdict["action"]


def test_the_mlp_example_is_compute_bound(tmp_path, no_gpu):
    # on the CPU on any machine: on a GPU this small MLP may well wait for its loader. The
    # watcher reads no GPU either (no_gpu hides NVML): the CPU path, whatever the machine
    result = watch(tmp_path, str(EXAMPLES / "train_mlp.py"), "--steps", "12", "--device", "cpu")
    verdict = result["verdict"]
    assert verdict["kind"] == "compute-bound", verdict
    assert verdict["evidence"]["data_wait_share"] < 0.10
    assert result["figures"]["steps"] == 12 and result["figures"]["runtime"]["batch_size"] == 256


SLOW_READS = textwrap.dedent("""
    import time, torch
    from tuneup import tuned_loader, tuned_loop

    class SlowReads(torch.utils.data.Dataset):  # every sample waits on storage
        def __len__(self):
            return 64
        def __getitem__(self, index):
            time.sleep(0.01)
            return torch.randn(8), index % 2

    model = torch.nn.Linear(8, 2)
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for _ in range(2):
        for batch in tuned_loader(SlowReads(), batch_size=16, loop=loop):
            loop.train_step(batch, lambda b: torch.nn.functional.cross_entropy(model(b[0]), b[1]))
""")


def watch_attached(tmp_path: Path, job: subprocess.Popen) -> dict:
    """The summary of ``tuneup watch --pid`` on ``job``, which it waits for."""
    try:
        summary = tmp_path / "summary.json"
        result = CliRunner().invoke(main, ["watch", "--pid", str(job.pid), "--interval", "0.25",
                                           "--summary", str(summary)])
    finally:
        job.wait()
    assert result.exit_code == 0, result.output
    return json.loads(summary.read_text())


def test_attaching_to_a_job_started_with_the_feed_reads_its_figures(tmp_path, no_gpu):
    """A CPU job, watched without a GPU's figures: the CPU path, whatever the machine."""
    script = tmp_path / "slow_reads.py"
    script.write_text(SLOW_READS)
    directory = tmp_path / "feed"
    directory.mkdir()
    env = {**os.environ, ENV_OBSERVERS: feed.OBSERVER, feed.ENV_FEED: str(directory)}
    job = subprocess.Popen([sys.executable, str(script)], env=env)
    data = watch_attached(tmp_path, job)
    assert data["verdict"]["kind"] == "input-bound", data
    assert data["verdict"]["evidence"]["data_wait_share"] > 0.5
    assert data["figures"]["steps"] == 8  # the final counters, written as the job exited
    assert not any(note.startswith("no runtime feed") for note in data["notes"])


def test_a_job_attached_before_it_execs_still_gets_its_feed_read(tmp_path, no_gpu):
    """Between fork and exec a process shows its parent's environment: the watcher reads
    the job's again until the feed appears (CI caught the race on a loaded machine). A CPU
    job, watched without a GPU's figures."""
    script = tmp_path / "slow_reads.py"
    script.write_text(SLOW_READS)
    directory = tmp_path / "feed"
    directory.mkdir()
    env = {**os.environ, ENV_OBSERVERS: feed.OBSERVER, feed.ENV_FEED: str(directory)}
    later = ("import os, sys, time; time.sleep(1.0); "
             f"os.execve(sys.executable, [sys.executable, {str(script)!r}], {env!r})")
    job = subprocess.Popen([sys.executable, "-c", later])  # no feed until it execs
    data = watch_attached(tmp_path, job)
    assert data["verdict"]["evidence"]["data_wait_share"] > 0.5, data
    assert data["figures"]["steps"] == 8
    assert not any(note.startswith("no runtime feed") for note in data["notes"])


# Plain PyTorch, no wrappers: DataLoader workers' CPU against the main process's decides.
PLAIN = textwrap.dedent("""
    import sys, time, torch
    from torch.utils.data import DataLoader, Dataset
    sys.path.insert(0, {examples!r})
    import train_mlp

    class Decoded(Dataset):  # pure-Python work per sample, as a decoder does
        def __len__(self):
            return 4096
        def __getitem__(self, index):
            total = 0
            for n in range(30000):
                total += n * index % 7
            return torch.full((train_mlp.FEATURES,), float(total % 3)), index % 10

    if __name__ == "__main__":
        torch.manual_seed(0)
        heavy = sys.argv[1] == "decode"
        if heavy:
            torch.set_num_threads(1)  # one for training, one core for the worker: no contention
        dataset = Decoded() if heavy else train_mlp.make_dataset(2048)
        model = train_mlp.make_model()
        optimizer = train_mlp.make_optimizer(model)
        loader = DataLoader(dataset, batch_size=64 if heavy else 256, shuffle=True,
                            num_workers=1)
        end = time.monotonic() + 3
        while time.monotonic() < end:
            for batch in loader:
                optimizer.zero_grad()
                train_mlp.compute_loss(model, batch).backward()
                optimizer.step()
                if time.monotonic() >= end:
                    break
""")


@pytest.mark.parametrize(("work", "kind"), [("decode", "input-bound"), ("mlp", "compute-bound")])
def test_plain_pytorch_with_workers(tmp_path, work, kind, no_gpu):
    # CPU jobs whose plain DataLoaders name no device: with a GPU's figures the watcher
    # calls the mlp host-bound (no_gpu hides NVML from it)
    script = tmp_path / "plain.py"
    script.write_text(PLAIN.format(examples=str(EXAMPLES)))
    result = watch(tmp_path, str(script), work)
    verdict = result["verdict"]
    assert verdict["kind"] == kind, (verdict, result["figures"])
    # measured without a code change: the plain-DataLoader probe publishes the data wait
    assert verdict["evidence"]["workers"] == 1 and verdict["evidence"]["data_wait_share"] is not None
