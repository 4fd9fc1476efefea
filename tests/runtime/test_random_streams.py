"""Which random streams the runtime moves: none without settings, never the sample order.

A dataset that draws from torch's global generator while loading (a random crop, any
torchvision random transform) also moves, with ``num_workers=0``, the seed the next epoch's
shuffle draws from that generator; in workers it does not. So workers would change the sample
order from the second epoch on: the runtime does not add them there.
"""

from __future__ import annotations

import re
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from runtime_helpers import make_model
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from tuneup import tuned_loader, tuned_loop
from tuneup.runtime import hooks
from tuneup.settings import TuneupWarning
from tuneup.settings.schema import knob_facts, knob_names


class Jittered(Dataset):
    """Sample ``i`` with noise drawn from torch's global generator, as an augmentation does;
    the index comes along so the order can be compared."""

    def __init__(self, size: int = 48, delay_s: float = 0.0) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, 8, generator=generator)
        self.y = (self.x[:, 0] > 0).long()
        self.delay_s = delay_s
        self.loaded = 0  # samples loaded, in this process

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        time.sleep(self.delay_s)
        self.loaded += 1
        return self.x[index] + 0.1 * torch.randn(8), self.y[index], index


class Sharded(IterableDataset):
    """0..n-1, split between workers by ``get_worker_info()`` (the documented way)."""

    def __init__(self, n: int = 16, delay_s: float = 0.0) -> None:
        self.n, self.delay_s = n, delay_s

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for value in range(start, self.n, step):
            time.sleep(self.delay_s)
            yield value


@pytest.fixture(autouse=True)
def no_observers():
    yield
    for observer in list(hooks._installed):
        hooks.uninstall(observer)


def train(loader, epochs: int = 3, adapt: bool = False) -> tuple[list[int], list[torch.Tensor]]:
    """The sample indices in the order trained, and the parameters after ``epochs``."""
    model = make_model()
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1), adapt=adapt)
    order = []
    for _ in range(epochs):
        for x, y, index in loader:
            order += index.tolist()
            loop.train_step((x, y), lambda b: F.cross_entropy(loop.model(b[0]), b[1]))
    return order, [p.detach().clone() for p in model.parameters()]


def plain(epochs: int = 3, **kwargs) -> tuple[list[int], list[torch.Tensor]]:
    torch.manual_seed(1)
    return train(DataLoader(Jittered(), batch_size=8, shuffle=True, **kwargs), epochs)


def assert_same_training(a, b) -> None:
    assert a[0] == b[0]
    assert all(torch.equal(p, q) for p, q in zip(a[1], b[1]))


@pytest.mark.parametrize("observed", [False, True])
def test_without_settings_the_seeds_are_drawn_at_iter_as_a_dataloader_draws_them(observed):
    """``it = iter(loader); torch.rand(1); next(it)``: the DataLoader draws its base seed at
    iter(); an eval batch or noise drawn in between must not move it (with an observer too).
    No sample is loaded beyond the DataLoader's own."""

    def interleaved(make) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, int]:
        torch.manual_seed(3)
        dataset = Jittered()
        it = iter(make(dataset, batch_size=8, shuffle=True))
        between = torch.rand(1)
        batches = [next(it)[2] for _ in range(3)]
        return batches, between, torch.random.get_rng_state(), dataset.loaded

    if observed:  # adapt=True installs an observer: the loader's stream goes through it
        model = make_model()
        tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1), adapt=True)
    plain_batches, plain_between, plain_state, plain_loaded = interleaved(DataLoader)
    batches, between, state, loaded = interleaved(tuned_loader)
    assert all(torch.equal(a, b) for a, b in zip(batches, plain_batches))
    assert torch.equal(between, plain_between) and torch.equal(state, plain_state)
    assert loaded == plain_loaded == 24


def test_tuned_workers_keep_a_globally_seeded_shuffle_over_a_drawing_dataset(write_settings):
    """With num_workers=0 the dataset's draws move the next epoch's shuffle seed; in workers
    they would not, so the order would change from epoch 2: the settings' workers are not
    applied, said once, and training is bit-identical to the plain DataLoader's. The check
    (one sample loaded) leaves every global generator as it was. With a generator of the
    user's, the order no longer depends on the workers, and they are applied."""
    reference = plain()
    write_settings(num_workers=2)
    np.random.seed(0)
    numpy_before, torch_before = np.random.get_state()[1].copy(), torch.random.get_rng_state()
    with pytest.warns(TuneupWarning, match=r"num_workers=2 from the settings is not applied: "
                      r"loading a sample of Jittered draws from torch's global random "
                      r"generator.*pass generator=") as caught:
        loader = tuned_loader(Jittered(), batch_size=8, shuffle=True)
    assert len(caught) == 1 and loader.num_workers == 0
    assert torch.equal(torch.random.get_rng_state(), torch_before)
    assert (np.random.get_state()[1] == numpy_before).all()
    torch.manual_seed(1)
    assert_same_training(train(loader), reference)

    seeded = tuned_loader(Jittered(), batch_size=8, shuffle=True,
                          generator=torch.Generator().manual_seed(5))
    assert seeded.num_workers == 2
    assert train(seeded)[0] == plain(generator=torch.Generator().manual_seed(5))[0]


def test_adapt_adds_no_worker_that_would_change_a_globally_seeded_shuffle():
    """A stalled loop over a drawing dataset with a shuffle seeded from the global generator:
    adapt says why it adds no worker (once) and trains exactly what the plain loop trains."""
    reference = plain()
    torch.manual_seed(1)
    loader = tuned_loader(Jittered(delay_s=0.004), batch_size=8, shuffle=True)
    with pytest.warns(TuneupWarning, match=r"adapt: waited for data \d+% of the last epoch, "
                      r"but num_workers stays 0: loading a sample of Jittered draws") as caught:
        trained = train(loader, adapt=True)
    assert len([w for w in caught if "adapt" in str(w.message)]) == 1
    assert loader.num_workers == 0
    assert_same_training(trained, reference)


def test_adapt_never_regroups_the_batches_of_an_iterable_dataset():
    """Workers over a stream that splits itself by worker regroup its batches ([0, 2, 4, ...]
    instead of [0, 1, 2, ...]): adapt adds none, whatever the stall."""
    model = make_model()
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1), adapt=True)
    loader = tuned_loader(Sharded(delay_s=0.004), batch_size=8)
    batches = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "num_workers 0 -> 1 ... same order" either
        for _ in range(3):
            for batch in loader:
                batches.append(batch.tolist())
                loop.train_step(batch.float()[:, None],
                                lambda b: loop.model(b.expand(-1, 8)).sum())
    assert batches == [list(range(8)), list(range(8, 16))] * 3
    assert loader.num_workers == 0


def test_the_settings_doc_lists_each_knobs_random_streams_as_declared():
    """docs/settings.md's table of random draws is the knobs' declared facts, word for word,
    and names every knob that moves one (the loader knobs among them)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "settings.md").read_text()
    table = text.split("| knob | random draws it moves |\n| --- | --- |\n", 1)[1].split("\n\n")[0]
    documented = dict(re.fullmatch(r"\| `(\w+)` \| (.+) \|", row).groups()
                      for row in table.splitlines())
    declared = {name: knob_facts(name).random_streams for name in knob_names()}
    assert documented == {name: text for name, text in declared.items() if text}
    assert {"num_workers", "persistent_workers"} <= set(documented)
