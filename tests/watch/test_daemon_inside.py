"""The daemon's parts in-process: which processes are jobs, a GPU job found through a fake
NVML replaying readings, another user's job (psutil's AccessDenied through the finder's
seam), and the log rotated by size with every line whole."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from fake_nvml import FakeNvml
from rich.console import Console

from tuneup.runtime.hooks import ENV_OBSERVERS
from tuneup.watch import daemon as daemon_module
from tuneup.watch import feed
from tuneup.watch.control import print_status
from tuneup.watch.daemon import Daemon
from tuneup.watch.discover import GPU, IMPORTS, RUNTIME, Finder, imports_tuneup, is_tuneup_tool
from tuneup.watch.state import StateDir

SLEEPS = "import time\ntime.sleep(60)\n"
WITH_CHILD = ("import subprocess, sys, time, tuneup\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import tuneup, time; "
              "time.sleep(60)'])\n"
              "print(child.pid, flush=True)\n"
              "time.sleep(60)\n")


@pytest.fixture
def spawn() -> Iterator[Any]:
    """Starts Python processes for a test (``-c`` code, or a script); kills them after it.

    Popen returns when ``exec`` has closed the error pipe, before the kernel sets the new
    command line: under load a finder can read an empty one for a while (a process it
    reads again next tick, as the daemon does). A started process here is past that."""
    started: list[psutil.Process] = []

    def start(code: str = SLEEPS, script: str | None = None, **popen: Any) -> subprocess.Popen:
        command = [sys.executable, script] if script else [sys.executable, "-c", code]
        process = subprocess.Popen(command, **popen)
        started.append(psutil.Process(process.pid))
        deadline = time.monotonic() + 30
        while not started[-1].cmdline() and time.monotonic() < deadline:
            time.sleep(0.01)
        return process

    yield start
    for process in started:
        for member in [*process.children(recursive=True), process]:
            member.kill()
    psutil.wait_procs(started, timeout=10)


def finder_for(*pids: int, **seams: Any) -> Finder:
    """A finder that sees only ``pids`` (the machine may run other tuneup jobs)."""
    return Finder(list_pids=lambda: [pid for pid in pids if psutil.pid_exists(pid)], **seams)


@pytest.mark.parametrize(("cmdline", "tool"), [
    (["/v/bin/python", "/v/bin/tuneup", "watch", "--daemon"], True),
    (["python3", "-m", "tuneup.cli", "autotune", "train.py"], True),
    (["python3", "-m", "tuneup.watch.daemon", "--state-dir", "/s"], True),
    (["python3", "train.py", "--out", "tuneup"], False),
])
def test_tuneup_s_own_commands_are_never_jobs(cmdline, tool):
    assert is_tuneup_tool(cmdline) is tool


def test_imports_of_tuneup_are_read_from_the_code_or_the_script(tmp_path):
    (tmp_path / "train.py").write_text("import os, tuneup as t\n")
    (tmp_path / "plain.py").write_text("import torch\n# from tuneup import nothing\n")
    assert imports_tuneup(["python", "train.py"], str(tmp_path))
    assert not imports_tuneup(["python", "plain.py"], str(tmp_path))
    assert imports_tuneup(["python", "-c", "from tuneup import tuned_loop"], None)
    assert not imports_tuneup(["python", "missing.py"], str(tmp_path))


def test_jobs_are_found_by_the_runtime_s_environment_or_their_imports(spawn, tmp_path):
    directory = tmp_path / "feed"
    fed = spawn(env={**os.environ, ENV_OBSERVERS: feed.OBSERVER, feed.ENV_FEED: str(directory)})
    (tmp_path / "train.py").write_text("from tuneup import tuned_loop\n" + SLEEPS)
    importer = spawn(script="train.py", cwd=tmp_path)
    plain = spawn()
    found = {f.pid: f for f in finder_for(fed.pid, importer.pid, plain.pid).find()}
    assert set(found) == {fed.pid, importer.pid}
    assert found[fed.pid].found_by == RUNTIME and found[fed.pid].feed_directory == directory
    assert found[importer.pid].found_by == IMPORTS and found[importer.pid].feed_directory is None
    on_gpu = finder_for(plain.pid).find(on_gpu={plain.pid})
    assert [(f.pid, f.found_by) for f in on_gpu] == [(plain.pid, GPU)]


def test_a_job_s_children_are_in_its_tree_not_jobs_of_their_own(spawn):
    parent = spawn(WITH_CHILD, stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert [f.pid for f in finder_for(parent.pid, child).find()] == [parent.pid]


class OtherUsers:
    """A process as psutil shows another user's: the command line is there, the
    environment and the working directory are denied."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.process, name)

    def environ(self) -> dict[str, str]:
        raise psutil.AccessDenied(self.process.pid)

    def cwd(self) -> str:
        raise psutil.AccessDenied(self.process.pid)

    def username(self) -> str:
        return "alice"


def test_another_user_s_job_is_skipped_with_one_note(spawn, tmp_path):
    ours = spawn("import tuneup, time; time.sleep(60)")
    theirs = [spawn("import tuneup, time; time.sleep(60)") for _ in range(2)]
    pids = [ours.pid, *(p.pid for p in theirs)]
    finder = finder_for(*pids, open_process=lambda pid: psutil.Process(pid) if pid == ours.pid
                        else OtherUsers(pid))
    state = StateDir(tmp_path / "state")
    daemon = Daemon(state, 0.1, finder=finder)
    try:
        for _ in range(3):
            daemon.tick()
            time.sleep(0.05)
        status = state.read_status()
    finally:
        daemon.close()
    assert [job["pid"] for job in status["jobs"]] == [ours.pid]
    said = [note for note in status["notes"] if "alice" in note]
    assert said == ["Python processes of alice cannot be read (permission denied): skipped; "
                    "run the daemon as that user (or root) to watch them"]
    events = [json.loads(line) for line in state.log_file.read_text().splitlines()]
    assert sum("alice" in e.get("note", "") for e in events) == 1
    console = Console(file=io.StringIO(), width=200)
    print_status(console, status)
    assert "note: Python processes of alice cannot be read" in console.file.getvalue()


GPU_BUSY = {"util": 97, "memory_used": 30 << 30, "power_mw": 240000, "sm_clock": 1410,
            "reasons": 0, "rx_kbs": 1000, "tx_kbs": 100, "temp": 60}


def test_a_python_process_holding_a_gpu_context_is_a_job_judged_on_nvml(spawn, tmp_path):
    plain = spawn()  # no tuneup anywhere: only NVML's process list makes it a job
    elsewhere = spawn()
    recording = {"devices": [{"name": "NVIDIA A100-PCIE-40GB", "max_sm_clock": 1410,
                              "pcie_gen": 4, "pcie_width": 16, "power_limit_mw": 250000,
                              "memory_total": 40 << 30}],
                 "ticks": [[{**GPU_BUSY, "processes": [[plain.pid, 20 << 30]]}]] * 4}
    nvml = FakeNvml(recording)
    state = StateDir(tmp_path / "state")
    daemon = Daemon(state, 0.1, finder=finder_for(plain.pid, elsewhere.pid), nvml=nvml)
    try:
        for _ in range(4):
            nvml.advance()
            daemon.tick()
            time.sleep(0.05)
        status = state.read_status()
    finally:
        daemon.close()
    assert nvml.shut_down
    [job] = status["jobs"]
    assert job["pid"] == plain.pid and job["found_by"] == GPU
    assert job["verdict"]["kind"] == "compute-bound"
    assert job["verdict"]["evidence"]["gpu_utilization"] == 97
    samples = [json.loads(line) for line in state.log_file.read_text().splitlines()
               if '"sample"' in line]
    assert samples[-1]["sample"]["gpus"][0]["job_memory"] == 20 << 30


def test_the_log_rotates_by_size_and_every_line_stays_whole(spawn, tmp_path, monkeypatch):
    monkeypatch.setattr(daemon_module, "LOG_MAX_BYTES", 3000)
    monkeypatch.setattr(daemon_module, "LOG_BACKUPS", 2)
    job = spawn("import tuneup, time; time.sleep(60)")
    state = StateDir(tmp_path / "state")
    log = tmp_path / "watch.jsonl"
    daemon = Daemon(state, 0.1, log=log, finder=finder_for(job.pid))
    try:
        for _ in range(12):
            daemon.tick()
    finally:
        daemon.close()
    files = sorted(tmp_path.glob("watch.jsonl*"))
    assert [f.name for f in files] == ["watch.jsonl", "watch.jsonl.1", "watch.jsonl.2"]
    for path in files:
        lines = path.read_text().splitlines()
        assert lines and all(json.loads(line)["event"] for line in lines)
        assert path.stat().st_size <= 3000 or len(lines) == 1  # one line longer than the limit
    assert json.loads(log.read_text().splitlines()[-1])["event"] == "stopped"


def test_the_lock_is_the_directory_s_and_a_crash_releases_it(tmp_path):
    state = StateDir(tmp_path / "state")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from tuneup.watch.state import StateDir\n"
        f"StateDir(Path({str(state.path)!r})).lock(); print('locked', flush=True); "
        "time.sleep(60)")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(Exception, match="a daemon already watches"):
            state.lock()
    finally:
        holder.kill()
        holder.wait()
    os.close(state.lock())  # SIGKILL released it


class MidExec(OtherUsers):
    """A process caught inside ``exec``: its new name is set, its command line not yet."""

    def cmdline(self) -> list[str]:
        return []

    def environ(self) -> dict[str, str]:
        return self.process.environ()

    def name(self) -> str:
        return "python3"


def test_a_process_caught_inside_exec_is_read_again_next_tick(spawn):
    job = spawn("import tuneup, time; time.sleep(60)")
    caught = [True]
    finder = finder_for(job.pid, open_process=lambda pid: MidExec(pid) if caught[0]
                        else psutil.Process(pid))
    assert finder.find() == []
    caught[0] = False
    assert [f.pid for f in finder.find()] == [job.pid]


FORKS_THEN_EXECS = ("import os, sys, time\n"
                    "child = os.fork()\n"
                    "if child == 0:\n"
                    "    time.sleep(1.5)\n"
                    "    os.execv(sys.executable, [sys.executable, '-c', "
                    "'import tuneup, time; time.sleep(60)'])\n"
                    "print(child, flush=True)\n"
                    "time.sleep(60)\n")


def test_a_fork_is_read_again_once_it_execs_into_a_job(spawn):
    """Between fork and exec a process shows its parent's command line and environment:
    decided then, a job started from a shell or a launcher would be missed for good."""
    launcher = spawn(FORKS_THEN_EXECS, stdout=subprocess.PIPE, text=True)
    child = int(launcher.stdout.readline())
    finder = finder_for(launcher.pid, child)
    assert finder.find() == []
    deadline = time.monotonic() + 30
    while psutil.Process(child).cmdline() == psutil.Process(launcher.pid).cmdline():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert [(f.pid, f.found_by) for f in finder.find()] == [(child, IMPORTS)]


FORKS = "import os, time\nchild = os.fork()\nprint(child, flush=True) if child else None\ntime.sleep(60)\n"


def test_a_fork_that_holds_a_gpu_is_a_job_at_once(spawn):
    """A fork pool's member never execs: on a GPU it is a job, whatever its command line."""
    pool = spawn(FORKS, stdout=subprocess.PIPE, text=True)
    member = int(pool.stdout.readline())
    assert [(f.pid, f.found_by) for f in finder_for(pool.pid, member).find(on_gpu={member})] \
        == [(member, GPU)]
