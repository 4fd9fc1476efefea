"""Python rule, with and without a requested torch version."""

from __future__ import annotations

from doctor_helpers import categories, codes, machine, only, run


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


def _missing_torch(python_line: str, os: str = "Ubuntu 23.04 (x86_64)") -> str:
    return (f"PyTorch version: N/A\nIs debug build: N/A\nCUDA used to build PyTorch: N/A\n\n"
            f"OS: {os}\n\nPython version: {python_line} (64-bit runtime)\n"
            "Is CUDA available: N/A\n")


def _read(text: str):
    from tuneup.doctor.readers import read_report
    return run(read_report(text))


def test_python_built_before_its_first_torch_wheels_warns() -> None:
    """The banner's build date is in the report: Python 3.12.0 of Oct 2023 predates torch 2.2."""
    diagnosis = _read(_missing_torch("3.12.0 | packaged by conda-forge | (main, Oct  3 2023, "
                                     "08:43:22) [GCC 12.3.0]"))
    found = only(diagnosis, "TU706")
    assert found.severity == "warning" and diagnosis.errors == 0
    assert "torch 2.2 (2024-01-30" in found.message
    assert "pip install 'torch>=2.2'" in found.fix and "Python 3.11" in found.fix


def test_the_first_wheels_are_per_os() -> None:
    """1.13 had cp311 wheels on Linux only: a Feb 2023 3.11 is late on Linux, early on Windows."""
    banner = "3.11.2 (tags/v3.11.2:878ead1, Feb  7 2023, 16:38:35) [MSC v.1934 64 bit (AMD64)]"
    windows = only(_read(_missing_torch(banner, "Microsoft Windows 11 Pro")), "TU706")
    assert "torch 2.0 (2023-03-15" in windows.message and "Python 3.10" in windows.fix
    assert "TU706" not in codes(_read(_missing_torch(banner)))


def test_a_python_newer_than_its_first_wheels_or_with_torch_installed_is_not_judged() -> None:
    late = _missing_torch("3.12.3 (main, Apr 10 2024, 05:33:47) [GCC 13.2.0]")
    installed = late.replace("PyTorch version: N/A", "PyTorch version: 2.1.0+cu121").replace(
        "Apr 10 2024", "Oct  3 2023")
    assert "TU706" not in codes(_read(late)) | codes(_read(installed))
