"""What `tuneup autotune` leaves behind: after SIGTERM, SIGHUP or Ctrl-C no process and no
file; after a SIGKILL of the parent the child ends itself and the next run sweeps the work
directory; DataLoader workers leave no pymp-* directory; a result that cannot be written is
printed and kept."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tuneup.autotune.runner import WORKDIR_PREFIX, sweep_stale_workdirs

REAL_SCRIPT = textwrap.dedent('''
    import torch
    from torch.utils.data import TensorDataset
    from tuneup import tuned_loader, tuned_loop

    x = torch.randn(256, 8)
    dataset = TensorDataset(x, (x[:, 0] > 0).long())
    model = torch.nn.Linear(8, 2)
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
    loader = tuned_loader(dataset, batch_size=32, num_workers=1)  # workers: pymp-* dirs
    for epoch in range(10**6):
        for batch in loader:
            loop.train_step(batch, lambda b: torch.nn.functional.cross_entropy(loop.model(b[0]), b[1]))
''')


def start(script: Path, tmp: Path, *extra: str, budget: int = 300) -> subprocess.Popen:
    env = {**os.environ, "TMPDIR": str(tmp)}
    env.pop("TUNEUP_SETTINGS", None)
    return subprocess.Popen([sys.executable, "-m", "tuneup.cli", "autotune", str(script),
                             "--budget", str(budget), "--output", str(tmp.parent / "out.json"),
                             *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=as_in_a_terminal)


def as_in_a_terminal() -> None:
    """Ctrl-C's default action, as a terminal's foreground job has it: a suite started in
    the background (``pytest &`` in a script) passes SIGINT on ignored, and Python then
    leaves it ignored, so the run would never see the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def ended(parent: subprocess.Popen, children: list[psutil.Process], timeout: float) -> str:
    """The run's stderr once it ends; one still running after ``timeout`` fails the test
    and is killed with its children first (left alive, the next tests would count them as
    their own leftovers)."""
    try:
        return parent.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        for process in [*children, psutil.Process(parent.pid)]:
            with contextlib.suppress(psutil.Error):
                process.kill()
        parent.communicate()
        raise AssertionError(f"the run did not end within {timeout:.0f} s of the signal")


def wait_for_child(parent: subprocess.Popen, timeout: float = 60.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = psutil.Process(parent.pid).children(recursive=True)
        if children:
            time.sleep(1.0)  # let it reach its trials
            return psutil.Process(parent.pid).children(recursive=True)
        time.sleep(0.1)
    raise AssertionError("the child never started")


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    gone, still = psutil.wait_procs(processes, timeout=10)
    return [p for p in still if p.status() != psutil.STATUS_ZOMBIE]


@pytest.fixture
def tmp() -> Iterator[Path]:
    """The runs' TMPDIR, short: a test's own tmp_path is too long for multiprocessing's
    sockets under a trial's folder (tuneup/autotune/scratch.py); its parent holds the rest."""
    base = Path(tempfile.mkdtemp(prefix="tu-", dir="/tmp" if os.path.isdir("/tmp") else None))
    folder = base / "tmp"
    folder.mkdir()
    yield folder
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_stop_signal_leaves_no_process_and_no_file(fake_script, tmp, signum):
    (tmp.parent / "out.json").write_text("old settings\n")
    parent = start(fake_script({"*": "hang", "defaults": "hang"}), tmp)
    children = wait_for_child(parent)
    parent.send_signal(signum)
    err = ended(parent, children, timeout=60)
    assert parent.returncode == 128 + signum
    assert err.strip().splitlines()[-1].startswith("tuneup autotune: ")
    assert "left as it was" in err and "Traceback" not in err
    assert alive(children) == []
    assert list(tmp.iterdir()) == []
    assert (tmp.parent / "out.json").read_text() == "old settings\n"


CHECKPOINTING = REAL_SCRIPT.replace("""        loop.train_step""", """        import subprocess
        torch.save({"trial": epoch}, "ckpt.pt")                   # the journal sees this
        subprocess.run(["sh", "-c", "printf trial > notes.txt"])  # the snapshot, this
        loop.train_step""")


@pytest.mark.slow
def test_a_killed_parent_takes_its_child_along_and_what_it_wrote_is_put_back(tmp):
    """SIGKILL mid-trial: the trial dies with the run, and the run's sentinel puts the user's
    files back byte for byte before it removes the work directory."""
    import torch

    project = tmp.parent / "project"
    project.mkdir()
    script = project / "train.py"
    script.write_text(CHECKPOINTING)
    torch.save({"real": 60}, project / "ckpt.pt")
    (project / "notes.txt").write_text("keep me")
    before = {p.name: p.read_bytes() for p in project.iterdir()}
    env = {**os.environ, "TMPDIR": str(tmp)}
    env.pop("TUNEUP_SETTINGS", None)
    parent = subprocess.Popen([sys.executable, "-m", "tuneup.cli", "autotune", str(script),
                               "--budget", "300", "--output", str(tmp.parent / "out.json")],
                              cwd=project, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180  # a start-up with torch, on a loaded machine
    while (project / "notes.txt").read_bytes() == before["notes.txt"]:  # mid-trial
        assert time.monotonic() < deadline and parent.poll() is None, "no trial wrote"
        time.sleep(0.1)
    children = psutil.Process(parent.pid).children(recursive=True)
    parent.kill()
    parent.wait()
    assert alive(children) == []  # the trial had a parent-death signal; the sentinel ended
    assert list(tmp.iterdir()) == []  # the sentinel removed the work directory
    assert {p.name: p.read_bytes() for p in project.iterdir()} == before


@pytest.mark.slow
def test_a_finished_run_leaves_nothing_in_tmpdir(tmp):
    script = tmp.parent / "train.py"
    script.write_text(REAL_SCRIPT)
    parent = start(script, tmp, "--only", "threads", "--format", "json", budget=25)
    parent.communicate(timeout=600)
    assert list(tmp.iterdir()) == []  # no pymp-*, no work directory


def test_a_result_that_cannot_be_written_is_printed_and_kept(fake_script, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from tuneup.cli import main
    from tuneup.settings import store

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    real_save = store.save

    def full_disk(settings, path):
        if Path(path).name == "out.json":
            raise OSError(28, "No space left on device")
        real_save(settings, path)

    monkeypatch.setattr("tuneup.autotune.command.save", full_disk)
    result = CliRunner().invoke(main, ["autotune", str(fake_script()), "--budget", "30",
                                       "--format", "json", "--output", str(tmp_path / "out.json")])
    assert result.exit_code == 1
    summary = json.loads(result.stdout[:result.stdout.rindex("}") + 1])
    assert "No space left on device" in summary["error"]
    kept = Path(summary["settings"])
    assert kept.exists() and kept.parent == tmp_path and json.loads(kept.read_text())["knobs"]


# -- liveness by a lock the owner holds, and the dead run's journal replayed first -----------
HOLDER = textwrap.dedent("""
    import fcntl, os, sys, time
    folder = sys.argv[1]
    os.makedirs(folder)
    fd = os.open(os.path.join(folder, "owner.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)  # as a live run in another pid namespace holds it
    print("held", flush=True)
    time.sleep(60)
""")


def _dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


def test_a_live_run_of_another_pid_namespace_keeps_its_work_folder(tmp, monkeypatch):
    """Its folder's name gives a pid this namespace does not see: the lock says it lives."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    live = tmp / f"{WORKDIR_PREFIX}{_dead_pid()}-abc"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(live)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        (live / "writes-1.jsonl").write_text("")
        assert sweep_stale_workdirs() == [] and (live / "writes-1.jsonl").exists()
    finally:
        holder.kill()
        holder.wait()
    assert sweep_stale_workdirs() == [live]  # its owner gone, the lock is free


def test_two_runs_sharing_tmpdir_the_live_one_is_untouched(tmp, monkeypatch, fake_script):
    """As across containers sharing /tmp: neither run can see the other's pid."""
    from tuneup.autotune.runner import Runner

    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setattr("tuneup.autotune.protocol.alive", lambda pid: False)
    with Runner(fake_script()) as first:
        folder = first._workdir
        (folder / "writes-1.jsonl").write_text("")
        with Runner(fake_script()) as second:  # its start sweeps
            assert folder.exists() and (folder / "writes-1.jsonl").exists()
            assert second._workdir != folder
    assert list(tmp.iterdir()) == []


def test_a_dead_runs_folder_is_swept_whatever_pid_its_name_holds(tmp, monkeypatch):
    """A run that was pid 1 in its namespace named its folder ``-1-``; pid 1 always runs."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    dead = tmp / f"{WORKDIR_PREFIX}1-xyz"
    dead.mkdir()
    (dead / "owner.lock").write_text("")
    unlocked = tmp / f"{WORKDIR_PREFIX}other"  # no lock file: not ours to judge, left
    unlocked.mkdir()
    assert sweep_stale_workdirs() == [dead]
    assert unlocked.exists()


KILLED_MID_TRIAL = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from tuneup import owned_dirs
    from tuneup.autotune import write_guard
    user = Path(sys.argv[1])
    work = owned_dirs.OwnedDir("tuneup-autotune-").path        # as the runner makes it
    write_guard.install(work / "writes-1.jsonl", work / "writes-1.copies", work)
    (user / "ckpt.pt").write_bytes(b"trial weights")
    (user / "new.log").write_text("trial")
    os.remove(user / "notes.md")
    print("written", flush=True)
    time.sleep(60)                                              # SIGKILLed here
""")


def kill_mid_trial(user: Path, tmp: Path) -> None:
    """A run whose trial has written in ``user``'s folder, SIGKILLed there."""
    owner = subprocess.Popen([sys.executable, "-c", KILLED_MID_TRIAL, str(user)],
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "TMPDIR": str(tmp)})
    assert owner.stdout.readline().strip() == "written"
    owner.kill()
    owner.wait()


def test_after_a_sigkill_the_next_start_puts_files_back_before_it_removes_the_folder(
        tmp, monkeypatch):
    user = tmp.parent / "user"
    user.mkdir()
    (user / "ckpt.pt").write_bytes(b"\x00real weights\xff" * 1000)
    (user / "notes.md").write_text("keep me")
    before = {p.name: p.read_bytes() for p in user.iterdir()}
    kill_mid_trial(user, tmp)
    assert (user / "ckpt.pt").read_bytes() == b"trial weights"
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    assert len(sweep_stale_workdirs()) == 1
    assert {p.name: p.read_bytes() for p in user.iterdir()} == before
    assert list(tmp.iterdir()) == []


def test_what_changed_after_a_dead_run_ended_is_not_put_back_over(tmp, monkeypatch):
    """The user's own work since the killed run (a real training run's checkpoint) stays."""
    from tuneup.autotune.runner import Recovered

    user = tmp.parent / "user"
    user.mkdir()
    (user / "ckpt.pt").write_bytes(b"real weights")
    (user / "notes.md").write_text("keep me")
    kill_mid_trial(user, tmp)
    (folder,) = tmp.glob(f"{WORKDIR_PREFIX}*")
    os.utime(folder / "owner.lock", (time.time() - 600, time.time() - 600))  # it died long ago
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    recovered = Recovered()
    assert sweep_stale_workdirs(recovered) == [folder]
    assert (user / "ckpt.pt").read_bytes() == b"trial weights"  # changed after its last beat
    assert recovered.left == sorted(str(user / name) for name in ("ckpt.pt", "new.log"))
    assert (user / "notes.md").read_text() == "keep me"
    assert recovered.put_back == [str(user / "notes.md")]


def test_a_temp_folder_without_locks_is_kept_by_its_owner_and_never_swept(tmp, monkeypatch):
    """flock unsupported (a FUSE mount): the run still starts, and no sweep judges it."""
    import errno
    import fcntl

    from tuneup import owned_dirs

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setattr(fcntl, "flock", no_locks)
    owned = owned_dirs.OwnedDir(WORKDIR_PREFIX)
    try:
        assert sweep_stale_workdirs() == [] and owned.path.exists()
    finally:
        owned.release()
    assert sweep_stale_workdirs() == []  # dead or not: it cannot be told


def test_a_trial_tmpdir_too_long_for_a_unix_socket_is_not_made(tmp_path):
    """Under a long TMPDIR, multiprocessing's socket under the trial's folder cannot be bound
    (a DataLoader worker's batch is then lost, and the loop waits forever): the trials keep
    the user's TMPDIR there."""
    from tuneup.autotune.scratch import PYMP_SOCKET, UNIX_SOCKET_PATH_MAX, trial_tmpdir

    short = Path(tempfile.mkdtemp(prefix="tu-", dir="/tmp" if os.path.isdir("/tmp") else None))
    try:
        assert trial_tmpdir(short) == short / "tmp" and (short / "tmp").is_dir()
    finally:
        shutil.rmtree(short)
    long = tmp_path / ("w" * max(1, UNIX_SOCKET_PATH_MAX - PYMP_SOCKET - len(str(tmp_path))))
    long.mkdir()
    assert trial_tmpdir(long) is None and not (long / "tmp").exists()
