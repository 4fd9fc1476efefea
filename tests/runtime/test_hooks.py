"""Observers named in the environment: a bad entry never stops the user's training."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import torch
    from torch.utils.data import TensorDataset
    from tuneup import tuned_loader, tuned_loop
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    for x, y in tuned_loader(data, batch_size=8):
        loss = loop.train_step((x, y), lambda b: ((loop.model(b[0]) - b[1]) ** 2).mean())
    print("trained", round(float(loss), 6))
""")


@pytest.mark.parametrize("entry", ["tuneup.watch.fed:install", "tuneup.watch.feed:instal",
                                   "json:dumps"])
def test_an_observer_entry_that_cannot_load_is_one_warning_and_training_runs(tmp_path, entry):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {key: value for key, value in os.environ.items() if not key.startswith("TUNEUP_")}
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           env=env, timeout=120)
    observed = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              env={**env, "TUNEUP_OBSERVERS": entry}, timeout=120)
    assert observed.returncode == 0, observed.stderr
    assert observed.stdout == plain.stdout and "trained" in plain.stdout
    said = [line for line in observed.stderr.splitlines() if "tuneup:" in line]
    assert len(said) == 1 and entry in said[0] and "unset TUNEUP_OBSERVERS" in said[0]
    assert "Traceback" not in observed.stderr
