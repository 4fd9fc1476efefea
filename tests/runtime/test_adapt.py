"""tuned_loop(adapt=True): more loading where the loop waits, never other samples."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
from runtime_helpers import make_model
from torch.utils.data import Dataset

from tuneup import tuned_loader, tuned_loop
from tuneup.runtime import hooks
from tuneup.settings import TuneupWarning


class Slow(Dataset):
    """A dataset whose samples take ``delay_s`` each to load: the loop waits on it."""

    def __init__(self, size: int = 48, delay_s: float = 0.004) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, 8, generator=generator)
        self.y = (self.x[:, 0] > 0).long()
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        time.sleep(self.delay_s)
        return self.x[index], self.y[index]


def train(adapt: bool, epochs: int, delay_s: float = 0.004,
          **loader_kwargs) -> tuple[list, list, list[int], object]:
    torch.manual_seed(0)
    model = make_model()
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1), adapt=adapt)
    loader = tuned_loader(Slow(delay_s=delay_s), batch_size=8, shuffle=True,
                          generator=torch.Generator().manual_seed(1), **loader_kwargs)
    seen, losses, workers = [], [], []
    for _ in range(epochs):
        workers.append(loader.dataloader.num_workers)
        for batch in loader:
            seen.append(batch[0][:, 0].clone())
            losses.append(float(loop.train_step(
                batch, lambda b: F.cross_entropy(loop.model(b[0]), b[1]))))
    return seen, losses, workers, loader


@pytest.fixture(autouse=True)
def no_observers():
    yield
    for observer in list(hooks._installed):
        hooks.uninstall(observer)


def test_a_stalled_loop_gets_workers_between_epochs_and_the_same_samples_and_losses():
    with pytest.warns(TuneupWarning, match=r"adapt: waited for data \d+% of the last epoch: "
                      r"num_workers 0 -> 1 from the next epoch"):
        seen, losses, workers, _ = train(adapt=True, epochs=3)
    assert workers[0] == 0 and workers[-1] >= 1
    plain_seen, plain_losses, plain_workers, _ = train(adapt=False, epochs=3)
    assert plain_workers == [0, 0, 0]
    assert all(torch.equal(a, b) for a, b in zip(seen, plain_seen)) and len(seen) == len(plain_seen)
    assert losses == pytest.approx(plain_losses, rel=1e-6)


def test_workers_stay_within_the_usable_cores_then_prefetch_deepens(monkeypatch):
    monkeypatch.setattr("tuneup.runtime.apply.usable_cores", lambda: 1)
    # loading (160 ms a batch for the one worker) outweighs a step even on a loaded machine,
    # where 32 ms did not (a 37 % wait fell under the 20 % that deepens the prefetch)
    with pytest.warns(TuneupWarning, match="prefetch_factor 2 -> 4"):
        _, _, workers, loader = train(adapt=True, epochs=3, delay_s=0.02)
    assert max(workers) == 1 and loader.dataloader.prefetch_factor == 8  # after epochs 2, 3


def test_loaders_the_loop_does_not_train_on_are_left_alone():
    torch.manual_seed(0)
    model = make_model()
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1), adapt=True)
    evaluation = tuned_loader(Slow(), batch_size=8)
    for _ in range(2):
        with torch.no_grad():
            for x, _y in evaluation:
                loop.model(x)
    assert evaluation.dataloader.num_workers == 0


def test_workers_the_script_chose_are_left_alone():
    _, _, workers, _ = train(adapt=True, epochs=2, num_workers=0)
    assert workers == [0, 0]


def test_off_by_default_and_under_tuneup_disable(monkeypatch):
    _, _, workers, _ = train(adapt=False, epochs=2)
    assert workers == [0, 0]
    monkeypatch.setenv("TUNEUP_DISABLE", "1")
    _, _, workers, _ = train(adapt=True, epochs=2)
    assert workers == [0, 0]
