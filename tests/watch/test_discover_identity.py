"""Jobs the finder must not lose or repeat (issue 40, item 11): a job a wrapper ``exec``s,
a Python that ``exec``s Python, a pid reused by a new process, and a zombie nobody reaps,
which is recorded once, not found again every tick."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest

from tuneup.watch.daemon import Daemon
from tuneup.watch.discover import IMPORTS, Finder, identity
from tuneup.watch.state import StateDir

JOB = "import tuneup, time; time.sleep(60)"


@pytest.fixture
def started() -> Iterator[Callable[..., subprocess.Popen]]:
    processes: list[subprocess.Popen] = []

    def start(command: list[str], **popen: Any) -> subprocess.Popen:
        processes.append(subprocess.Popen(command, **popen))
        return processes[-1]

    yield start
    for process in processes:
        process.kill()
        process.wait()


def until(check: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.02)
    raise AssertionError(f"not within {timeout} s")


def runs(pid: int, word: str) -> bool:
    try:
        return word in " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def runs_the_job(pid: int) -> bool:
    """``pid`` runs the job itself (its wrapper's command line names the job too)."""
    try:
        return psutil.Process(pid).cmdline()[1:] == ["-c", JOB]
    except psutil.Error:
        return False


def test_a_job_a_shell_wrapper_execs_is_found(started, tmp_path):
    go = tmp_path / "go"
    wrapper = started(["sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.05; done; '
                                   f'exec "{sys.executable}" -c "{JOB}"'])
    finder = Finder(list_pids=lambda: [wrapper.pid])
    until(lambda: runs(wrapper.pid, "while"))
    assert finder.find() == []  # a shell: no job, and so cached
    go.touch()
    until(lambda: runs_the_job(wrapper.pid))
    assert [(f.pid, f.found_by) for f in finder.find()] == [(wrapper.pid, IMPORTS)]


def test_a_python_that_execs_the_job_is_found(started, tmp_path):
    go = tmp_path / "go"
    code = (f"import os, sys, time, pathlib\nwhile not pathlib.Path({str(go)!r}).exists(): "
            f"time.sleep(0.05)\nos.execv(sys.executable, [sys.executable, '-c', {JOB!r}])")
    wrapper = started([sys.executable, "-c", code])
    finder = Finder(list_pids=lambda: [wrapper.pid])
    until(lambda: runs(wrapper.pid, "execv"))
    assert finder.find() == []  # Python, but no job: its name stays "python" after exec
    go.touch()
    until(lambda: runs_the_job(wrapper.pid))
    assert [(f.pid, f.found_by) for f in finder.find()] == [(wrapper.pid, IMPORTS)]


def test_a_pid_reused_by_a_job_is_read_anew(started):
    """One pid as the finder sees it: first a plain Python process, then (reused) a job."""
    plain = started([sys.executable, "-c", "import time; time.sleep(60)"])
    job = started([sys.executable, "-c", JOB])
    until(lambda: runs(plain.pid, "sleep") and runs_the_job(job.pid))
    behind, reused = [plain.pid], 4_000_000

    def real(pid: int) -> int:
        return behind[0] if pid == reused else pid

    finder = Finder(list_pids=lambda: [reused],
                    open_process=lambda pid: psutil.Process(real(pid)),
                    identify=lambda pid, command: identity(real(pid), command))
    assert finder.find() == []
    behind[0] = job.pid  # the plain process ended; the kernel gave its pid to the job
    assert [(f.pid, f.found_by) for f in finder.find()] == [(reused, IMPORTS)]


def test_a_zombie_nobody_reaps_is_recorded_once(started, tmp_path):
    parent = started([sys.executable, "-c",  # starts the job, never reaps it
                      "import subprocess, sys, time\n"
                      f"child = subprocess.Popen([sys.executable, '-c', {JOB!r}])\n"
                      "print(child.pid, flush=True)\ntime.sleep(60)"],
                     stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    until(lambda: runs_the_job(child))
    state = StateDir(tmp_path / "state")
    daemon = Daemon(state, 0.1, finder=Finder(list_pids=lambda: [child]))
    try:
        daemon.tick()
        psutil.Process(child).kill()
        until(lambda: psutil.Process(child).status() == psutil.STATUS_ZOMBIE)
        for _ in range(5):
            daemon.tick()
        status = state.read_status()
    finally:
        daemon.close()
    assert [(job["pid"], job["state"]) for job in status["jobs"]] == [(child, "ended")]
    events = [json.loads(line) for line in state.log_file.read_text().splitlines()]
    assert [e["event"] for e in events if e.get("job") == child].count("job-seen") == 1
