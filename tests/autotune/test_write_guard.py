"""Files a script writes during trials are put back, even when its process is killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tuneup.autotune import write_guard
from tuneup.autotune.put_back import restore

SCRIPT = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import torch
    from tuneup.autotune import write_guard
    user, work = Path(sys.argv[1]), Path(sys.argv[2])
    write_guard.install(work / "journal.jsonl", work / "copies", work)
    torch.save({"iter_num": 1440}, user / "ckpt.pt")            # C++ opens it: no audit event
    from safetensors.torch import save_file                      # Rust writes these
    save_file({"w": torch.zeros(2)}, user / "model.safetensors")  # over a saved model
    save_file({"w": torch.ones(2)}, filename=str(user / "adapter.safetensors"))  # a new one
    (user / "log.txt").open("a").write("trial line\\n")
    (user / "new_run").mkdir()
    (user / "new_run" / "metrics.json").write_text("{}")
    (user / "tmp.pt").write_bytes(b"x")
    os.replace(user / "tmp.pt", user / "best.pt")               # atomic save over the best
    os.remove(user / "notes.md")
    (work / "scratch.bin").write_bytes(b"work")                  # the work dir is exempt
    print("written", flush=True)
    if len(sys.argv) > 3:
        time.sleep(60)                                           # killed here
""")


def _env(work: Path) -> dict[str, str]:
    """As the runner starts a trial: its temporary folder inside the work directory."""
    (work / "tmp").mkdir(exist_ok=True)
    return {**os.environ, "TMPDIR": str(work / "tmp")}


def _user_files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"<dir>"
            for p in sorted(folder.rglob("*"))}


@pytest.fixture
def setup(tmp_path: Path):
    import torch

    user, work = tmp_path / "user", tmp_path / "work"
    user.mkdir()
    work.mkdir()
    torch.save({"iter_num": 60}, user / "ckpt.pt")
    (user / "log.txt").write_text("real line\n")
    (user / "best.pt").write_bytes(b"best weights")
    (user / "model.safetensors").write_bytes(b"the real run's model")
    (user / "notes.md").write_text("keep me")
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    return user, work, script, _user_files(user)


def test_what_a_trial_writes_is_put_back_as_it_was(setup):
    user, work, script, before = setup
    done = subprocess.run([sys.executable, str(script), str(user), str(work)],
                          capture_output=True, text=True, timeout=120, env=_env(work))
    assert done.returncode == 0, done.stderr
    assert _user_files(user) != before  # the script really changed them
    changed = restore(work / "journal.jsonl")
    assert _user_files(user) == before
    assert str(user / "ckpt.pt") in changed and str(user / "best.pt") in changed
    assert not any(str(work) in path for path in changed)


def test_a_killed_trial_is_put_back_too(setup):
    user, work, script, before = setup
    child = subprocess.Popen([sys.executable, str(script), str(user), str(work), "wait"],
                             stdout=subprocess.PIPE, text=True, env=_env(work))
    assert child.stdout.readline().strip() == "written"
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    restore(work / "journal.jsonl")
    assert _user_files(user) == before


def test_a_journal_line_cut_by_a_kill_is_ignored(tmp_path):
    journal = tmp_path / "journal.jsonl"
    kept = tmp_path / "made.txt"
    kept.write_text("x")
    journal.write_text(json.dumps({"path": str(kept), "copy": None, "existed": False})
                       + "\n" + '{"path": "/etc/pass')
    assert restore(journal) == [str(kept)]
    assert not kept.exists()


def test_remote_loggers_are_off_in_trials(tmp_path):
    env = write_guard.environment(tmp_path)
    assert env["WANDB_MODE"] == "disabled" and env["MLFLOW_TRACKING_URI"].startswith("file:")
    assert str(tmp_path) in env["MLFLOW_TRACKING_URI"]


CHECKPOINTING = textwrap.dedent("""
    import os, sys, torch
    from torch.utils.data import TensorDataset
    from tuneup import tuned_loader, tuned_loop
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
    os.makedirs(out, exist_ok=True)
    model = torch.nn.Linear(16, 1)
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.01))
    data = TensorDataset(torch.randn(512, 16), torch.randn(512, 1))
    step = 0
    for epoch in range(1000):
        for x, y in tuned_loader(data, batch_size=32, loop=loop):
            loop.train_step((x, y), lambda b: ((loop.model(b[0]) - b[1]) ** 2).mean())
            step += 1
            if step % 20 == 0:  # nanoGPT-style: eval and checkpoint inside the loop
                torch.save({"iter_num": step}, os.path.join(out, "ckpt.pt"))
                with open(os.path.join(out, "log.txt"), "a") as log:
                    log.write(f"{step}\\n")
""")


@pytest.mark.slow
def test_autotune_leaves_a_checkpointing_scripts_files_as_they_were(tmp_path, budget_for_load):
    """nanoGPT's in-loop checkpoint was overwritten by a trial's (iter_num 60 became 1440)."""
    import torch

    script = tmp_path / "train.py"
    script.write_text(CHECKPOINTING)
    out = tmp_path / "out"
    out.mkdir()
    torch.save({"iter_num": 60}, out / "ckpt.pt")
    (out / "log.txt").write_text("the real run's log\n")
    before = _user_files(out)
    done = subprocess.run([sys.executable, "-m", "tuneup.cli", "autotune", str(script),
                           "--budget", str(budget_for_load(30)), "--only", "threads",
                           "--format", "json",
                           "--output", str(tmp_path / "s.json")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert _user_files(out) == before and torch.load(out / "ckpt.pt")["iter_num"] == 60
    notes = json.loads(done.stdout[:done.stdout.rindex("}") + 1])["notes"]
    assert any("put back as it was" in note and "ckpt.pt" in note for note in notes)


FOLDERS = textwrap.dedent("""
    import os, shutil, sys
    from pathlib import Path
    from tuneup.autotune import write_guard
    user, work = Path(sys.argv[1]), Path(sys.argv[2])
    write_guard.install(work / "journal.jsonl", work / "copies", work)
    shutil.rmtree(user / "runs")                                  # a whole folder removed
    os.rename(user / "ckpt_dir", user / "ckpt_dir.old")           # a folder moved whole
    os.symlink(user / "notes.md", user / "latest")                # a link made
    if os.fork() == 0:                                            # a forked worker writes too
        (user / "notes.md").write_text("worker")
        os._exit(0)
    os.wait()
    (user / "notes.md").write_text("main")
""")


def test_removed_and_moved_folders_and_a_forks_writes_are_put_back(tmp_path):
    user, work = tmp_path / "user", tmp_path / "work"
    (user / "runs" / "a").mkdir(parents=True)
    (user / "runs" / "a" / "events.log").write_text("event 1\n")
    (user / "runs" / "top.txt").write_text("top")
    (user / "ckpt_dir").mkdir()
    (user / "ckpt_dir" / "model.pt").write_bytes(b"weights")
    (user / "notes.md").write_text("keep me")
    work.mkdir()
    before = _user_files(user)
    script = tmp_path / "script.py"
    script.write_text(FOLDERS)
    done = subprocess.run([sys.executable, str(script), str(user), str(work)],
                          capture_output=True, text=True, timeout=120, env=_env(work))
    assert done.returncode == 0, done.stderr
    assert _user_files(user) != before
    restore(work / "journal.jsonl")
    assert _user_files(user) == before


def _state(folder: Path) -> dict[str, tuple]:
    """Everything a restore must bring back: kind, bytes or link target, mode, owner, mtime,
    and which names share an inode."""
    inodes: dict[int, str] = {}
    state = {}
    for path in sorted(folder.rglob("*")):
        status = path.lstat()
        name = str(path.relative_to(folder))
        if path.is_symlink():
            state[name] = ("link", os.readlink(path))
        elif path.is_dir():
            state[name] = ("dir", status.st_mode)
        else:
            first = inodes.setdefault(status.st_ino, name)
            state[name] = ("file", path.read_bytes(), status.st_mode, status.st_uid,
                           status.st_mtime_ns, first)
    return state


LINKS = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from tuneup.autotune import write_guard
    user, work = Path(sys.argv[1]), Path(sys.argv[2])
    write_guard.install(work / "journal.jsonl", work / "copies", work)
    os.remove(user / "latest")                                   # the "latest checkpoint" link
    os.symlink("ckpt-2.pt", user / "latest")                     # now points elsewhere
    (user / "ckpt-2.pt").write_bytes(b"trial")
    os.symlink("ckpt-1.pt", user / "best.tmp")
    os.replace(user / "best.tmp", user / "best")                 # a link over a link
    (user / "tmp").write_bytes(b"file")
    os.replace(user / "tmp", user / "kept-link")                 # a file over a link
    with open(user / "data.bin", "r+b") as data:                 # in place: its hard link sees it
        data.write(b"TRIAL")
    os.chmod(user / "secret.key", 0o777)                         # 0600 left 0777
    os.chmod(user / "data-link", 0o600)                          # through a link: its target
    os.utime(user / "ckpt-1.pt", (1, 1))
    os.chmod(user / "ckpt-1.pt", 0o444)
""")


def test_links_hard_links_modes_and_times_come_back_as_they_were(tmp_path):
    user, work = tmp_path / "user", tmp_path / "work"
    user.mkdir()
    work.mkdir()
    (user / "ckpt-1.pt").write_bytes(b"epoch 1")
    os.symlink("ckpt-1.pt", user / "latest")
    os.symlink("ckpt-1.pt", user / "best")
    os.symlink("ckpt-1.pt", user / "kept-link")
    (user / "data.bin").write_bytes(b"original data")
    (user / "dvc-cache").mkdir()
    os.link(user / "data.bin", user / "dvc-cache" / "ab12")
    os.symlink("data.bin", user / "data-link")
    (user / "secret.key").write_text("key")
    os.chmod(user / "secret.key", 0o600)
    before = _state(user)
    script = tmp_path / "script.py"
    script.write_text(LINKS)
    done = subprocess.run([sys.executable, str(script), str(user), str(work)],
                          capture_output=True, text=True, timeout=60, env=_env(work))
    assert done.returncode == 0, done.stderr
    assert _state(user) != before
    changed = restore(work / "journal.jsonl")
    assert _state(user) == before
    assert (user / "dvc-cache" / "ab12").read_bytes() == b"original data"
    assert str(user / "latest") in changed and str(user / "secret.key") in changed


HIDDEN_WRITERS = textwrap.dedent("""
    import os, sqlite3, sys
    from pathlib import Path
    import torch
    from tuneup.autotune import write_guard
    user, work = Path(sys.argv[1]), Path(sys.argv[2])
    write_guard.install(work / "journal.jsonl", work / "copies", work)
    model = torch.jit.script(torch.nn.Linear(2, 2))
    torch.jit.save(model, str(user / "scripted.pt"))            # C++ writes it
    model.save(str(user / "module.pt"))                           # ScriptModule.save
    torch.serialization.save({"step": 9}, user / "ckpt.pt")      # torch.save's original
    with sqlite3.connect(user / "runs.db") as db:                 # and its -journal
        db.execute("insert into runs values ('trial')")
    db.close()
    folder = os.open(user / "sub", os.O_RDONLY)
    fd = os.open("state.json", os.O_WRONLY | os.O_TRUNC, dir_fd=folder)  # relative to a folder
    os.write(fd, b"trial")
    os.close(fd)
    fd = os.open("made.json", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=folder)
    os.close(fd)
""")


def test_writers_the_audit_hook_does_not_see_are_put_back(tmp_path):
    import sqlite3

    import torch

    user, work = tmp_path / "user", tmp_path / "work"
    (user / "sub").mkdir(parents=True)
    work.mkdir()
    torch.save({"step": 1}, user / "ckpt.pt")
    (user / "scripted.pt").write_bytes(b"real scripted")
    (user / "module.pt").write_bytes(b"real module")
    with sqlite3.connect(user / "runs.db") as db:
        db.execute("create table runs (name text)")
        db.execute("insert into runs values ('real')")
    db.close()
    (user / "sub" / "state.json").write_text("real")
    (tmp_path / "cwd").mkdir()
    (tmp_path / "cwd" / "state.json").write_text("not the one written")
    before = _state(user)
    script = tmp_path / "script.py"
    script.write_text(HIDDEN_WRITERS)
    done = subprocess.run([sys.executable, str(script), str(user), str(work)], cwd=tmp_path / "cwd",
                          capture_output=True, text=True, timeout=120, env=_env(work))
    assert done.returncode == 0, done.stderr
    assert _state(user) != before
    restore(work / "journal.jsonl")
    assert _state(user) == before


VENV_PROJECT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from tuneup.autotune import write_guard
    work = Path(sys.argv[1])
    write_guard.install(work / "journal.jsonl", work / "copies", work)
    (Path(sys.prefix) / "ckpt.pt").write_bytes(b"trial")         # the project is the venv
""")


def test_a_project_that_is_its_own_virtualenv_is_guarded(tmp_path):
    project, work = tmp_path / "project", tmp_path / "work"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(project)], check=True,
                   timeout=60)
    work.mkdir()
    (project / "ckpt.pt").write_bytes(b"real")
    script = project / "train.py"
    script.write_text(VENV_PROJECT)
    source = str(Path(write_guard.__file__).parents[2])
    done = subprocess.run([str(project / "bin" / "python"), str(script), str(work)],
                          capture_output=True, text=True, timeout=60,
                          env={**_env(work), "PYTHONPATH": source})
    assert done.returncode == 0, done.stderr
    restore(work / "journal.jsonl")
    assert (project / "ckpt.pt").read_bytes() == b"real"


def test_only_the_interpreters_library_folders_are_exempt(tmp_path):
    import sysconfig

    exempt = {str(p) for p in write_guard.exempt_folders(tmp_path, None)}
    assert sys.prefix not in exempt and sysconfig.get_paths()["purelib"] in exempt
    inside = Path(sysconfig.get_paths()["purelib"]) / "app"  # a script kept in site-packages
    kept = map(str, write_guard.exempt_folders(tmp_path, inside))
    assert sysconfig.get_paths()["purelib"] not in kept


UNSEEN = textwrap.dedent("""
    import os, subprocess, sys
    here = os.path.dirname(os.path.abspath(__file__))
    subprocess.run(["sh", "-c", "printf trial > small.txt; printf trial > big.bin; "
                    "printf new > made.txt; mkdir -p new/deep; printf x > new/deep/f; "
                    "rm gone.txt; chmod 777 secret.key; ln -sfn small.txt latest; "
                    "printf trial > $1/result.txt; printf new > $1/extra.txt", "sh", sys.argv[2]],
                   cwd=here, check=True)                         # a process the hook never sees
""")


def test_what_no_hook_sees_is_compared_with_the_folders_before_trials(fake_script, tmp_path,
                                                                     monkeypatch):
    """A spawned program (or any native writer) changes the script's folder and one its
    arguments name: small files come back from the copies kept before the first trial, a
    big one is named as not put back."""
    from tuneup.autotune import snapshot
    from tuneup.autotune.runner import Runner
    from tuneup.autotune.trials import Trial
    from tuneup.settings import Knobs

    folder, outside = tmp_path / "src", tmp_path / "results"
    folder.mkdir()
    outside.mkdir()
    (outside / "result.txt").write_text("real result")
    script = fake_script(name="src/train.py")
    script.write_text(UNSEEN + script.read_text())
    (folder / "small.txt").write_text("real")
    (folder / "big.bin").write_bytes(b"B" * 64)
    (folder / "gone.txt").write_text("keep me")
    (folder / "secret.key").write_text("key")
    os.chmod(folder / "secret.key", 0o600)
    os.symlink("gone.txt", folder / "latest")
    before, elsewhere = _state(folder), _state(outside)
    monkeypatch.setattr(snapshot, "MAX_FILE_BYTES", 32)  # big.bin is too big to copy up front
    with Runner(script, ["--out", str(outside)]) as runner:
        results = runner.run([Trial("a", Knobs(num_workers=0), False)])
        assert [r.status for r in results] == ["ok"]
    after = _state(folder)
    assert after.pop("big.bin")[1] == b"trial"
    before.pop("big.bin")
    assert after == before and _state(outside) == elsewhere
    assert runner.not_put_back == [str(folder / "big.bin")]
    assert {str(folder / name) for name in ("small.txt", "made.txt", "new", "gone.txt",
                                           "secret.key", "latest")} <= set(runner.put_back)
    kept = runner.folder_snapshot.aside  # what was found is set aside, not lost
    found = {str(p.relative_to(kept)): p for p in kept.rglob("*") if not p.is_dir()}
    assert found[str(folder / "small.txt").lstrip("/")].read_text() == "trial"
    assert found[str(folder / "made.txt").lstrip("/")].read_text() == "new"
    assert os.readlink(found[str(folder / "latest").lstrip("/")]) == "small.txt"
    assert str(outside / "extra.txt").lstrip("/") in found


def test_a_users_edit_during_a_trial_is_kept_aside_and_named(tmp_path, monkeypatch):
    """Anyone's change while a trial ran is put back to the version before it (a trial's
    unseen writer cannot be told from an editor's save), but the version found is kept and
    the note says where; past the run's bound a change is left as it is, not dropped."""
    from tuneup.autotune import snapshot
    from tuneup.autotune.leftovers import Recovered, file_notes

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    project = tmp_path / "project"
    project.mkdir()
    (project / "model.py").write_text("before")
    (project / "data.bin").write_bytes(b"D" * 50)
    record = snapshot.FolderSnapshot.take([project], tmp_path / "run-1" / "snapshot")
    started = time.time()
    (project / "model.py").write_text("the user's edit")
    (project / "notes.md").write_text("written during the run")
    (project / "data.bin").write_bytes(b"E" * 50)
    monkeypatch.setattr(snapshot, "SET_ASIDE_BYTES", 40)  # room for model.py and notes.md
    compared = record.compare_and_put_back(since=started - 1.0)
    assert (project / "model.py").read_text() == "before"
    assert not (project / "notes.md").exists()
    kept = tmp_path / "state" / "tuneup" / "set-aside" / "run-1"
    assert record.aside == kept
    assert (kept / str(project / "model.py").lstrip("/")).read_text() == "the user's edit"
    assert (kept / str(project / "notes.md").lstrip("/")).read_text() == "written during the run"
    assert (project / "data.bin").read_bytes() == b"E" * 50  # past the bound: left, named
    assert compared.not_put_back == [str(project / "data.bin")]
    notes = file_notes(compared.put_back, compared.not_put_back, record, Recovered())
    assert any(str(kept) in note and "model.py" in note for note in notes)


def test_the_folders_recorded_are_the_users_not_home_or_shared_ones(tmp_path, monkeypatch):
    from tuneup.autotune.snapshot import named_folders, user_folders

    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "ckpts").mkdir()
    (project / "ckpts" / "last.pt").write_bytes(b"w")
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(project)  # cd project; python src/train.py --ckpt=ckpts/last.pt ...
    named = named_folders(project / "src" / "train.py",
                          ["--ckpt=ckpts/last.pt", "--out", str(tmp_path / "runs"), "3"])
    assert user_folders(named) == [str(project), str(tmp_path / "runs")]
    assert user_folders([Path("/"), Path.home(), Path("/tmp")]) == []  # /tmp: world-writable


def test_a_path_that_cannot_be_put_back_is_named_not_claimed(tmp_path, monkeypatch):
    """The note said "each was put back as it was" also for a path whose put-back failed."""
    from tuneup.autotune import put_back

    kept, copy = tmp_path / "ckpt.pt", tmp_path / "copy"
    kept.write_text("trial")
    copy.write_text("real")
    journal = tmp_path / "journal.jsonl"
    journal.write_text(json.dumps({"path": str(kept), "copy": str(copy), "existed": True}) + "\n")

    def unwritable(source, path):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(put_back, "copy_atomic", unwritable)
    left: list[str] = []
    assert restore(journal, None, left) == [] and left == [str(kept)]


def test_a_trial_killed_by_the_watchdog_still_counts_as_guarded(fake_script):
    from tuneup.autotune.runner import Runner
    from tuneup.autotune.trials import Trial
    from tuneup.settings import Knobs

    with Runner(fake_script({"a": "hang"}), timeout=1.0) as runner:
        (result,) = runner.run([Trial("a", Knobs(), False)])
    assert result.status == "hang" and runner.unguarded == 0


OTHER_USERS = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from tuneup.autotune import write_guard
    user, work = Path(sys.argv[1]), Path(sys.argv[2])
    write_guard.install(work / "journal.jsonl", work / "copies", work)
    (user / "ckpt.tmp").write_bytes(b"trial")
    os.replace(user / "ckpt.tmp", user / "ckpt.pt")              # a new file, root's
    os.remove(user / "runs" / "log.txt")
    os.rmdir(user / "runs")
""")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving files to another user needs root")
def test_root_tuning_another_users_script_gives_her_files_back_to_her(tmp_path):
    """Restored as root's, her next torch.save into them failed."""
    user, work = tmp_path / "user", tmp_path / "work"
    (user / "runs").mkdir(parents=True)
    work.mkdir()
    (user / "ckpt.pt").write_bytes(b"hers")
    (user / "runs" / "log.txt").write_text("her log")
    for path in (user / "ckpt.pt", user / "runs", user / "runs" / "log.txt"):
        os.chown(path, 4321, 4321)
    before = _state(user)
    script = tmp_path / "script.py"
    script.write_text(OTHER_USERS)
    done = subprocess.run([sys.executable, str(script), str(user), str(work)],
                          capture_output=True, text=True, timeout=60, env=_env(work))
    assert done.returncode == 0, done.stderr
    restore(work / "journal.jsonl")
    assert _state(user) == before
    assert {p.stat().st_uid for p in user.rglob("*")} == {4321}


def test_a_lost_copy_leaves_that_file_named_and_the_rest_put_back(tmp_path):
    """One copy gone (a full disk, a cleaner): that file is named as not put back, and the
    compare goes on with the others instead of stopping with a traceback."""
    from tuneup.autotune import snapshot

    project = tmp_path / "project"
    project.mkdir()
    (project / "a.txt").write_text("a before")
    (project / "b.txt").write_text("b before")
    record = snapshot.FolderSnapshot.take([project], tmp_path / "run-2" / "snapshot")
    started = time.time()
    (project / "a.txt").write_text("a trial")
    (project / "b.txt").write_text("b trial")
    os.unlink(record.entries[str(project / "a.txt")]["copy"])
    compared = record.compare_and_put_back(since=started - 1.0)
    assert compared.not_put_back == [str(project / "a.txt")]
    assert (project / "b.txt").read_text() == "b before"


def test_a_compile_cache_the_user_points_elsewhere_is_exempt(tmp_path, monkeypatch):
    """A trial's compiled code in the user's TORCHINDUCTOR_CACHE_DIR changes no result and
    warms the real run: it is neither journaled nor put back (the bench's own cache under
    /tmp was emptied after every autotune, with 16 folders named 'could NOT be put back')."""
    cache, triton = tmp_path / "inductor", tmp_path / "triton"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(triton))
    exempt = set(write_guard.exempt_folders(tmp_path / "work", None))
    assert cache in exempt and triton in exempt
    # never where the script lives
    assert cache not in set(write_guard.exempt_folders(tmp_path / "work", cache / "project"))
