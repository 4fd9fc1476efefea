"""A TunedLoader is a DataLoader subclass (accelerate's ``prepare`` takes it for one), so
libraries that rebuild a DataLoader from its class and attributes rebuild it: Lightning
injecting its sampler (prediction, DDP) must get a tuned loader with the same keywords."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import SequentialSampler, TensorDataset, default_collate

from tuneup import tuned_loader
from tuneup.runtime.loader import TunedLoader

pytest.importorskip("lightning")


def tagged(batch):
    """A collate of the script's own, which a rebuilt loader must keep."""
    return ("tagged", default_collate(batch))


def test_lightnings_sampler_injection_rebuilds_a_tuned_loader_with_the_users_keywords(
        write_settings):
    from lightning.pytorch.trainer.states import RunningStage
    from lightning.pytorch.utilities.data import _update_dataloader

    write_settings(num_workers=1)
    dataset = TensorDataset(torch.arange(10.0))
    loader = tuned_loader(dataset, batch_size=4, collate_fn=tagged)
    rebuilt = _update_dataloader(loader, SequentialSampler(dataset), mode=RunningStage.PREDICTING)
    assert isinstance(rebuilt, TunedLoader) and rebuilt is not loader
    assert rebuilt.num_workers == 1 and rebuilt.collate_fn is tagged
    assert [b[1][0].tolist() for b in rebuilt] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
