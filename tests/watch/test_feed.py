"""The runtime -> watcher feed, in-process with the real wrappers: what it publishes, how
often, which loader it follows, and what the reader refuses."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest
import torch
from torch import nn
from watch_helpers import published

from tuneup import tuned_loader, tuned_loop
from tuneup.runtime import hooks
from tuneup.watch import feed


@pytest.fixture(autouse=True)
def plain_settings(monkeypatch):
    monkeypatch.setenv("TUNEUP_DISABLE", "1")
    monkeypatch.delenv(hooks.ENV_OBSERVERS, raising=False)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def watched(tmp_path):
    clock = Clock()
    observer = feed.Feed(tmp_path, clock=clock)
    remove = hooks.install(observer)
    yield observer, clock
    remove()


def data(n: int = 64) -> torch.utils.data.TensorDataset:
    return torch.utils.data.TensorDataset(torch.randn(n, 4), torch.randint(0, 2, (n,)))


def train(loop, loader, clock, steps_per_tick: int = 1) -> None:
    for step, (x, y) in enumerate(loader):
        loop.train_step((x, y), lambda b: nn.functional.cross_entropy(loop.model(b[0]), b[1]))
        if (step + 1) % steps_per_tick == 0:
            clock.now += 0.25


def test_it_publishes_the_loaders_counters_at_most_once_per_period(watched, tmp_path):
    observer, clock = watched
    model = nn.Linear(4, 2)
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
    loader = tuned_loader(data(), batch_size=8, loop=loop)
    writes = []
    publish = observer.publish
    observer.publish = lambda: (writes.append(clock.now), publish())
    seen = []
    for step, (x, y) in enumerate(loader):  # 8 steps, 0.25 s apart
        loop.train_step((x, y), lambda b: nn.functional.cross_entropy(loop.model(b[0]), b[1]))
        clock.now += 0.25
        seen.append(feed.read(tmp_path, published(tmp_path))[0].steps)
    assert seen == [0] * 4 + [4] * 4  # the first batch, then one period later
    assert writes == [100.0, 101.0, 102.0]  # ... and at the end of the epoch
    (record,) = feed.read(tmp_path, published(tmp_path))
    stats = loop.stats()
    assert (record.steps, record.samples) == (stats.steps, stats.samples) == (8, 64)
    observer.publish()  # what atexit does
    (record,) = feed.read(tmp_path, published(tmp_path))
    assert (record.steps, record.samples) == (stats.steps, stats.samples) == (8, 64)
    assert record.data_wait_s == stats.data_wait_s and record.copy_s == stats.copy_s
    cpu = None if torch.cuda.is_initialized() else "cpu"  # see the test below
    assert record.device == cpu and record.num_workers == 0 and record.batch_size == 8
    assert record.torch_threads == torch.get_num_threads()
    assert [p.name for p in tmp_path.iterdir()] == [f"{record.pid}.json"]  # no temporary left


def test_a_cpu_loop_in_a_process_that_uses_cuda_names_no_device(monkeypatch):
    """Parameters offloaded to the CPU, or a model without any, read as a CPU loop while
    the process runs CUDA work: the feed leaves the device open (the watcher then judges
    the job by the GPUs) rather than say the job trains off them."""
    on_cpu, on_gpu = (types.SimpleNamespace(device=torch.device(d)) for d in ("cpu", "cuda:1"))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert feed._device(on_cpu) is None and feed._device(on_gpu) == "cuda"
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert feed._device(on_cpu) == "cpu" and feed._device(None) is None


def test_it_follows_the_loader_linked_to_the_loop(watched, tmp_path):
    observer, clock = watched
    model = nn.Linear(4, 2)
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
    unlinked = tuned_loader(data(16), batch_size=8)
    linked = tuned_loader(data(), batch_size=8, loop=loop)
    list(unlinked)
    assert observer.loader is unlinked
    train(loop, linked, clock)
    list(unlinked)  # an eval pass afterwards does not take over
    assert observer.loader is linked
    observer.publish()
    assert feed.read(tmp_path, published(tmp_path))[0].steps == 8


def test_stopping_early_closes_the_loaders_stream(watched):
    closed = []

    def source():
        try:
            yield from range(10)
        finally:
            closed.append(True)

    observer, _ = watched
    stream = observer.batches(tuned_loader(data(), batch_size=8), source())
    assert next(stream) == 0
    stream.close()
    assert closed == [True]


def test_a_vanished_directory_stops_the_feed_not_the_training(tmp_path, capsys):
    observer = feed.Feed(tmp_path / "gone")
    observer.loader = tuned_loader(data(), batch_size=8)
    observer.publish()
    observer.publish()
    assert observer.broken
    assert capsys.readouterr().err.count("the watch feed stopped") == 1


def test_install_needs_the_watchers_directory(monkeypatch, tmp_path):
    monkeypatch.delenv(feed.ENV_FEED, raising=False)
    assert feed.install() is None
    monkeypatch.setenv(feed.ENV_FEED, str(tmp_path))
    assert isinstance(feed.install(), feed.Feed)


def test_the_reader_takes_only_whole_valid_records(tmp_path):
    good = {"pid": 7, "steps": 3, "samples": 24, "elapsed_s": 1.5, "data_wait_s": 0.5,
            "copy_s": 0.0, "device": "cpu", "num_workers": 0, "pin_memory": False,
            "prefetch_factor": None, "batch_size": 8, "torch_threads": 2}
    (tmp_path / "7.json").write_text(json.dumps(good))
    (tmp_path / "8.json").write_text(json.dumps({**good, "pid": 8, "steps": "3"}))
    (tmp_path / "9.json").write_text(json.dumps({**good, "pid": 9, "pin_memory": 1}))
    (tmp_path / "10.json").write_text('{"pid": 10, "steps"')
    (tmp_path / "11.json").write_text(json.dumps({**good, "pid": 11, "device": "x" * 70000}))
    (tmp_path / ".12.json.tmp").write_text(json.dumps({**good, "pid": 12}))
    (tmp_path / "13.json").write_text(json.dumps({**good, "pid": 14}))  # not pid 13's record
    assert [r.pid for r in feed.read(tmp_path, range(7, 15))] == [7]
    assert feed.read(tmp_path / "missing", [7]) == ()


def test_the_feed_loads_nothing_heavy_into_the_training_process():
    """It runs inside every watched job (and the watcher reads it without torch)."""
    code = ("import sys, tuneup.watch.feed; print(sorted(m for m in sys.modules if m.split('.')[0]"
            " in ('psutil', 'rich', 'click', 'torch', 'pynvml')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert loaded == "[]"
