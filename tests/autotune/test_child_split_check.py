"""The autotune child never measures a micro-batch that trains another model (issue 31): a
BatchNorm model trains whole batches in the trial and says why; a loss that mixes the
batch's samples fails the trial at its first split, so the search cannot keep it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = '''
import os
import torch
from torch.nn import functional as F
from torch.utils.data import TensorDataset
from tuneup import tuned_loader, tuned_loop

x = torch.randn(128, 8, generator=torch.Generator().manual_seed(1))
dataset = TensorDataset(x, (x[:, 0] > 0).long())
norm = [torch.nn.BatchNorm1d(16)] if os.environ.get("BATCHNORM") else []
model = torch.nn.Sequential(torch.nn.Linear(8, 16), *norm, torch.nn.Tanh(), torch.nn.Linear(16, 2))
loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
loader = tuned_loader(dataset, batch_size=32, shuffle=True, drop_last=True, loop=loop)


def loss_fn(batch):
    features, labels = batch
    if len(features) > int(os.environ.get("OOM_ABOVE", "1000000")):  # an OOM stand-in
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    out = loop.model(features)
    if os.environ.get("CONTRASTIVE"):  # each sample against the rest of its batch
        z = F.normalize(out, dim=1)
        return F.cross_entropy(z @ z.T / 0.1, torch.arange(len(z)))
    return F.cross_entropy(out, labels)


for epoch in range(1000):
    for batch in loader:
        loop.train_step(batch, loss_fn)
'''

TRIALS = [{"id": "baseline", "knobs": {}, "check": True},
          {"id": "mb=8", "knobs": {"micro_batch_size": 8}, "check": True}]


def run_child(tmp_path: Path, trials: list[dict] = TRIALS,
              **env: str) -> tuple[subprocess.CompletedProcess, dict[str, dict]]:
    """The script under a two-trial plan, as ``tuneup autotune`` starts it; its trial ends."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    results = tmp_path / "results.jsonl"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({
        "protocol": 1, "results": str(results), "warmup_steps": 1, "measure_steps": 2,
        "min_measure_seconds": 0.0, "max_measure_steps": 3, "check_steps": 2, "trials": trials}))
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TUNEUP_")}
    environment.update(env, TUNEUP_PROBE=str(plan), OMP_NUM_THREADS="1",
                       TUNEUP_OBSERVERS="tuneup.autotune.child:install")
    process = subprocess.run([sys.executable, str(script)], env=environment, cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
    events = [json.loads(line) for line in results.read_text().splitlines()]
    return process, {e["id"]: e for e in events if e["event"] == "trial_end"}


def test_a_batchnorm_trial_trains_whole_batches_and_reports_why(tmp_path):
    process, ends = run_child(tmp_path, BATCHNORM="1")
    assert process.returncode == 0, process.stderr
    trial = ends["mb=8"]
    assert trial["status"] == "ok" and trial["micro_batch_size"] is None
    assert trial["micro_batch_blocked"].startswith(
        "BatchNorm1d '1' normalises with the statistics of the batch it is given")
    assert trial["check_losses"] == ends["baseline"]["check_losses"]  # whole batches, bit for bit


def test_a_contrastive_loss_fails_its_micro_batch_trial_with_the_reason(tmp_path):
    process, ends = run_child(tmp_path, CONTRASTIVE="1")
    assert process.returncode == 3  # a failed trial: the search rejects it, never keeps it
    assert ends["baseline"]["status"] == "ok"
    trial = ends["mb=8"]
    assert trial["status"] == "error" and trial["phase"] == "warmup"
    assert trial["message"].startswith("SettingsError: micro_batch_size=8 is not applied: the "
                                       "split changes the gradient (")
    assert trial["message"].endswith("% relative): the loss or a layer mixes samples")
    assert trial["micro_batch_blocked"] == trial["message"].split(" is not applied: ")[1]


def test_when_the_whole_batch_does_not_fit_the_trial_says_micro_batches_cannot_help(tmp_path):
    """The baseline ran out of memory; the micro-batch that fits mixes samples: the trial
    fails as out of memory with the reason, which the search turns into "micro-batches
    cannot help" instead of trying smaller ones."""
    process, ends = run_child(tmp_path, TRIALS[1:], CONTRASTIVE="1", OOM_ABOVE="8")
    assert process.returncode == 3
    trial = ends["mb=8"]
    assert trial["status"] == "oom"
    assert trial["micro_batch_blocked"].startswith("the split changes the gradient (")
