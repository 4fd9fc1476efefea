"""`tuneup watch --daemon` as a user runs it: a real detached daemon on a temporary state
directory, real jobs for it to find, then `status` and `stop` (or a bare SIGTERM)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from click.testing import CliRunner

from tuneup.cli import main
from tuneup.errors import EXIT_USAGE
from tuneup.watch.state import StateDir

pytestmark = pytest.mark.slow

# A job the daemon recognises (it imports tuneup) that runs until its stop file appears.
JOB = ("import os, sys, time, tuneup\n"
       "while not os.path.exists(sys.argv[1]):\n"
       "    time.sleep(0.02)\n")


def run(*args: str):
    return CliRunner().invoke(main, ["watch", *args])


def wait_for(check: Callable[[], Any], timeout: float = 20.0) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s")


@pytest.fixture
def state(tmp_path: Path, no_gpu_in_subprocesses) -> Iterator[StateDir]:
    """A state directory; whatever daemon a test leaves running there is killed. The daemon
    reads no GPU: its jobs here wait on the CPU, and on a GPU machine another test's busy GPU
    (every GPU counts for a job that holds none) keeps them from ever being idle."""
    state = StateDir(tmp_path / "state")
    yield state
    pid = state.running_pid()
    if pid is not None:
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def job(tmp_path: Path) -> Iterator[tuple[psutil.Process, Path]]:
    """A job started through a shell that leaves it behind: its parent is not this test
    process (which imports tuneup, so the daemon would count the job in its tree)."""
    script = tmp_path / "train.py"
    script.write_text(JOB)
    stop = tmp_path / "stop-the-job"
    line = f'"{sys.executable}" "{script}" "{stop}" >/dev/null 2>&1 </dev/null & echo $!'
    shell = subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=True)
    process = psutil.Process(int(shell.stdout))
    yield process, stop
    stop.touch()
    psutil.wait_procs([process], timeout=30)


def start(state: StateDir, *extra: str) -> int:
    result = run("--daemon", "--state-dir", str(state.path), "--interval", "0.2", *extra)
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0]
    assert first.startswith("tuneup watch: daemon started, pid ") and str(state.path) in first
    pid = int(first.split("pid ")[1].split(";")[0])
    assert state.read_pid() == pid == state.running_pid()
    return pid


def job_status(state: StateDir, pid: int) -> dict[str, Any] | None:
    data = state.read_status() or {}
    return next((job for job in data.get("jobs", []) if job["pid"] == pid), None)


def log_events(path: Path) -> list[dict[str, Any]]:
    """Every line of the log, each one whole JSON (a cut line fails here)."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_start_status_stop(state, job):
    process, _ = job
    pid = start(state)
    daemon = psutil.Process(pid)
    assert daemon.ppid() != os.getpid() and os.getsid(pid) != os.getsid(0)  # detached
    # the first verdicts may still see the job's imports in their window: it settles on idle
    seen = wait_for(lambda: (j := job_status(state, process.pid)) and j["verdict"]
                    and j["verdict"]["kind"] == "idle" and j, timeout=45.0)
    assert seen["found_by"] == "imports tuneup" and seen["state"] == "running"
    assert seen["verdict_since"]

    text = run("status", "--state-dir", str(state.path))
    assert text.exit_code == 0, text.output
    assert f"pid {pid}" in text.output and "idle" in text.output
    assert f"{process.pid}" in text.output and "train.py" in text.output
    as_json = json.loads(run("status", "--state-dir", str(state.path), "--format",
                             "json").output)
    assert as_json["running"] is True and as_json["pid"] == pid
    assert any(j["pid"] == process.pid and j["verdict"]["kind"] == "idle"
               for j in as_json["jobs"])

    stopped = run("stop", "--state-dir", str(state.path))
    assert stopped.exit_code == 0 and f"stopped the daemon (pid {pid})" in stopped.output
    assert not psutil.pid_exists(pid) or daemon.status() == psutil.STATUS_ZOMBIE
    assert not state.pid_file.exists() and process.is_running()  # the job runs on
    events = log_events(state.log_file)
    assert events[0]["event"] == "started" and events[-1] == {
        **events[-1], "event": "stopped", "signal": "SIGTERM"}
    assert any(e["event"] == "job-seen" and e["job"] == process.pid for e in events)
    assert (state.read_status() or {})["stopped_at"]

    after = run("status", "--state-dir", str(state.path))
    assert after.exit_code == 1 and "no daemon runs with" in after.output
    assert json.loads(run("status", "--state-dir", str(state.path), "--format",
                          "json").output)["running"] is False
    assert "no daemon runs" in run("stop", "--state-dir", str(state.path)).output


def test_a_second_daemon_on_the_same_state_directory_refuses_to_start(state):
    pid = start(state)
    result = run("--daemon", "--state-dir", str(state.path))
    assert result.exit_code == EXIT_USAGE
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tuneup watch: a daemon already watches")
    assert f"(pid {pid})" in lines[0]
    assert state.running_pid() == pid  # the first one goes on
    assert run("stop", "--state-dir", str(state.path)).exit_code == 0


def test_the_start_report_as_json_for_scripts(state):
    result = run("--daemon", "--state-dir", str(state.path), "--format", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["pid"] == state.running_pid() and report["state_dir"] == str(state.path)
    assert report["log"] == str(state.log_file) and report["serve"] is None
    assert run("stop", "--state-dir", str(state.path)).exit_code == 0


def test_a_stale_pid_file_is_said_and_removed(state):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    state.create()
    state.write_pid(gone.pid)
    assert state.running_pid() is None
    said = run("status", "--state-dir", str(state.path))
    assert said.exit_code == 1 and f"names pid {gone.pid}, which is gone" in said.output
    result = run("--daemon", "--state-dir", str(state.path), "--interval", "0.2")
    assert result.exit_code == 0, result.output
    assert f"removed the stale pid file of pid {gone.pid}" in result.output
    assert state.running_pid() not in (None, gone.pid)
    assert run("stop", "--state-dir", str(state.path)).exit_code == 0


def test_a_job_that_exits_mid_watch_is_marked_ended_with_its_last_verdict(state, job):
    process, stop = job
    start(state)
    # the first window can cover the job's start-up (its imports keep a core busy under a
    # loaded suite: 'compute-bound'); the verdict kept at the end is the one of its idle wait
    wait_for(lambda: (j := job_status(state, process.pid)) and j["verdict"]
             and j["verdict"]["kind"] == "idle")
    stop.touch()
    psutil.wait_procs([process], timeout=30)
    ended = wait_for(lambda: (j := job_status(state, process.pid)) and j["ended_at"] and j)
    assert ended["state"] == "ended" and ended["verdict"]["kind"] == "idle"
    assert "ended" in run("status", "--state-dir", str(state.path)).output
    events = log_events(state.log_file)
    assert [e for e in events if e["event"] == "job-ended" and e["job"] == process.pid]
    assert run("stop", "--state-dir", str(state.path)).exit_code == 0


def test_sigterm_leaves_the_log_and_the_status_whole(state, job, tmp_path):
    process, _ = job
    log = tmp_path / "logs" / "daemon.jsonl"
    log.parent.mkdir()
    pid = start(state, "--log", str(log), "--interval", "0.1")
    wait_for(lambda: (j := job_status(state, process.pid)) and j["samples"] >= 5)
    daemon = psutil.Process(pid)
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not daemon.is_running() or daemon.status() == psutil.STATUS_ZOMBIE)
    events = log_events(log)  # every line whole
    assert events[-1]["event"] == "stopped" and events[-1]["signal"] == "SIGTERM"
    assert sum(e["event"] == "sample" for e in events) >= 5
    assert not state.log_file.exists()  # --log replaced the default
    status = state.read_status()
    assert status is not None and status["stopped_at"] and status["log"] == str(log)
    assert not state.pid_file.exists()


@pytest.mark.parametrize(("args", "says"), [
    (["--daemon", "--", "python"], "give it no command"),
    (["--daemon", "--pid", "1"], "give it no command"),
    (["--state-dir", "/tmp", "--", "python"], "--state-dir and --log go with --daemon"),
    (["--log", "/tmp/x.jsonl", "--pid", "1"], "--state-dir and --log go with --daemon"),
])
def test_daemon_usage_errors(args, says):
    result = run(*args)
    assert result.exit_code == EXIT_USAGE and says in result.output, result.output


def test_a_program_named_status_still_runs_after_the_double_dash(tmp_path):
    program = tmp_path / "status"
    program.write_text("#!/bin/sh\nexit 4\n")
    program.chmod(0o755)
    result = CliRunner().invoke(main, ["watch", "--interval", "0.2", "--", "status"],
                                env={"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"})
    assert result.exit_code == 4, result.output
