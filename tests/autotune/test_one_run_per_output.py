"""Two autotunes of one settings file: the second refuses in one line naming the first,
instead of both saying "settings written" and the last silently winning."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from click.testing import CliRunner

from tuneup.cli import main


def invoke(script, output, *extra: str):
    return CliRunner().invoke(main, ["autotune", str(script), "--budget", "30", "--only",
                                     "threads", "--output", str(output), *extra])


def test_a_second_run_for_the_same_output_refuses_naming_the_first(fake_script, tmp_path):
    script = fake_script({"defaults": "slow", "*": "slow"})
    output = tmp_path / "train.tuneup.json"
    first = subprocess.Popen([sys.executable, "-m", "tuneup.cli", "autotune", str(script),
                              "--budget", "30", "--only", "threads", "--output", str(output)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock = tmp_path / "train.tuneup.json.lock"
    deadline = time.monotonic() + 30
    while not (lock.exists() and lock.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    second = invoke(script, output)
    first_out, first_err = first.communicate(timeout=120)
    assert first.returncode == 0, first_err
    assert second.exit_code == 1
    lines = second.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in second.output
    assert lines[0].startswith(f"tuneup autotune: another tuneup autotune (pid {first.pid}, "
                               f"{script}, started ")
    assert lines[0].endswith(f"is writing {output}: wait for it to finish, or choose another "
                             "--output")
    assert "settings written" not in second.output and "settings written" in first_out
    assert not lock.exists()  # the first removed it as it ended
    lock.write_text("pid 1, train.py, started long ago")  # as a killed run leaves it: no flock
    assert invoke(script, output).exit_code == 0  # the next run goes ahead


def test_a_link_planted_at_the_lock_path_is_not_followed(fake_script, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    output = tmp_path / "train.tuneup.json"
    os.symlink(victim, tmp_path / "train.tuneup.json.lock")
    result = invoke(fake_script(), output)
    assert result.exit_code == 1
    assert result.output.strip() == (f"tuneup autotune: cannot lock {tmp_path}/train.tuneup.json"
                                     ".lock (a symbolic link): remove it or choose another "
                                     "--output")
    assert victim.read_text() == "precious\n" and not output.exists()
