"""What any local user can do to the daemon, bounded (issue 40, item 10): huge command lines
keep the status small and ``watch status`` truthful, a feed folder of many files costs
nothing, a client trickling bytes loses its ``/metrics`` slot at the deadline, and a
script name that is no UTF-8 is a label like any other."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from tuneup.cli import main
from tuneup.watch import feed, serve
from tuneup.watch.daemon import Daemon
from tuneup.watch.discover import MAX_COMMAND_CHARS, Finder
from tuneup.watch.recent import Recent
from tuneup.watch.samples import HostSample, ProcessSample, RuntimeSample, Sample
from tuneup.watch.state import MAX_STATUS_BYTES, StateDir

ARGUMENT = "x" * 120_000  # Linux takes at most 128 KiB per argument, 2 MiB in all


@pytest.fixture
def huge_jobs() -> Iterator[list[subprocess.Popen]]:
    """Three jobs (they import tuneup) with 1.4 MB command lines each."""
    code = "import tuneup, time; time.sleep(60)"
    jobs = [subprocess.Popen([sys.executable, "-c", code, *[ARGUMENT] * 12]) for _ in range(3)]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(psutil.Process(j.pid).cmdline() for j in jobs):
        time.sleep(0.01)
    yield jobs
    for job in jobs:
        job.kill()
        job.wait()


def test_huge_command_lines_are_stored_cut_and_the_status_stays_readable(tmp_path, huge_jobs):
    pids = {job.pid for job in huge_jobs}
    state = StateDir(tmp_path / "state")
    daemon = Daemon(state, 0.1, finder=Finder(list_pids=lambda: pids))
    try:
        daemon.tick()
        status = state.read_status()
    finally:
        daemon.close()
    assert status is not None and {job["pid"] for job in status["jobs"]} == pids
    assert state.status_file.stat().st_size < MAX_STATUS_BYTES / 50
    for job in status["jobs"]:
        whole = " ".join(psutil.Process(job["pid"]).cmdline())
        kept, marker = " ".join(job["command"]).rsplit("…", 1)
        left_out = int(re.fullmatch(r"\[(\d+) more characters\]", marker)[1])
        assert len(kept) < MAX_COMMAND_CHARS and len(kept) + left_out == len(whole)
        assert whole.startswith(kept)
    logged = [json.loads(line) for line in state.log_file.read_text().splitlines()]
    assert all(len(" ".join(e["command"])) < MAX_COMMAND_CHARS + 40
               for e in logged if e["event"] == "job-seen")


def test_status_never_calls_a_running_daemon_dead_when_its_status_is_unreadable(tmp_path):
    state = StateDir(tmp_path / "state")
    started = CliRunner().invoke(main, ["watch", "--daemon", "--state-dir", str(state.path),
                                        "--interval", "60"])
    assert started.exit_code == 0, started.output
    pid = state.read_pid()
    try:
        state.status_file.write_bytes(b" " * (MAX_STATUS_BYTES + 10))  # as a flood left it
        result = CliRunner().invoke(main, ["watch", "status", "--state-dir", str(state.path)])
        assert result.exit_code == 1
        assert f"the daemon (pid {pid}) runs, but its status" in result.output
        as_json = CliRunner().invoke(main, ["watch", "status", "--state-dir", str(state.path),
                                            "--format", "json"])
        assert json.loads(as_json.output)["running"] is True
    finally:
        os.kill(pid, signal.SIGTERM)
        psutil.wait_procs([psutil.Process(pid)], timeout=10)


def test_the_feed_is_read_by_its_known_names_never_by_listing_the_folder(tmp_path, monkeypatch):
    record = {"pid": 7, "steps": 3, "samples": 24, "elapsed_s": 1.5, "data_wait_s": 0.5,
              "copy_s": 0.0}
    (tmp_path / "7.json").write_text(json.dumps(record))

    def listing(*args: object) -> None:
        raise AssertionError("the feed folder was listed")

    monkeypatch.setattr(os, "scandir", listing)
    monkeypatch.setattr(os, "listdir", listing)
    assert [r.steps for r in feed.read(tmp_path, [3, 7, 9])] == [3]


def test_a_client_trickling_bytes_is_cut_off_at_the_request_deadline(monkeypatch):
    monkeypatch.setattr(serve, "REQUEST_DEADLINE_S", 1.0, raising=False)
    monkeypatch.setattr(serve, "CONNECTION_TIMEOUT_S", 5.0)  # each byte comes well within it
    with serve.Exporter("127.0.0.1:0") as exporter, socket.create_connection(
            ("127.0.0.1", exporter.server.server_port), timeout=5) as slow:
        start = time.monotonic()
        closed_after = None
        for byte in b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 100:
            if select.select([slow], [], [], 0.2)[0]:  # the server hung up
                closed_after = time.monotonic() - start
                break
            try:
                slow.send(bytes([byte]))
            except OSError:
                closed_after = time.monotonic() - start
                break
            if time.monotonic() - start > 4:
                break
    assert closed_after is not None and closed_after < 2.5


def test_a_script_name_that_is_no_utf8_is_scraped_not_http_500():
    script = Recent(["python", os.fsdecode(b"/home/eve/\xff\xfetrain.py")]).script
    runtime = (RuntimeSample(pid=10, steps=5, samples=40, elapsed_s=1.0, data_wait_s=0.1,
                             copy_s=0.0),)
    sample = Sample(t=1.0, gpus=(), processes=(ProcessSample(10, "main", 50.0, 1, 4, 1 << 20,
                                                             None),),
                    host=HostSample(10.0, 0.0, 0.0, 1 << 30, 2 << 30, 2.0), runtime=runtime)
    with serve.Exporter("127.0.0.1:0") as exporter:
        exporter.publish([serve.JobView(10, script, sample, None, None)])
        with urllib.request.urlopen(exporter.url, timeout=10) as response:
            text = response.read().decode("utf-8")
    assert 'script="/home/eve/\ufffd\ufffdtrain.py"' in text
    assert "tuneup_watch_steps_total" in text


def test_the_bounded_command_keeps_short_ones_whole():
    from tuneup.watch.discover import bounded

    assert bounded(["python", "train.py", "--lr", "3"]) == ("python", "train.py", "--lr", "3")
    cut = bounded(["python", "t.py", *["y" * 1000] * 10])
    assert len(" ".join(cut)) <= MAX_COMMAND_CHARS + 30 and cut[-1].endswith("more characters]")
    assert Path(cut[1]).name == "t.py"
