"""Hogwild-style jobs (pytorch/examples' mnist_hogwild): trainers forked with ``mp.Process``
look exactly like forked DataLoader workers. In their set-up, before any feed, the watcher
called them "2 workers" and the job input-bound; now they are children of unknown role until
their feeds make them trainers, whose figures are summed."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tuneup.cli import main

JOB = Path(__file__).with_name("hogwild.py")
SETUP_S, TRAIN_S = "1.5", "0.8"


@pytest.fixture(autouse=True)
def defaults(monkeypatch):
    monkeypatch.setenv("TUNEUP_DISABLE", "1")


@pytest.mark.slow  # a real job under the watcher: ~7 s each here, more on a loaded machine
@pytest.mark.parametrize("variant", [[], ["--plain"]], ids=["tuned", "plain"])
def test_spawned_trainers_are_never_workers_nor_input_bound_in_set_up(tmp_path, variant):
    summary_path = tmp_path / "summary.json"
    result = CliRunner().invoke(main, [
        "watch", "--interval", "0.25", "--summary", str(summary_path), "--",
        sys.executable, str(JOB), *variant, SETUP_S, TRAIN_S])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("[")]
    fed = next(n for n, line in enumerate(lines) if "data wait" in line)
    assert fed >= 2, lines  # the trainers' set-up was watched
    for line in lines:
        assert not re.search(r"\\d+ workers", line), line
    for line in lines[:fed]:
        assert "input-bound" not in line, line
    assert any("child processes (role not yet known)" in line for line in lines[:fed]), lines
    assert any("2 trainer processes" in line for line in lines[fed:]), lines
    figures = json.loads(summary_path.read_text())["figures"]
    assert (figures["trainers"], figures["workers"], figures["children"]) == (2, 0, 0), figures
    assert figures["steps"] > 0
    assert "2 trainer processes (their feeds summed)" in result.output


def _registers(path: str) -> None:
    from tuneup.watch.child_exit import publish_when_child_ends

    publish_when_child_ends(object(), lambda: Path(path).write_text("last"))


def test_a_multiprocessing_child_publishes_as_it_ends(tmp_path):
    """mp.Process children end through os._exit, where atexit never runs: the last counters
    come from multiprocessing's own finalizers."""
    import multiprocessing

    path = tmp_path / "last"
    child = multiprocessing.get_context("fork").Process(target=_registers, args=(str(path),))
    child.start()
    child.join(30)
    assert child.exitcode == 0 and path.read_text() == "last"
    _registers(str(tmp_path / "here"))  # not a multiprocessing child: left to atexit
    assert not (tmp_path / "here").exists()
