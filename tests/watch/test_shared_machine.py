"""`tuneup watch` run as root on a machine shared with a hostile local user: links planted in
the state directory, named pipes where a job's script or feed should be, idle connections
to the metrics endpoint, stale pid files, zombies, folders left by a killed watcher."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from click.testing import CliRunner

from tuneup import owned_dirs
from tuneup.cli import main
from tuneup.errors import EXIT_USAGE, UsageError
from tuneup.runtime.hooks import ENV_OBSERVERS
from tuneup.watch import feed, serve
from tuneup.watch.daemon import Daemon
from tuneup.watch.discover import Finder
from tuneup.watch.procs import ProcessTree, role_of
from tuneup.watch.samples import MAIN, HostSample, ProcessSample, Sample
from tuneup.watch.state import StateDir
from tuneup.watch.verdict import decide, reduce

WATCH = [sys.executable, "-m", "tuneup.cli", "watch"]
FEED_PREFIX = "tuneup-watch-"  # + the watcher's pid + "-" + mkdtemp's part (docs/watch.md)
SLEEPS = "import time; time.sleep(60)"


def run(*args: str) -> Any:
    return CliRunner().invoke(main, ["watch", *args])


def one_line(result: Any, code: int = EXIT_USAGE) -> str:
    """The command's only line of output, checked to be an error with exit ``code``."""
    lines = result.output.strip().splitlines()
    assert result.exit_code == code and len(lines) == 1, result.output
    assert lines[0].startswith("tuneup watch: "), lines
    return lines[0]


def finishes(call: Callable[[], Any], seconds: float = 10.0) -> bool:
    """``call`` returned within ``seconds`` (run in a thread a blocked call cannot hold)."""
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive()


def pipe(path: Path) -> Path:
    os.mkfifo(path)
    return path


def unblock(fifo: Path) -> None:
    """Let whoever waits to read ``fifo`` go (an end of file), if anyone does."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # no reader waits
        pass


def line_within(stream: Any, seconds: float) -> str | None:
    ready, _, _ = select.select([stream], [], [], seconds)
    return stream.readline() if ready else None


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen]]:
    """Starts processes for a test, waits until their command line is set, kills them after."""
    started: list[subprocess.Popen] = []

    def start(command: list[str], **popen: Any) -> subprocess.Popen:
        process = subprocess.Popen(command, **popen)
        started.append(process)
        deadline = time.monotonic() + 30
        while not psutil.Process(process.pid).cmdline() and time.monotonic() < deadline:
            time.sleep(0.01)
        return process

    yield start
    for process in started:
        process.kill()
        process.wait()


# -- 1. the state directory: this user's alone, nothing opened through a link ---------------
def test_a_state_directory_others_can_write_to_is_refused_and_nothing_is_written(tmp_path):
    state = StateDir(tmp_path / "shared")
    state.path.mkdir()
    state.path.chmod(0o777)
    victim = tmp_path / "root-only"
    victim.write_text("secret\n")
    state.log_file.symlink_to(victim)
    result = run("--daemon", "--state-dir", str(state.path), "--interval", "0.2")
    try:
        line = one_line(result)
        assert "can be written by other users" in line and "another --state-dir" in line
        assert victim.read_text() == "secret\n"
        assert sorted(p.name for p in state.path.iterdir()) == ["watch.jsonl"]
    finally:
        if (pid := state.read_pid()) is not None:  # the old code started a daemon there
            os.kill(pid, signal.SIGKILL)
    fresh = StateDir(tmp_path / "new" / "state")
    fresh.create()
    assert fresh.path.stat().st_mode & 0o777 == 0o700


def test_links_in_the_state_directory_are_never_followed(tmp_path):
    state = StateDir(tmp_path / "state")
    state.create()
    lock_victim, stderr_victim, log_victim = (tmp_path / name for name in ("a", "b", "c"))
    state.lock_file.symlink_to(lock_victim)
    with pytest.raises(UsageError, match="daemon.lock"):
        state.lock()
    state.lock_file.unlink()
    state.stderr_file.symlink_to(stderr_victim)
    result = run("--daemon", "--state-dir", str(state.path), "--interval", "0.2")
    try:
        assert "cannot write into the state directory" in one_line(result)
    finally:
        if (pid := state.read_pid()) is not None:
            os.kill(pid, signal.SIGKILL)
    log_victim.write_text("kept\n")
    link = tmp_path / "watch.jsonl"
    link.symlink_to(log_victim)
    with pytest.raises(UsageError, match="cannot write the log"):
        Daemon(state, 0.1, log=link, finder=Finder(list_pids=list))
    assert not lock_victim.exists() and not stderr_victim.exists()
    assert log_victim.read_text() == "kept\n"


# -- 2. named pipes where a job's files should be --------------------------------------------
def test_a_job_whose_script_is_a_named_pipe_does_not_stall_the_finder(tmp_path, spawn):
    script = pipe(tmp_path / "train.py")
    job = spawn([sys.executable, "train.py"], cwd=tmp_path)  # blocks opening its own script
    finder = Finder(list_pids=lambda: [job.pid])
    try:
        assert finishes(finder.find)
    finally:
        unblock(script)


def test_a_feed_holding_a_named_pipe_stalls_neither_the_daemon_nor_its_other_jobs(
        tmp_path, spawn):
    directory = tmp_path / "feed"
    directory.mkdir()
    fifo = pipe(directory / "x.json")
    hostile = spawn([sys.executable, "-c", SLEEPS],
                    env={**os.environ, ENV_OBSERVERS: feed.OBSERVER,
                         feed.ENV_FEED: str(directory)})
    other = spawn([sys.executable, "-c", "import tuneup, time; time.sleep(60)"])
    state = StateDir(tmp_path / "state")
    daemon = Daemon(state, 0.1, finder=Finder(list_pids=lambda: [hostile.pid, other.pid]))
    try:
        assert finishes(lambda: [daemon.tick() for _ in range(3)])
        jobs = {job["pid"]: job for job in (state.read_status() or {})["jobs"]}
        assert jobs[hostile.pid]["samples"] == jobs[other.pid]["samples"] == 3
    finally:
        unblock(fifo)
        daemon.close()


def test_sigterm_ends_an_attached_watcher_whose_job_s_feed_is_a_named_pipe(tmp_path, spawn):
    directory = tmp_path / "feed"
    directory.mkdir()
    fifo = pipe(directory / "x.json")
    job = spawn([sys.executable, "-c", SLEEPS],
                env={**os.environ, ENV_OBSERVERS: feed.OBSERVER, feed.ENV_FEED: str(directory)})
    watcher = subprocess.Popen([*WATCH, "--pid", str(job.pid), "--interval", "0.2"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = line_within(watcher.stdout, 30)
        assert first is not None and first.startswith("["), first  # a sample was taken
        watcher.send_signal(signal.SIGTERM)
        watcher.communicate(timeout=10)
        assert watcher.returncode == 128 + signal.SIGTERM
    finally:
        unblock(fifo)
        watcher.kill()
        watcher.wait()


STUCK = """
import sys, time
from tuneup.watch import sampler
def stuck(self):
    print("sampling", flush=True)
    time.sleep(3600)  # a read that never returns
sampler.Sampler.sample = stuck
from tuneup.cli import main
main(["watch", "--pid", sys.argv[1], "--interval", "0.1"])
"""


def test_sigterm_ends_an_attached_watcher_even_inside_a_sample_that_never_returns(spawn):
    job = spawn([sys.executable, "-c", SLEEPS])
    watcher = subprocess.Popen([sys.executable, "-c", STUCK, str(job.pid)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert line_within(watcher.stdout, 30) == "sampling\n"
        watcher.send_signal(signal.SIGTERM)
        _, err = watcher.communicate(timeout=10)
        assert watcher.returncode == 128 + signal.SIGTERM, err
        assert "Traceback" not in err
    finally:
        watcher.kill()
        watcher.wait()


# -- 3. exited jobs and jobs nothing was measured of -----------------------------------------
ZOMBIE_PARENT = ("import os, time\n"
                 "child = os.fork()\n"
                 "if child == 0:\n"
                 "    os._exit(0)\n"
                 "print(child, flush=True)\n"
                 "time.sleep(60)\n")


def test_watching_a_zombie_ends_at_once(spawn):
    parent = spawn([sys.executable, "-c", ZOMBIE_PARENT], stdout=subprocess.PIPE, text=True)
    zombie = psutil.Process(int(parent.stdout.readline()))
    deadline = time.monotonic() + 10
    while zombie.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.01)
    done = subprocess.run([*WATCH, "--pid", str(zombie.pid), "--interval", "0.2"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "compute-bound" not in done.stdout
    assert "none: the job ended before the first sample" in done.stdout


def test_a_job_that_only_sleeps_is_not_called_compute_bound(no_gpu):
    # no GPU for the watcher: another test's busy GPU would make the sleeper host-bound
    result = run("--interval", "0.5", "--format", "json", "--", "sleep", "0.8")
    assert result.exit_code == 0, result.output
    text = result.stderr
    summary = json.loads(text[text.index("\n{\n") + 1:])
    assert summary["verdict"]["kind"] in ("idle", "undetermined"), summary["verdict"]


def cpu_only(main_cpu: float | None, ticks: int = 3) -> list[Sample]:
    """A job with one process and no GPU, feed, workers or stacks: its CPU is all there is."""
    host = HostSample(cpu_percent=30.0, iowait_percent=0.5, swap_bytes_s=0.0,
                      memory_available=8 << 30, memory_total=16 << 30, usable_cores=2.0)
    busy = None if main_cpu is None else 1
    return [Sample(t=float(tick), gpus=(), host=host, runtime=(),
                   processes=(ProcessSample(10, MAIN, main_cpu, busy, 4, 1 << 30, None),))
            for tick in range(ticks)]


def test_no_compute_bound_without_a_measurement_behind_it():
    unmeasured = decide(reduce(cpu_only(None)))
    assert unmeasured.kind == "undetermined" and "no CPU reading" in unmeasured.reason
    half_busy = decide(reduce(cpu_only(40.0)), "train.py")
    assert half_busy.kind == "undetermined"
    assert "no runtime feed" in half_busy.reason and "py-spy" in half_busy.reason
    assert "tuneup watch -- python train.py" in half_busy.action
    assert "tuneup[stacks]" in half_busy.action
    busy = decide(reduce(cpu_only(99.0)))  # busy may be loading: still no claim
    assert busy.kind == "undetermined"


# -- 4. the metrics endpoint -----------------------------------------------------------------
def test_idle_connections_are_capped_and_timed_out(monkeypatch):
    monkeypatch.setattr(serve, "CONNECTION_TIMEOUT_S", 0.5, raising=False)
    monkeypatch.setattr(serve, "MAX_CONNECTIONS", 4, raising=False)
    before = threading.active_count()
    exporter = serve.Exporter("127.0.0.1:0")
    port = exporter.server.server_port
    idle = []
    try:
        for _ in range(20):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(0.3)
        assert threading.active_count() - before <= serve.MAX_CONNECTIONS + 1
        idle[0].settimeout(5)
        assert idle[0].recv(1) == b""  # the server hung up on the silent client
        time.sleep(0.5)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as scrape:
            scrape.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            scrape.settimeout(5)
            assert scrape.recv(12).startswith(b"HTTP/1.0 200")
    finally:
        for connection in idle:
            connection.close()
        exporter.close()


@pytest.mark.parametrize("address", ["0.0.0.0:0", ":0"])
def test_serving_beyond_loopback_needs_serve_public(address):
    refused = run("--serve", address, "--", sys.executable, "-c", "raise SystemExit(9)")
    assert "--serve-public" in one_line(refused) and "command line" in one_line(refused)
    assert "--serve-public" in one_line(run("--daemon", "--serve", address))
    with serve.Exporter(address, public=True) as exporter:
        assert exporter.url.startswith("http://0.0.0.0:")
    assert "exposed" in run("--help").output.split("--serve-public")[-1]
    with serve.Exporter("localhost:0") as exporter:  # loopback needs no flag
        assert exporter.server.server_port > 0


# -- 5. a stale pid file never reaches another directory's daemon ----------------------------
def test_stop_with_a_stale_pid_file_signals_nobody(tmp_path, spawn):
    elsewhere = spawn([sys.executable, "-c", SLEEPS, "-m", "tuneup.watch.daemon",
                       "--state-dir", str(tmp_path / "other")])
    state = StateDir(tmp_path / "state")
    state.create()
    state.write_pid(elsewhere.pid)
    assert state.running_pid() is None
    assert "no daemon runs with" in run("stop", "--state-dir", str(state.path)).output
    time.sleep(0.2)
    assert elsewhere.poll() is None  # not sent SIGTERM


# -- 6. folders of watchers killed with SIGKILL ---------------------------------------------
def test_the_next_watcher_removes_the_feed_folders_of_watchers_that_are_gone():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    left = Path(tempfile.mkdtemp(prefix=f"{FEED_PREFIX}1-"))  # pid 1 runs: its lock is free
    (left / "1.json").write_text("{}")
    (left / "owner.lock").write_text("")
    alive = Path(tempfile.mkdtemp(prefix=f"{FEED_PREFIX}{gone.pid}-"))  # another namespace's
    held = owned_dirs.hold(alive / "owner.lock", create=True)  # live watcher holds its lock
    try:
        done = subprocess.run([*WATCH, "--interval", "0.2", "--", sys.executable, "-c",
                               f"import os; print(os.environ[{feed.ENV_FEED!r}])"],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert not left.exists() and alive.exists()
        used = Path(done.stdout.strip())
        assert used.name.startswith(FEED_PREFIX)
        assert used.parent == Path(tempfile.gettempdir()) and not used.exists()
    finally:
        os.close(held)
        shutil.rmtree(alive)


# -- 7. --pid: a bad pid is one line; other users' processes are no DataLoader workers ------
def test_a_negative_pid_is_a_one_line_usage_error():
    assert "--pid" in one_line(run("--pid", "-5"))


@pytest.mark.parametrize(("cmdline", "parent", "same_user"), [
    (["bash", "run.sh"], ["bash", "run.sh"], True),  # a subshell
    (["python3", "train.py"], ["python3", "train.py"], False),  # another user's fork
    (["python3", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()"],
     ["python3", "train.py"], False),
])
def test_only_the_job_user_s_python_children_are_workers(cmdline, parent, same_user):
    assert role_of(cmdline, parent, same_user) == MAIN


def test_a_shell_s_subshell_in_a_real_tree_is_no_worker(spawn):
    shell = spawn(["bash", "-c", "(sleep 30; :) & wait"])
    tree = ProcessTree(shell.pid)
    deadline = time.monotonic() + 10
    while len(tree.sample()) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    roles = {p.pid: p.role for p in tree.sample()}
    assert len(roles) >= 2 and set(roles.values()) == {MAIN}, roles


def test_an_executable_script_without_a_shebang_is_one_line(tmp_path):
    from click.testing import CliRunner

    from tuneup.cli import main

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    script.chmod(0o755)
    result = CliRunner().invoke(main, ["watch", "--", str(script)])
    assert result.exit_code == 2
    assert "Exec format error" in result.output and "python" in result.output
    assert "Traceback" not in result.output
