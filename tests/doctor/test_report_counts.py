"""The text report states only what was read: a report listing 1,000 (or 10,000) GPUs is
read to its first 64, and the environment line says so rather than "64 GPU" as a fact
(issue 40, item 15)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from tuneup import __version__
from tuneup.cli import main
from tuneup.doctor.readers import MAX_GPUS
from tuneup.machine.snapshot import Snapshot

LISTED = 10_000  # as the issue had it: cut before it is parsed


def test_a_json_report_of_more_gpus_than_read_says_how_many_were_read(tmp_path):
    environment = Snapshot(source="live").to_dict()
    environment["gpus"] = [{"index": i, "name": "NVIDIA H100 80GB HBM3"} for i in range(LISTED)]
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"tuneup": __version__, "environment": environment}))
    text = CliRunner().invoke(main, ["doctor", "--from", str(report)]).output
    line = text.splitlines()[1]
    assert f"only {MAX_GPUS} of {LISTED} GPUs read: NVIDIA H100 80GB HBM3" in line, text[:500]
    assert f" {MAX_GPUS} GPU:" not in line
