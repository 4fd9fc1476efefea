"""The job's stacks through py-spy: recorded output parsed into counts, the sampler's
windows on a real process, and what it says when py-spy is missing or ptrace is refused."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from watch_helpers import RECORDINGS

from tuneup.cli import main
from tuneup.watch import command, stacks
from tuneup.watch.samples import MAIN, WORKER, GpuSample, ProcessSample, RuntimeSample
from tuneup.watch.sampler import stack_target
from tuneup.watch.stacks import StackCounts, StackSampler, find_py_spy, parse

PY_SPY = find_py_spy()
needs_py_spy = pytest.mark.skipif(PY_SPY is None, reason="py-spy is not installed")


def recorded(name: str) -> str:
    """Real output of ``py-spy record`` with the sampler's flags (at 20 Hz, for 3 s) on a job
    that spins 30 ms loading and 10 ms computing per batch (``loading``), or 2 ms and 30 ms
    (``compute``), beside an idle thread of its own (``logger``)."""
    return (RECORDINGS / f"py-spy-{name}.txt").read_text()


def test_the_loop_thread_is_read_and_an_idle_helper_thread_is_not():
    loading, compute = parse(recorded("loading")), parse(recorded("compute"))
    assert loading == StackCounts(loading=42, total=59)  # 71 % (30 of 40 ms)
    assert compute == StackCounts(loading=5, total=59)  # 8 % (2 of 32 ms)
    assert "logger" in recorded("compute")  # there, and idle: 59 samples, none loading


def test_output_without_samples_gives_no_counts():
    assert parse("") is None
    assert parse("garbage without a count\n") is None
    assert parse("thread (1): MainThread;<module> (t.py) 0\n") is None


def test_a_dataset_item_counts_as_loading_only_beneath_the_dataloader():
    raw = textwrap.dedent("""\
        thread (7): MainThread;<module> (t.py);__next__ (/x/torch/utils/data/dataloader.py);\
fetch (/x/torch/utils/data/_utils/fetch.py);__getitem__ (t.py) 3
        thread (7): MainThread;<module> (t.py);__getitem__ (t.py) 5
        thread (7): MainThread;<module> (t.py);train_step (t.py) 2
        """)
    assert parse(raw) == StackCounts(loading=3, total=10)


def test_counts_add_up():
    assert StackCounts(1, 4) + StackCounts(2, 6) == StackCounts(3, 10)


def main_process(pid: int, cpu: float | None) -> ProcessSample:
    return ProcessSample(pid, MAIN, cpu, 1, 2, 2**20, None)


def test_stacks_are_wanted_only_when_nothing_else_tells_loading_from_compute():
    shell, trainer = main_process(10, 1.0), main_process(11, 99.0)
    assert stack_target((), (shell, trainer), ()) == 11  # the busiest training process
    assert stack_target((), (main_process(10, None),), ()) == 10  # first sample: no CPU yet
    worker = ProcessSample(12, WORKER, 50.0, 1, 2, 2**20, None)
    assert stack_target((), (trainer, worker), ()) is None
    fed = RuntimeSample(pid=11, steps=1, samples=8, elapsed_s=1.0, data_wait_s=0.1, copy_s=0.0)
    assert stack_target((fed,), (trainer,), ()) is None
    assert stack_target((), (trainer,), (GpuSample(0, job_memory=2**30),)) is None
    assert stack_target((), (trainer,), (GpuSample(0, job_memory=None),)) == 11  # not its GPU
    assert stack_target((), (), ()) is None


def test_without_py_spy_it_says_what_to_install_once_asked():
    sampler = StackSampler(None)
    assert sampler.poll(None) is None and sampler.note is None  # never asked: nothing to say
    assert sampler.poll(os.getpid()) is None
    assert sampler.note == stacks.INSTALL_NOTE and "pip install 'tuneup[stacks]'" in sampler.note
    assert sampler.close() is None


SPINNER = textwrap.dedent("""
    import sys, time
    from torch.utils.data import DataLoader, Dataset

    def spin(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    class Slow(Dataset):  # 30 ms of loading, then 10 ms of compute, per batch
        def __len__(self):
            return 10**6
        def __getitem__(self, index):
            spin(0.03 / 8)
            return index

    loader = iter(DataLoader(Slow(), batch_size=8))
    print("ready", flush=True)
    for batch in loader:
        spin(0.01)
""")


@pytest.fixture
def spinner():
    """A real job, loading three quarters of its time, past its imports."""
    job = subprocess.Popen([sys.executable, "-c", SPINNER], stdout=subprocess.PIPE, text=True)
    try:
        assert job.stdout.readline() == "ready\n"
        yield job
    finally:
        job.kill()
        job.wait()


def wait_for_window(sampler: StackSampler, pid: int, timeout: float = 20.0) -> StackCounts | None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        counts = sampler.poll(pid)
        if counts is not None or sampler.note is not None:
            return counts
        time.sleep(0.1)
    raise AssertionError("no py-spy window ended")


@pytest.mark.slow
@needs_py_spy
def test_py_spy_on_a_real_job_sees_its_loading(spinner, monkeypatch):
    monkeypatch.setattr(stacks, "WINDOW_S", 3)  # ~30 samples: a share, not a coin toss
    with StackSampler(PY_SPY) as sampler:
        counts = wait_for_window(sampler, spinner.pid)
        if sampler.note is not None:  # ptrace refused here: the message says what to allow
            assert sampler.note == stacks.PTRACE_NOTE
            return
        assert counts is not None and counts.total >= 10  # 10 a second, a 3 s window
        # 75 % by construction; with ~30 samples, all of them in loading is a 1-in-5000 event
        assert 0.4 <= counts.loading / counts.total <= 0.97, counts
        assert sampler.window is not None  # the next window runs
        # long enough for that py-spy to attach and sample on a loaded machine (0.5 s left
        # it no sample once in a fresh-clone suite: the tail came back None)
        time.sleep(1.5)
        tail = sampler.close()  # SIGINT: py-spy writes what it took
        assert tail is not None and tail.total >= 1 and sampler.window is None


@pytest.mark.slow
@needs_py_spy
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run py-spy as another user")
def test_a_refused_ptrace_says_which_permission_is_missing(spinner):
    """py-spy as nobody may not trace root's job: the real refusal, not a simulated one.

    nobody runs a copy of py-spy outside the clone: a clone under a folder only its owner may
    enter (a ``mktemp -d``, root's home) would stop it from running the venv's binary at all."""
    as_nobody = functools.partial(subprocess.Popen, user=65534)
    folder = Path(tempfile.mkdtemp(prefix="tuneup-test-py-spy-", dir="/tmp"))
    folder.chmod(0o755)
    binary = folder / "py-spy"
    shutil.copy2(PY_SPY, binary)
    binary.chmod(0o755)
    try:
        _refused(str(binary), as_nobody, spinner)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _refused(py_spy: str, spawn, spinner) -> None:
    with StackSampler(py_spy, spawn=spawn) as sampler:
        assert wait_for_window(sampler, spinner.pid) is None
        assert sampler.note == stacks.PTRACE_NOTE
        assert "SYS_PTRACE" in sampler.note and "kernel.yama.ptrace_scope" in sampler.note
        assert sampler.poll(spinner.pid) is None and sampler.window is None  # no more windows


@pytest.mark.slow
@needs_py_spy
def test_a_process_that_is_not_python_gives_up_with_py_spys_reason():
    job = subprocess.Popen(["sleep", "30"])
    try:
        with StackSampler(PY_SPY) as sampler:
            for _ in range(stacks.MAX_FAILURES):
                assert wait_for_window(sampler, job.pid) is None
            assert sampler.note is not None and sampler.note.startswith(
                f"py-spy could not read the stacks of process {job.pid}: Error:")
            assert sampler.poll(job.pid) is None and sampler.window is None  # left alone
            sampler.poll(os.getpid())  # another process (this one) is still read
            assert sampler.window is not None and sampler.target == os.getpid()
    finally:
        job.kill()
        job.wait()


def test_a_watched_job_without_py_spy_keeps_the_cpu_verdict_and_says_what_to_install(
        tmp_path, monkeypatch, no_gpu):  # the CPU verdict: no GPU for the watcher to read
    monkeypatch.setattr(command, "find_py_spy", lambda: None)  # an environment without it
    summary = tmp_path / "summary.json"
    job = "import time\nend = time.monotonic() + 1\nwhile time.monotonic() < end: pass"
    result = CliRunner().invoke(main, ["watch", "--interval", "0.2", "--summary", str(summary),
                                       "--", sys.executable, "-c", job])
    assert result.exit_code == 0, result.output
    data = json.loads(summary.read_text())
    assert data["verdict"]["kind"] == "undetermined"  # no claim without a measurement
    assert stacks.INSTALL_NOTE in data["notes"]
    assert "note     py-spy is not installed" in result.output


def test_a_py_spy_that_cannot_be_run_stops_the_sampler_with_why(tmp_path):
    broken = tmp_path / "py-spy"
    broken.write_text("not a program")  # not executable
    with StackSampler(str(broken)) as sampler:
        assert sampler.poll(os.getpid()) is None and sampler.window is None
        assert sampler.stopped and sampler.note == (
            f"py-spy could not be started ({broken}: Permission denied)")
