"""Scripts that train in processes they spawn (Hogwild: one mp.Process per trainer, each
with its own tuned_loop): refused with one line, every trial measured by no process twice
(once "38 trials", each measured once per trainer at different speeds)."""

from __future__ import annotations

import time

import pytest

from tuneup.autotune.runner import Runner
from tuneup.autotune.search import Search
from tuneup.autotune.spawned import refusal
from tuneup.errors import ScriptError

HOGWILD = '''
import os
import torch
import torch.multiprocessing as mp
from torch.utils.data import TensorDataset
from tuneup import tuned_loader, tuned_loop


def train(rank, model):
    torch.manual_seed(rank)
    x = torch.randn(256, 8)
    dataset = TensorDataset(x, (x[:, 0] > 0).long())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loop = tuned_loop(model, optimizer)
    loader = tuned_loader(dataset, batch_size=32, shuffle=True, loop=loop)
    for epoch in range(200):
        for features, labels in loader:
            loop.train_step((features, labels),
                            lambda b: torch.nn.functional.cross_entropy(loop.model(b[0]), b[1]))


if __name__ == "__main__":
    mp.set_start_method("fork")
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    model.share_memory()
    processes = [mp.Process(target=train, args=(rank, model)) for rank in range(2)]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
    # the script's own process goes on after its trainers (a test pass): it adds nothing
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.01))
    print("trained")
'''


def test_a_script_training_in_spawned_processes_is_refused_in_one_line(tmp_path):
    script = tmp_path / "hogwild.py"
    script.write_text(HOGWILD)
    started = []
    with Runner(script, deadline=time.monotonic() + 90, on_trial_start=started.append) \
            as runner, pytest.raises(ScriptError) as error:
        Search(runner).run()
    message = str(error.value)
    assert message == f"hogwild.py: {refusal(2)} — see docs/autotune.md"
    assert "\n" not in message and not started  # no trial ran, in any process


def test_the_refusal_names_the_fix():
    line = refusal(4)
    assert line.startswith("this script trains in 4 spawned processes (multiprocessing)")
    assert "measures one process's training loop" in line and "one trainer" in line
    assert refusal(1).startswith("this script trains in a spawned process")
