"""Python rule, with and without a requested torch version."""

from __future__ import annotations

from doctor_helpers import categories, machine, only, run


def test_requested_torch_without_wheels_for_this_python() -> None:
    snapshot = machine({"installed": False}, "470.94", ["NVIDIA GeForce GTX 760"], python="3.10.1")
    found = only(run(snapshot, requested_torch="1.10.1"), "TU701")
    assert found.severity == "error"
    assert "3.6-3.9" in found.message
    assert "torch==1.11.0" in found.fix


def test_python_312_needs_torch_22() -> None:
    snapshot = machine({"installed": False}, None, None, os="Microsoft Windows", python="3.12.0")
    assert "torch==2.2.2" in only(run(snapshot, requested_torch="2.1.0"), "TU701").fix


def test_old_python_points_to_the_last_release_for_it() -> None:
    snapshot = machine({"installed": False}, None, None, python="3.8.10")
    assert "torch==2.5.1" in only(run(snapshot, requested_torch="2.6.0"), "TU701").fix


def test_requested_python_overrides_the_report() -> None:
    snapshot = machine({"installed": False}, None, None, python="3.12.0")
    assert "python-unsupported" not in categories(
        run(snapshot, requested_torch="2.1.0", requested_python="3.11")
    )


def test_supported_python_and_no_torch() -> None:
    diagnosis = run(machine({"installed": False}, None, None, python="3.10.1"))
    assert "python-unsupported" not in categories(diagnosis)
    assert any(area == "python" for area, _ in diagnosis.passed)


def test_python_beyond_every_release_warns() -> None:
    found = only(run(machine({"installed": False}, None, None, python="3.99.0")), "TU702")
    assert found.severity == "warning"


def test_unverified_release_row_only_warns() -> None:
    snapshot = machine({"installed": False}, None, None, python="3.9.0")
    assert only(run(snapshot, requested_torch="1.6.0"), "TU701").severity == "warning"
