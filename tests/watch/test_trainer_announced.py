"""A process that makes a training loader is named a trainer from then on, before its first
batch: Hogwild's spawned trainers were called DataLoader workers (and the job input-bound)
for their first seconds."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from watch_helpers import published

from tuneup import tuned_loader, tuned_loop
from tuneup.runtime import hooks
from tuneup.watch import feed
from tuneup.watch.procs import ProcessTree
from tuneup.watch.samples import MAIN


@pytest.fixture(autouse=True)
def plain_settings(monkeypatch):
    monkeypatch.setenv("TUNEUP_DISABLE", "1")
    monkeypatch.delenv(hooks.ENV_OBSERVERS, raising=False)


def test_a_training_loader_announces_its_process_before_the_first_batch(tmp_path):
    observer = feed.Feed(tmp_path)
    remove = hooks.install(observer)
    try:
        data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
        tuned_loader(data, batch_size=8)  # no loop: an eval loader says nothing
        assert not published(tmp_path)
        model = nn.Linear(4, 2)
        loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
        tuned_loader(data, batch_size=8, loop=loop)
        (record,) = feed.read(tmp_path, published(tmp_path))
        assert (record.steps, record.samples) == (0, 0)
        assert observer.loader is None and observer.due == 0.0  # the first batch publishes
        (sample,) = ProcessTree(record.pid).sample(trainers={record.pid})[:1]
        assert sample.role == MAIN
    finally:
        remove()
