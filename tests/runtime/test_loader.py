"""tuned_loader: which DataLoader keywords it touches, micro-batches, len, odd batches, telemetry."""

from __future__ import annotations

import collections

import pytest
import torch
from runtime_helpers import assert_close_parameters, make_dataset, make_model, parameters
from torch.nn import functional as F
from torch.utils.data import BatchSampler, IterableDataset, SequentialSampler

from tuneup import tuned_loader, tuned_loop
from tuneup.runtime.telemetry import Stats, Telemetry
from tuneup.settings import TuneupWarning


def linked_loop() -> tuple[torch.nn.Module, object]:
    model = make_model()
    return model, tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_alone_it_tunes_only_loader_knobs_and_user_keywords_win(write_settings, no_gpu):
    write_settings(num_workers=2, prefetch_factor=4, persistent_workers=True, pin_memory=True,
                   micro_batch_size=4, cpu_threads=1)
    threads = torch.get_num_threads()
    loader = tuned_loader(make_dataset(), batch_size=32)
    assert (loader.num_workers, loader.prefetch_factor, loader.persistent_workers) == (2, 4, True)
    assert loader.pin_memory is False  # no accelerator here: pinning would only cost
    assert loader.batch_size == 32 and torch.get_num_threads() == threads
    assert [len(x) for x, _ in loader] == [32, 32, 32]
    explicit = tuned_loader(make_dataset(), 32, num_workers=0)  # positional batch_size too
    assert explicit.num_workers == 0 and explicit.prefetch_factor is None
    assert explicit.persistent_workers is False


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory serves copies to a CUDA GPU")
def test_pinned_batches_reach_a_loop_on_cuda(write_settings):
    write_settings(pin_memory=True)
    model = make_model().cuda()
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
    loader = tuned_loader(make_dataset(), batch_size=32, loop=loop)
    assert loader.pin_memory is True
    x, y = next(iter(loader))
    assert x.device.type == "cuda" and y.device.type == "cuda"


def train(loop, loader) -> list[int]:
    """The splittable loop body; returns the size of every batch the body saw."""
    sizes = []
    for x, y in loader:
        loop.train_step((x, y), lambda b: F.cross_entropy(loop.model(b[0]), b[1]))
        sizes.append(len(x))
    return sizes


def test_len_and_batches_are_the_dataloaders_whatever_the_micro_batch(write_settings):
    write_settings(micro_batch_size=12)
    _, loop = linked_loop()
    loader = tuned_loader(make_dataset(80), batch_size=32, loop=loop)
    assert len(loader) == 3 and train(loop, loader) == [32, 32, 16]
    assert loop.applied_micro_batch == 12 and loop.stats().steps == 3
    dropping = tuned_loader(make_dataset(80), batch_size=32, drop_last=True, loop=loop)
    assert len(dropping) == 2 == len(list(dropping))


def test_user_batch_sampler_batches_are_kept_whole(write_settings):
    """A custom batch_sampler does not say how many samples a batch should hold: the
    sample dimension is unknown, so nothing is split."""
    write_settings(micro_batch_size=8)
    _, loop = linked_loop()
    custom = tuned_loader(make_dataset(40), batch_sampler=[list(range(20)), list(range(20, 40))],
                          loop=loop)
    with pytest.warns(TuneupWarning, match="which dimension holds the samples is unknown"):
        assert train(loop, custom) == [20, 20]
    assert loop.applied_micro_batch is None and len(custom) == 2
    sampler = BatchSampler(SequentialSampler(range(40)), batch_size=20, drop_last=False)
    assert train(loop, tuned_loader(make_dataset(40), batch_sampler=sampler, loop=loop)) == [20, 20]
    assert loop.applied_micro_batch == 8


class Stream(IterableDataset):
    def __iter__(self):
        x, y = make_dataset(50).tensors
        return iter(zip(x, y))


def test_iterable_dataset_is_split_and_steps_on_each_batch(write_settings):
    write_settings(micro_batch_size=10)
    model, loop = linked_loop()
    reference = make_model()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for x, y in torch.utils.data.DataLoader(Stream(), batch_size=25):
        optimizer.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        optimizer.step()
    assert train(loop, tuned_loader(Stream(), batch_size=25, loop=loop)) == [25, 25]
    assert loop.stats().steps == 2 and loop.applied_micro_batch == 10
    assert_close_parameters(parameters(model), parameters(reference))


Pair = collections.namedtuple("Pair", "x y")


def test_dict_and_namedtuple_batches_reach_the_loss_function_in_their_shape(write_settings):
    write_settings(micro_batch_size=5)
    _, loop = linked_loop()
    x, y = make_dataset(12).tensors
    samples = [{"pair": Pair(x[i], y[i]), "name": f"s{i}"} for i in range(12)]
    pieces = []

    def loss_fn(batch):
        pieces.append(batch)
        return F.cross_entropy(loop.model(batch["pair"].x), batch["pair"].y)

    for batch in tuned_loader(samples, batch_size=12, loop=loop):
        loop.train_step(batch, loss_fn)
    assert [len(b["name"]) for b in pieces] == [5, 5, 2]
    assert isinstance(pieces[0]["pair"], Pair) and pieces[2]["pair"].x.shape == (2, 8)
    assert pieces[1]["name"] == [f"s{i}" for i in range(5, 10)]


def test_unsplittable_collate_warns_once_and_trains_on_whole_batches(write_settings):
    write_settings(micro_batch_size=8)
    model, loop = linked_loop()

    def collate(samples):  # a per-batch scalar cannot be cut into micro-batches
        return torch.stack([s[0] for s in samples]), torch.stack([s[1] for s in samples]), 7

    with pytest.warns(TuneupWarning, match="micro_batch_size=8 from the settings is not applied"
                      ) as caught:
        loader = tuned_loader(make_dataset(), batch_size=32, collate_fn=collate, loop=loop)
        sizes = []
        for batch in loader:
            loop.train_step(batch, lambda b: F.cross_entropy(loop.model(b[0]), b[1]))
            sizes.append(len(batch[0]))
    assert len(caught) == 1 and sizes == [32, 32, 32] and loop.stats().steps == 3


def test_scheduler_and_stepped_follow_the_users_batches(write_settings):
    write_settings(micro_batch_size=16)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    loop = tuned_loop(model, optimizer, scheduler=scheduler)
    assert train(loop, tuned_loader(make_dataset(64), batch_size=32, loop=loop)) == [32, 32]
    assert loop.stepped and optimizer.param_groups[0]["lr"] == 0.25


class Counted(IterableDataset):
    """Yields 0..n-1; ``split`` decides whether it reads get_worker_info() to share them."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


class Sharded(Counted):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info is None:
            return iter(range(self.n))
        return iter(range(info.id, self.n, info.num_workers))


def test_workers_are_never_added_to_a_stream_that_does_not_split(write_settings):
    """A tuned num_workers on an IterableDataset that ignores worker info would yield
    every sample once per worker: it is not applied, and the warning says why."""
    write_settings(num_workers=2)
    with pytest.warns(TuneupWarning, match="does not split its stream by worker") as caught:
        loader = tuned_loader(Counted(64), batch_size=8)
        samples = sorted(int(v) for batch in loader for v in batch)
    assert len(caught) == 1 and loader.num_workers == 0 and samples == list(range(64))
    assert "num_workers" in loader.fixed_reasons
    assert tuned_loader(Counted(64), batch_size=8, splits_by_worker=True).num_workers == 2


def test_workers_are_added_to_a_stream_that_reads_worker_info(write_settings, no_warnings):
    write_settings(num_workers=2)
    loader = tuned_loader(Sharded(64), batch_size=8)
    assert loader.num_workers == 2 and "num_workers" not in loader.fixed_reasons
    assert sorted(int(v) for batch in loader for v in batch) == list(range(64))


def test_stats_measure_waiting_for_data():
    model, loop = linked_loop()
    for x, y in tuned_loader(make_dataset(64), batch_size=16, loop=loop):
        with loop.step():
            loss = F.cross_entropy(loop.model(x), y)
        loop.backward(loss)
    stats = loop.stats()
    assert (stats.steps, stats.samples) == (4, 64)
    assert 0 < stats.data_wait_s < stats.elapsed_s
    assert 0 < stats.data_wait_share < 1 and stats.samples_per_s > 0
    alone = tuned_loader(make_dataset(64), batch_size=16)
    list(alone)
    assert (alone.stats().steps, alone.stats().samples) == (4, 64)


def test_summary_line_suggests_autotune_when_input_bound():
    stalled = Stats(steps=10, samples=100, elapsed_s=2.0, data_wait_s=0.84, copy_s=0.0,
                    samples_per_s=50.0,
                    data_wait_share=0.42)
    assert stalled.summary() == ("tuneup: 10 steps, 50 samples/s, waited for data 42% of the "
                                 "time — run `tuneup autotune`")
    busy = Stats(steps=10, samples=100, elapsed_s=2.0, data_wait_s=0.02, copy_s=0.0, samples_per_s=50.0,
                 data_wait_share=0.01)
    assert "autotune" not in busy.summary()


def test_verbose_prints_the_summary_at_exit(monkeypatch, capsys):
    registered = []
    monkeypatch.setenv("TUNEUP_VERBOSE", "1")
    monkeypatch.setattr("atexit.register", registered.append)
    telemetry = Telemetry()
    telemetry.started, telemetry.latest, telemetry.data_wait_s = 1.0, 3.0, 1.0
    telemetry.samples, telemetry.steps = 64, 4
    assert registered == [telemetry.print_summary]
    telemetry.print_summary()
    assert capsys.readouterr().err == ("tuneup: 4 steps, 32 samples/s, waited for data 50% of "
                                       "the time — run `tuneup autotune`\n")


def test_samples_are_counted_from_the_sampler_whatever_the_collate_makes():
    class Batch:  # a custom object: no tensor first dimension to read the count from
        def __init__(self, samples):
            self.x = torch.stack([s[0] for s in samples]).T  # features-first, as some scripts do
            self.y = torch.stack([s[1] for s in samples])

    loader = tuned_loader(make_dataset(70), batch_size=32, collate_fn=Batch)
    for _ in loader:
        pass
    assert loader.telemetry.samples == 70
