"""Autotune's own output, redirected into the script's folder (`tuneup autotune train.py >
tune.log 2>&1`, run where the script lives), is autotune's, not the trials': the folder
compare after each trial must not put it back. It did: the file was cut back to its size
before the first trial while autotune kept writing at its offset, so the progress lines were
lost and the file began with a run of NUL bytes (seen on minGPT's chargpt, 2026-11-28)."""

from __future__ import annotations

import os
from pathlib import Path

from tuneup.autotune.runner import Runner
from tuneup.autotune.trials import Trial
from tuneup.settings import Knobs


def test_autotunes_redirected_output_in_the_scripts_folder_is_left_alone(fake_script,
                                                                         tmp_path: Path):
    script = fake_script(name="train.py")
    log = tmp_path / "tune.log"
    with open(log, "wb") as out:  # the shell's `> tune.log 2>&1`
        out.write(b"before\n")
        out.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        try:
            with Runner(script, []) as runner:
                for trial in ("a", "b"):
                    assert [r.status for r in runner.run([Trial(trial, Knobs(), False)])] == ["ok"]
                    os.write(1, f"[{trial}] ok\n".encode())  # autotune's progress line
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    text = log.read_bytes()
    assert b"\0" not in text
    assert text.startswith(b"before\n") and text.endswith(b"[a] ok\n[b] ok\n")
    assert str(log) not in runner.put_back
