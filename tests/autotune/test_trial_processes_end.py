"""Every process started under a trial ends with it, detached ones included; and a script
that never reaches a training step is told what is really missing."""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tuneup.autotune import snapshot
from tuneup.autotune.runner import Runner
from tuneup.autotune.trials import Trial
from tuneup.errors import ScriptError
from tuneup.settings import Knobs

# before the stand-in child runs its trials: one process detached by a double fork (its
# parent exits, so it is reparented out of the script's tree) and one in a session of its own
DETACH = textwrap.dedent('''
    import os, subprocess, sys
    PIDS = {pids!r}
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open(PIDS, "a") as pids:
                print(os.getpid(), file=pids)
            os.execvp("sleep", ["sleep", "600"])
        os._exit(0)
    os.wait()
    with open(PIDS, "a") as pids:
        print(subprocess.Popen(["sleep", "600"], start_new_session=True).pid, file=pids)
''')


def running(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (a zombie has ended)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            continue
    return alive


def test_processes_the_script_detaches_end_with_its_trial_process(fake_script, tmp_path,
                                                                 monkeypatch):
    # the pids file is a file the script writes: the write guard would put it back (remove it)
    monkeypatch.setattr("tuneup.autotune.runner.restore", lambda journal, *_: [])
    monkeypatch.setattr("tuneup.autotune.snapshot.FolderSnapshot.compare_and_put_back",
                        lambda self, **_: snapshot.Comparison())  # nor the folder compare
    pids = tmp_path / "detached.pids"
    script = fake_script()
    script.write_text(DETACH.format(pids=str(pids)) + script.read_text())
    with Runner(script) as runner:
        (result,) = runner.run([Trial("defaults", Knobs())])
        assert result.ok
    started = [int(line) for line in pids.read_text().split()]
    assert len(started) == 2
    try:
        assert running(started) == []
    finally:  # on failure, not left to the machine
        for pid in running(started):
            os.kill(pid, 9)


def never_started(tmp_path: Path, text: str, **runner: float) -> str:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(text))
    with Runner(script, **runner) as tuner, pytest.raises(ScriptError) as error:
        tuner.run([Trial("defaults", Knobs())])
    return str(error.value)


@pytest.mark.slow
def test_a_script_without_the_loop_is_told_the_loop_is_missing(tmp_path):
    """It called tuned_loader and iterated it: the message once said it never called
    tuned_loader."""
    message = never_started(tmp_path, '''
        import torch
        from tuneup import tuned_loader
        data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.zeros(64))
        for x, y in tuned_loader(data, batch_size=16):
            pass
    ''')
    assert message == ("train.py: the script never called tuned_loop(model, optimizer), nor "
                       "tuned_trainer / tuned_trainer_kwargs for a Trainer — see docs/autotune.md")


def test_a_start_up_without_a_step_is_not_said_to_skip_the_wrappers(tmp_path):
    started = time.monotonic()
    message = never_started(tmp_path, "import time\ntime.sleep(600)\n", startup_timeout=1.0)
    assert "never called" not in message and time.monotonic() - started < 30
    assert message.startswith("train.py reached no training step within 1 s of starting: it "
                              "is stuck before its training loop, or its start-up")
