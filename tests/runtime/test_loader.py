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


def test_alone_it_tunes_only_loader_knobs_and_user_keywords_win(write_settings):
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


def test_len_counts_micro_batches(write_settings):
    write_settings(micro_batch_size=12)
    _, loop = linked_loop()
    loader = tuned_loader(make_dataset(80), batch_size=32, loop=loop)
    assert len(loader) == 3 + 3 + 2 == len(list(loader))
    dropping = tuned_loader(make_dataset(80), batch_size=32, drop_last=True, loop=loop)
    assert len(dropping) == 6 == len(list(dropping))
    assert loader.dataloader.batch_size == loader.batch_size == 32


def test_user_batch_sampler_batches_are_split(write_settings):
    write_settings(micro_batch_size=8)
    model, loop = linked_loop()
    sampler = BatchSampler(SequentialSampler(range(40)), batch_size=20, drop_last=False)
    loader = tuned_loader(make_dataset(40), batch_sampler=sampler, loop=loop)
    sizes = [len(x) for x, _ in loader]
    assert sizes == [8, 8, 4, 8, 8, 4] and len(loader) == 6
    custom = tuned_loader(make_dataset(40), batch_sampler=[list(range(20)), list(range(20, 40))],
                          loop=loop)
    assert [len(x) for x, _ in custom] == [8, 8, 4, 8, 8, 4]
    with pytest.raises(TypeError, match="batch_sampler"):
        len(custom)


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
    for x, y in tuned_loader(Stream(), batch_size=25, loop=loop):
        with loop.step():
            loss = F.cross_entropy(loop.model(x), y)
        loop.backward(loss)
    assert loop.stats().steps == 2
    assert_close_parameters(parameters(model), parameters(reference))


Pair = collections.namedtuple("Pair", "x y")


def test_dict_and_namedtuple_batches_keep_their_shape(write_settings):
    write_settings(micro_batch_size=5)
    _, loop = linked_loop()
    x, y = make_dataset(12).tensors
    samples = [{"pair": Pair(x[i], y[i]), "name": f"s{i}"} for i in range(12)]
    batches = list(tuned_loader(samples, batch_size=12, loop=loop))
    assert [len(b["name"]) for b in batches] == [5, 5, 2]
    assert isinstance(batches[0]["pair"], Pair) and batches[2]["pair"].x.shape == (2, 8)
    assert batches[1]["name"] == [f"s{i}" for i in range(5, 10)]


def test_unsplittable_collate_warns_once_and_trains_on_whole_batches(write_settings):
    write_settings(micro_batch_size=8)
    model, loop = linked_loop()

    def collate(samples):  # a per-batch scalar cannot be cut into micro-batches
        return torch.stack([s[0] for s in samples]), torch.stack([s[1] for s in samples]), 7

    with pytest.warns(TuneupWarning, match="cannot split this batch") as caught:
        loader = tuned_loader(make_dataset(), batch_size=32, collate_fn=collate, loop=loop)
        sizes = []
        for x, y, _ in loader:
            with loop.step():
                loss = F.cross_entropy(loop.model(x), y)
            loop.backward(loss)
            sizes.append(len(x))
    assert len(caught) == 1 and sizes == [32, 32, 32] and loop.stats().steps == 3


def test_scheduler_and_stepped_follow_optimizer_steps(write_settings):
    write_settings(micro_batch_size=16)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    loop = tuned_loop(model, optimizer, scheduler=scheduler)
    stepped = []
    for x, y in tuned_loader(make_dataset(64), batch_size=32, loop=loop):
        with loop.step():
            loss = F.cross_entropy(loop.model(x), y)
        loop.backward(loss)
        stepped.append(loop.stepped)
    assert stepped == [False, True, False, True]
    assert optimizer.param_groups[0]["lr"] == 0.25


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
    stalled = Stats(steps=10, samples=100, elapsed_s=2.0, data_wait_s=0.84, samples_per_s=50.0,
                    data_wait_share=0.42)
    assert stalled.summary() == ("tuneup: 10 steps, 50 samples/s, waited for data 42% of the "
                                 "time — run `tuneup autotune`")
    busy = Stats(steps=10, samples=100, elapsed_s=2.0, data_wait_s=0.02, samples_per_s=50.0,
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
