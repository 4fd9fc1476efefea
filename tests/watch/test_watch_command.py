"""`tuneup watch` as a user runs it: usage errors, the job's output and exit status passed
on, signals passed to the job with the summary left whole, and attaching with --pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from click.testing import CliRunner

from tuneup.cli import main
from tuneup.errors import EXIT_USAGE

WATCH = [sys.executable, "-m", "tuneup.cli", "watch"]


def run(*args: str):
    return CliRunner().invoke(main, ["watch", *args])


@pytest.mark.parametrize(("args", "says"), [
    ([], "give a command to run (after --) or --pid PID"),
    (["--pid", "1", "--", "python"], "not both"),
    (["--interval", "0", "--", "python"], "--interval must be at least 0.1 seconds"),
    (["--interval", "nan", "--", "python"], "--interval must be at least"),
    (["--summary", "/no/such/dir/s.json", "--", "python"], "cannot write the summary into"),
    (["--", "no-such-program-here"], "no such command: no-such-program-here"),
    (["--pid", "999999999"], "--pid 999999999: no such process"),
    (["--pid", str(os.getpid())], "is the watcher itself"),
    (["--format", "yaml", "--", "python"], "Invalid value for '--format'"),
])
def test_usage_errors_are_one_line_and_exit_2(args, says):
    result = run(*args)
    assert result.exit_code == EXIT_USAGE, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tuneup watch: ") and says in lines[0], lines


def test_output_passes_through_and_the_exit_status_is_passed_on(tmp_path):
    summary = tmp_path / "summary.json"
    job = ("import sys, time; print('out', flush=True); time.sleep(0.5); "
           "sys.stderr.write('err\\n'); sys.exit(3)")
    done = subprocess.run([*WATCH, "--interval", "0.2", "--summary", str(summary), "--",
                           sys.executable, "-c", job], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    assert done.stdout == "out\n"  # the job's stdout, and nothing of the watcher's
    assert done.stderr.startswith("err\n") or "\nerr\n" in done.stderr
    assert "sampling" in done.stderr and "exit status 3" in done.stderr
    result = json.loads(summary.read_text())
    assert result["exit_status"] == 3 and result["command"][-1] == job
    assert result["samples"] >= 1 and result["timeline"]
    assert any(note.startswith(("NVML", "no runtime")) or "GPU" in note for note in result["notes"])


def test_json_format_gives_a_json_line_per_sample_and_the_summary(tmp_path):
    result = run("--interval", "0.2", "--format", "json", "--", sys.executable, "-c",
                 "import time; time.sleep(0.7)")
    assert result.exit_code == 0, result.output
    text = result.stderr
    lines = text.splitlines()
    per_sample = [json.loads(line) for line in lines if line.startswith('{"sample"')]
    assert per_sample and set(per_sample[0]) == {"sample", "verdict"}
    final = json.loads(text[text.index("\n{\n") + 1:])
    assert final["exit_status"] == 0 and final["samples"] == len(per_sample)


TRAPS = textwrap.dedent("""
    import signal, sys, time
    def stop(signum, frame):
        print(f"job got {signal.Signals(signum).name}", flush=True)
        time.sleep(0.3)  # cleaning up: the watcher must wait for it
        sys.exit(7)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
""")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_watcher_reaches_the_job_and_the_summary_stays_whole(tmp_path, signum):
    script = tmp_path / "job.py"
    script.write_text(TRAPS)
    summary = tmp_path / "summary.json"
    watcher = subprocess.Popen([*WATCH, "--interval", "0.2", "--summary", str(summary), "--",
                                sys.executable, str(script)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert watcher.stdout.readline() == "ready\n"
        time.sleep(0.5)  # a few samples
        watcher.send_signal(signum)
        out, err = watcher.communicate(timeout=30)
    finally:
        watcher.kill()
    assert out == f"job got {signal.Signals(signum).name}\n"
    assert watcher.returncode == 7, err
    result = json.loads(summary.read_text())
    assert result["exit_status"] == 7 and result["samples"] >= 2


def test_attaching_watches_until_the_process_ends(tmp_path, no_gpu):
    """A busy CPU process; the watcher sees no GPU (with one it left idle: host-bound)."""
    job = subprocess.Popen([sys.executable, "-c", "import time\nend = time.monotonic() + 1.5\n"
                            "while time.monotonic() < end: pass"])
    try:
        summary = tmp_path / "summary.json"
        result = run("--pid", str(job.pid), "--interval", "0.2", "--summary", str(summary))
    finally:
        job.wait()
    assert result.exit_code == 0, result.output
    data = json.loads(summary.read_text())
    assert data["pid"] == job.pid and data["command"] is None and data["exit_status"] is None
    assert any(note.startswith("no runtime feed") for note in data["notes"])
    evidence = data["verdict"]["evidence"]
    if any("py-spy" in note for note in data["notes"]):  # not installed, or ptrace refused
        assert data["verdict"]["kind"] == "undetermined"  # a busy process alone is no claim
    else:  # its stacks, taken until it ended, never show the DataLoader
        assert data["verdict"]["kind"] == "compute-bound"
        assert evidence["basis"] == "py-spy stacks" and evidence["loading_share"] == 0.0
    assert result.stdout.startswith("[") and "tuneup watch: pid" in result.stdout


def test_stopping_an_attached_watcher_leaves_the_job_running(tmp_path):
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    summary = tmp_path / "summary.json"
    try:
        watcher = subprocess.Popen([*WATCH, "--pid", str(job.pid), "--interval", "0.2",
                                    "--summary", str(summary)], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, start_new_session=True)
        assert watcher.stdout.readline().startswith("[")  # watching
        watcher.send_signal(signal.SIGTERM)
        watcher.communicate(timeout=30)
        assert watcher.returncode == 128 + signal.SIGTERM
        assert job.poll() is None
        assert json.loads(summary.read_text())["samples"] >= 1
    finally:
        job.kill()
        job.wait()
