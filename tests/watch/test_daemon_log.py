"""The daemon's files under hostile or careless conditions: ``--log`` gets the state
directory's owner and permission rule (issue 40, item 9), and ``daemon.stderr`` stays
bounded with one line per failing window, never a traceback per record (item 13)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tuneup.errors import UsageError
from tuneup.watch import daemon as daemon_module
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


class FullDisk:
    """A log stream on a disk with no space left."""

    def write(self, text: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self) -> None:
        """Nothing buffered."""

    def close(self) -> None:
        """Nothing to close."""

    def tell(self) -> int:
        return 0

    def seek(self, *args: object) -> int:
        return 0


def test_a_log_that_cannot_be_written_costs_one_line_per_window_on_stderr(tmp_path, capsys):
    daemon = start_with_log(tmp_path, tmp_path / "watch.jsonl")
    handler = daemon.log.handlers[0]
    handler.stream.close()
    handler.stream = FullDisk()
    try:
        for _ in range(50):  # a sample, a verdict, notes: records by the hundred
            daemon.tick()
    finally:
        daemon.close()
    said = capsys.readouterr().err
    assert "Traceback" not in said and len(said.splitlines()) == 1, said[:2000]
    assert "cannot write the log" in said and "No space left on device" in said


def test_daemon_stderr_is_emptied_past_its_cap(tmp_path):
    state = StateDir(tmp_path / "state")
    state.create()
    state.stderr_file.write_bytes(b"old line\n" * (daemon_module.MAX_STDERR_BYTES // 9 + 10))
    other = tmp_path / "terminal"
    other.write_bytes(b"x" * (daemon_module.MAX_STDERR_BYTES + 10))
    for path in (state.stderr_file, other):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            daemon_module.cap_stderr(fd, state.stderr_file)
            os.write(fd, b"next line\n")
        finally:
            os.close(fd)
    lines = state.stderr_file.read_text().splitlines()
    assert len(lines) == 2 and "grew past 1 MiB" in lines[0] and lines[1] == "next line"
    assert other.stat().st_size == daemon_module.MAX_STDERR_BYTES + 20  # not the daemon's: kept
