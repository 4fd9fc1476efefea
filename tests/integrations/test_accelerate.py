"""accelerate loops: ``accelerator.prepare(..., tuned_loader(...))`` shards and moves batches
as for a DataLoader, and ``tuned_loop(..., accelerator=...)`` trains as the plain accelerate
loop. Two CPU processes on gloo, as ``accelerate launch --cpu --num_processes 2`` starts them."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.utils.data import (BatchSampler, DataLoader, IterableDataset, RandomSampler,
                              TensorDataset)

from tuneup import tuned_loader, tuned_loop
from tuneup.runtime.loader import TunedLoader

pytest.importorskip("accelerate")

WORLD = 2
SIZE = 30  # not a multiple of the 2 x 4 samples a step takes: accelerate's even_batches pads
BATCH = 4
EPOCHS = 2


def indexed() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(SIZE, 8, generator=generator)
    return TensorDataset(x, (x[:, 0] > 0).long(), torch.arange(SIZE))


class Stream(IterableDataset):
    def __iter__(self) -> Iterator[Any]:
        data = indexed()
        return (data[i] for i in range(SIZE))


def indices(loader: Any) -> list[list[list[int]]]:
    """The sample indices of each batch of each epoch."""
    return [[batch[2].tolist() for batch in loader] for _ in range(EPOCHS)]


def orders(accelerator: Any, make: Any) -> dict[str, Any]:
    """Each kind of loader prepared, from the same global random state, and its batches."""
    found: dict[str, Any] = {}
    own_batches = BatchSampler(RandomSampler(range(SIZE)), BATCH + 1, drop_last=False)
    for name, dataset, kwargs in (
            ("shuffled", indexed(), {"batch_size": BATCH, "shuffle": True}),
            ("dropping", indexed(), {"batch_size": BATCH, "shuffle": True, "drop_last": True}),
            ("own batch sampler", indexed(), {"batch_sampler": own_batches}),
            ("stream", Stream(), {"batch_size": BATCH})):
        torch.manual_seed(0)
        loader = accelerator.prepare(make(dataset, **kwargs))
        found[name] = indices(loader)
        if isinstance(loader, TunedLoader):
            found[f"{name} prepared as"] = type(loader.dataloader).__name__
    return found


def train(accelerator: Any, tuned: bool) -> tuple[list[torch.Tensor], int]:
    """The accelerate loop (gradient accumulation, clipping where gradients sync), plain or
    through tuned_loop; returns the weights and how many backward passes went through the
    accelerator."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = (tuned_loader if tuned else DataLoader)(indexed(), batch_size=BATCH, shuffle=True)
    torch.manual_seed(2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    backward, calls = accelerator.backward, []
    accelerator.backward = lambda loss, **kw: (calls.append(1), backward(loss, **kw))[1]
    loop = tuned_loop(model, optimizer, accelerator=accelerator) if tuned else None
    for epoch in range(EPOCHS):
        for x, y, _ in loader:
            with accelerator.accumulate(model):
                if loop is not None:
                    loop.train_step((x, y), lambda b: F.cross_entropy(loop.model(b[0]), b[1]),
                                    max_grad_norm=0.3)
                    continue
                accelerator.backward(F.cross_entropy(model(x), y))
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 0.3)
                optimizer.step()
                optimizer.zero_grad()
    del accelerator.backward
    return [p.detach().clone() for p in model.parameters()], len(calls)


def _rank(rank: int, port: int, out: str, settings: str) -> None:
    # OMP_NUM_THREADS=1, as torchrun under `accelerate launch` sets it: without it accelerate's MULTI_CPU set-up
    # replaces this thread count with psutil's physical cores per rank (8 each on a 16-core
    # machine; a TypeError in every rank where psutil cannot count physical cores: None)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), TUNEUP_SETTINGS=settings, OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    result: dict[str, Any] = {"processes": accelerator.num_processes,
                              "plain": orders(accelerator, DataLoader),
                              "tuned": orders(accelerator, tuned_loader)}
    plain, plain_calls = train(accelerator, tuned=False)
    tuned, tuned_calls = train(accelerator, tuned=True)
    result["weights equal"] = all(torch.equal(a, b) for a, b in zip(plain, tuned, strict=True))
    result["backward calls"] = [plain_calls, tuned_calls]
    Path(f"{out}.{rank}").write_text(json.dumps(result))
    accelerator.wait_for_everyone()
    os._exit(0)  # results saved: skip the teardown gloo's threads can abort under load


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Both processes' findings, from one spawn (the start-up is most of the time)."""
    from tuneup.settings import Knobs, Settings, save

    folder = tmp_path_factory.mktemp("accelerate")
    settings = folder / "train.tuneup.json"
    save(Settings(knobs=Knobs(cpu_threads=1)), settings)  # loader workers: the test below
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.spawn(_rank, args=(port, str(folder / "rank"), str(settings)), nprocs=WORLD, join=True)
    return [json.loads((folder / f"rank.{rank}").read_text()) for rank in range(WORLD)]


@pytest.mark.parametrize("kind", ["shuffled", "dropping", "own batch sampler", "stream"])
def test_each_process_gets_exactly_the_batches_of_a_prepared_dataloader(ranks, kind):
    for found in ranks:
        assert found["processes"] == WORLD
        assert found["tuned"][kind] == found["plain"][kind]
    if kind != "stream":  # the indices are shared out: each process its own
        first, second = ({i for epoch in r["plain"][kind] for b in epoch for i in b} for r in ranks)
        assert first != second


def test_accelerate_prepares_the_batches_as_for_a_dataloader(ranks):
    for found in ranks:
        # accelerate's own loaders: they move batches to its device, rank 0 dispatching a stream
        assert found["tuned"]["shuffled prepared as"] == "DataLoaderShard"
        assert found["tuned"]["stream prepared as"] == "DataLoaderDispatcher"


def test_tuned_loop_trains_as_the_plain_accelerate_loop(ranks):
    for found in ranks:
        assert found["weights equal"]
        plain_calls, tuned_calls = found["backward calls"]
        assert tuned_calls == plain_calls > 0  # every backward through the accelerator


@pytest.fixture
def accelerator() -> Iterator[Any]:
    """An Accelerator in this process, its shared state reset afterwards for other tests."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    yield Accelerator(cpu=True)
    AcceleratorState._reset_state(reset_partial_state=True)


def test_prepared_it_keeps_its_knobs_and_changes_them_without_moving_a_sample(
        accelerator, write_settings):
    """The settings' workers stay applied once prepared; autotune switching knobs between
    epochs prepares a new DataLoader over the same batch sampler: the order is a prepared
    plain DataLoader's."""
    write_settings(num_workers=1)
    torch.manual_seed(0)
    plain = indices(accelerator.prepare(DataLoader(indexed(), batch_size=BATCH, shuffle=True)))
    loader = tuned_loader(indexed(), batch_size=BATCH, shuffle=True)
    torch.manual_seed(0)
    assert accelerator.prepare(loader) is loader
    assert type(loader.dataloader).__name__ == "DataLoaderShard" and loader.num_workers == 1
    assert loader.batch_size == BATCH  # what each process trains on, as autotune reads it
    first = [batch[2].tolist() for batch in loader]
    loader.configure(dataclasses.replace(loader.knobs, num_workers=0))
    second = [batch[2].tolist() for batch in loader]
    assert loader.num_workers == 0 and [first, second] == plain
    assert accelerator._dataloaders.count(loader.dataloader) == 1
    assert len(accelerator._dataloaders) == 2  # the plain one and the tuned one's latest


def test_a_micro_batch_splits_prepared_batches_through_the_accelerator(accelerator,
                                                                        write_settings):
    """The settings' micro-batch applies to a prepared loader's batches (each process's
    batch size is known), each piece backpropagated through the accelerator."""
    plain, _ = train(accelerator, tuned=False)
    write_settings(micro_batch_size=2)
    tuned, calls = train(accelerator, tuned=True)
    for a, b in zip(plain, tuned, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert calls == EPOCHS * -(-SIZE // 2)  # a backward per piece of 2 samples


def test_skipping_the_first_batches_of_a_prepared_loader_skips_as_accelerate_does(accelerator):
    """Resuming mid-epoch (``accelerator.skip_first_batches``): the batches a prepared
    DataLoader would give after the skipped ones, from accelerate's own (device-moving)
    loader."""
    torch.manual_seed(0)
    plain = accelerator.prepare(DataLoader(indexed(), batch_size=BATCH))
    tuned = accelerator.prepare(tuned_loader(indexed(), batch_size=BATCH))
    skipped = [accelerator.skip_first_batches(loader, 3) for loader in (plain, tuned)]
    assert type(skipped[1]).__name__ == "DataLoaderShard"
    assert [b[2].tolist() for b in skipped[1]] == [b[2].tolist() for b in skipped[0]]


def test_a_loader_made_before_accelerate_is_imported_is_prepared_too():
    """tuned_loader arranges the preparation for when accelerate is loaded later."""
    code = ("import torch, sys; from torch.utils.data import TensorDataset; "
            "from tuneup import tuned_loader; "
            "loader = tuned_loader(TensorDataset(torch.arange(10.0)), batch_size=4); "
            "assert 'accelerate' not in sys.modules; "
            "from accelerate import Accelerator; "
            "assert Accelerator(cpu=True).prepare(loader) is loader; "
            "print(type(loader.dataloader).__name__)")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={k: v for k, v in os.environ.items()
                                           if not k.startswith(("TUNEUP_", "ACCELERATE_"))})
    assert ran.stdout.strip() == "DataLoaderShard", ran.stderr[-2000:]
