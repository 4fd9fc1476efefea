"""The daemon's files under hostile or careless conditions: ``--log`` gets the state
directory's owner and permission rule (issue 40, item 9), and ``daemon.stderr`` stays
bounded with one line per failing window, never a traceback per record (item 13)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tuneup.errors import UsageError
from tuneup.watch.daemon import Daemon
from tuneup.watch.discover import Finder
from tuneup.watch.state import StateDir

NOBODY = 65534


def start_with_log(tmp_path: Path, log: Path) -> Daemon:
    return Daemon(StateDir(tmp_path / "state"), 0.1, log=log, finder=Finder(list_pids=list))


def test_a_log_in_a_folder_others_can_write_to_is_refused_with_its_fix(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UsageError) as error:
        start_with_log(tmp_path, shared / "watch.jsonl")
    line = str(error.value)
    assert "can be written by other users" in line and "give another --log" in line
    assert "\n" not in line and list(shared.iterdir()) == []


def test_a_log_in_another_user_s_folder_is_refused(tmp_path):
    if os.geteuid() == 0:  # root's daemon, a user's folder: the case the issue found
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o755)
        os.chown(theirs, NOBODY, NOBODY)
    else:  # a user's daemon, root's folder
        theirs = Path("/")
    with pytest.raises(UsageError, match=r"belongs to user \d+; .* give another --log"):
        start_with_log(tmp_path, theirs / "tuneup-watch-test.jsonl")
    assert not (theirs / "tuneup-watch-test.jsonl").exists()


def test_a_log_file_others_can_write_to_is_refused_and_a_new_one_is_0600(tmp_path):
    folder = tmp_path / "logs"
    folder.mkdir(mode=0o700)
    loose = folder / "loose.jsonl"
    loose.write_text("kept\n")
    loose.chmod(0o666)
    with pytest.raises(UsageError, match="can be written by other users"):
        start_with_log(tmp_path, loose)
    assert loose.read_text() == "kept\n"
    daemon = start_with_log(tmp_path, folder / "new.jsonl")
    daemon.close()
    assert (folder / "new.jsonl").stat().st_mode & 0o777 == 0o600
