"""The one writer: atomic, ordinary permissions, and never through another user's link."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tuneup import files
from tuneup.files import ForeignLinkError, trusted_path, write_atomic, write_new

NOBODY = 65534


@pytest.fixture
def foreign(monkeypatch):
    """``foreign(link)`` makes a link another user's: ``nobody``'s when the tests run as
    root (a real ``lchown``), else the writer is told it runs as some other user."""

    def make(link: Path) -> Path:
        if os.geteuid() == 0:
            os.lchown(link, NOBODY, NOBODY)
        else:
            monkeypatch.setattr(files.os, "geteuid", lambda: os.getuid() + 1)
        return link

    return make


def test_another_users_link_is_never_written_through(tmp_path, foreign):
    victim = tmp_path / "root-only"
    victim.write_text("secret\n")
    victim.chmod(0o600)
    link = tmp_path / "train.tuneup.json"
    link.symlink_to(victim)
    foreign(link)
    with pytest.raises(ForeignLinkError, match="owned by user"):
        write_atomic(link, "{}")
    assert victim.read_text() == "secret\n" and stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert link.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == [
        "root-only", "train.tuneup.json"]  # no temporary file left


def test_another_users_link_to_a_folder_on_the_way_is_refused(tmp_path, foreign):
    secret = tmp_path / "etc"
    secret.mkdir()
    shared = tmp_path / "shared"
    shared.mkdir()
    link = shared / "runs"
    link.symlink_to(secret, target_is_directory=True)
    foreign(link)
    with pytest.raises(ForeignLinkError):
        write_atomic(link / "summary.json", "{}")
    assert list(secret.iterdir()) == []


def test_ones_own_links_are_followed_through_a_chain(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to("real", target_is_directory=True)
    (tmp_path / "s.json").symlink_to(tmp_path / "alias" / "target.json")
    write_atomic(tmp_path / "s.json", "new")
    assert (real / "target.json").read_text() == "new" and (tmp_path / "s.json").is_symlink()
    assert trusted_path(tmp_path / "alias" / ".." / "x") == tmp_path / "x"


def test_a_link_loop_is_an_error_not_a_hang(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(OSError, match="too many levels"):
        write_atomic(tmp_path / "a", "x")


def test_a_link_planted_after_the_check_is_replaced_not_followed(tmp_path, monkeypatch):
    """A rename replaces whatever lies at the name: the race between the check and the
    write cannot redirect it."""
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    target = tmp_path / "out.json"
    real_replace = os.replace

    def plant_then_replace(source, destination):
        Path(destination).symlink_to(victim)
        real_replace(source, destination)

    monkeypatch.setattr(files.os, "replace", plant_then_replace)
    write_atomic(target, "mine")
    assert victim.read_text() == "keep\n" and not target.is_symlink()
    assert target.read_text() == "mine"


def test_a_new_copy_has_an_unguessable_name_and_ordinary_permissions(tmp_path):
    previous = os.umask(0o022)
    try:
        first = write_new(tmp_path, "train.tuneup.json.", "a")
        second = write_new(tmp_path, "train.tuneup.json.", "b")
    finally:
        os.umask(previous)
    assert first != second and first.parent == tmp_path
    assert first.name.startswith("train.tuneup.json.") and first.name != f"train.tuneup.json.{os.getpid()}"
    assert (first.read_text(), second.read_text()) == ("a", "b")
    assert stat.S_IMODE(first.stat().st_mode) == 0o644


def test_a_copy_lands_whole_with_its_mode_and_never_through_another_users_link(tmp_path, foreign):
    source = tmp_path / "kept.pt"
    source.write_bytes(b"weights" * 1000)
    source.chmod(0o640)
    files.copy_atomic(source, tmp_path / "run" / "ckpt.pt")  # its folder is made
    restored = tmp_path / "run" / "ckpt.pt"
    assert restored.read_bytes() == source.read_bytes()
    assert stat.S_IMODE(restored.stat().st_mode) == 0o640
    victim = tmp_path / "victim"
    victim.write_text("secret")
    link = tmp_path / "planted"
    link.symlink_to(victim)
    foreign(link)
    with pytest.raises(ForeignLinkError):
        files.copy_atomic(source, link)
    assert victim.read_text() == "secret"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["ckpt.pt"]  # no temporary
