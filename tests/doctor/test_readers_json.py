"""tuneup's own JSON fed back through ``--from``: round trip and bad JSON."""

from __future__ import annotations

import json

import pytest

from tuneup import __version__
from tuneup.machine import probe
from tuneup.doctor.readers import ReportError, read_path, read_report
from tuneup.machine.snapshot import GPU, Snapshot


def doctor_output(environment: dict) -> str:
    """The object `tuneup doctor --format json` prints."""
    return json.dumps(
        {
            "tuneup": __version__,
            "environment": environment,
            "findings": [],
            "summary": {"errors": 0, "warnings": 0},
        },
        indent=2,
    )


def test_live_snapshot_round_trip(tmp_path):
    live = probe.snapshot()
    path = tmp_path / "doctor.json"
    path.write_text(doctor_output(live.to_dict()))
    back = read_path(str(path))
    assert back.source == "json"
    back.source = live.source
    assert back == live


def test_bare_environment_object():
    snapshot = Snapshot(gpus=[GPU(index=0, name="NVIDIA A100-SXM4-80GB", compute_capability="8.0")])
    snapshot.torch.version = "2.6.0+cu126"
    back = read_report(json.dumps(snapshot.to_dict()))
    assert back.gpus == snapshot.gpus and back.torch.version == "2.6.0+cu126"


def test_json_after_the_command_line_that_printed_it():
    text = "$ tuneup doctor --format json\n" + doctor_output(Snapshot().to_dict()) + "\n$ exit\n"
    assert read_report(text).source == "json"


def test_unknown_keys_are_ignored_and_missing_ones_stay_unknown():
    back = read_report(
        doctor_output({"torch": {"version": "2.5.1", "future_field": 1}, "platform": {}})
    )
    assert back.torch.version == "2.5.1" and back.torch.cuda is None and back.gpus is None


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"name": "my-package", "version": "1.0"}', "not a tuneup report"),
        ("[1, 2, 3]", "not a tuneup report"),
        ('{"tuneup": "0.1", "environment": {"torch": {"versi', "invalid or cut short"),
        ('{"tuneup": "0.1", "environment": {"gpus": "two", "torch": {}}}', "malformed environment"),
    ],
)
def test_bad_json_is_a_one_line_error(text, words):
    with pytest.raises(ReportError, match=words) as caught:
        read_report(text)
    assert "\n" not in str(caught.value)
