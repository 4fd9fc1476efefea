"""The settings file on a shared machine: no write through a planted link, no guessable copy."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from click.testing import CliRunner

from tuneup.cli import main


def test_a_planted_link_at_the_settings_path_is_refused_and_a_fresh_copy_kept(
        fake_script, tmp_path, monkeypatch):
    shared_tmp = tmp_path / "tmp"
    shared_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(shared_tmp))
    victim = tmp_path / "shadow"
    victim.write_text("root:x:0:\n")
    script = fake_script()
    output = script.with_name("train.tuneup.json")
    output.symlink_to(victim)
    if os.geteuid() == 0:
        os.lchown(output, 65534, 65534)
    else:
        monkeypatch.setattr("tuneup.files.os.geteuid", lambda: os.getuid() + 1)
    guessable = shared_tmp / f"{output.name}.{os.getpid()}"  # the old, predictable name
    guessable.symlink_to(victim)

    result = CliRunner().invoke(main, ["autotune", str(script), "--budget", "30",
                                       "--format", "json"])
    assert result.exit_code == 1
    summary = json.loads(result.stdout[:result.stdout.rindex("}") + 1])
    assert "symbolic link owned by user" in summary["error"]
    assert victim.read_text() == "root:x:0:\n" and output.is_symlink()
    kept = Path(summary["settings"])
    assert kept.parent == shared_tmp and kept != guessable and not kept.is_symlink()
    assert json.loads(kept.read_text())["knobs"] is not None
