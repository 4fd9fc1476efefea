"""Driver rule, including CUDA minor-version compatibility."""

from __future__ import annotations

from doctor_helpers import categories, codes, cuda_torch, machine, only, run


def test_minor_version_compatibility_is_not_driver_too_old() -> None:
    diagnosis = run(machine(cuda_torch("1.11.0+cu113"), "460.32.03", None))
    assert "driver-too-old" not in categories(diagnosis)
    assert only(diagnosis, "TU202").severity == "info"
    assert diagnosis.errors == 0


def test_cuda12_wheel_on_a_cuda11_driver() -> None:
    found = only(run(machine(cuda_torch("2.1.0+cu121"), "470.182.03", None)), "TU201")
    assert found.severity == "error"
    assert "525.60.13" in found.message
    assert found.fix.startswith(
        "pip install torch==2.1.0 --index-url https://download.pytorch.org/whl/cu118"
    )
    assert "R525" in found.fix


def test_driver_cuda_from_torch_warning_text() -> None:
    snapshot = machine(
        cuda_torch("2.1.0+cu121", available=False),
        None,
        None,
        messages=[
            "UserWarning: CUDA initialization: The NVIDIA driver on your system is too old (found version 11040)."
        ],
    )
    found = only(run(snapshot), "TU201")
    assert "11.4" in found.message
    assert "no-gpu-visible" not in categories(run(snapshot))


def test_unsuffixed_old_release_uses_its_default_variant() -> None:
    found = only(run(machine({"version": "1.3.0"}, "410.48", None)), "TU201")
    assert "10.1" in found.message and "418.39" in found.message


def test_pre_cuda11_needs_the_toolkit_driver() -> None:
    assert "TU201" in codes(run(machine(cuda_torch("1.7.1+cu110"), "440.33.01", None)))
    assert "driver-too-old" not in categories(
        run(machine(cuda_torch("1.9.0+cu102"), "470.42.01", None))
    )


def test_cuda13_wheel_needs_r580() -> None:
    found = only(
        run(machine(cuda_torch("2.11.0+cu130"), "570.124.04", ["NVIDIA GeForce RTX 4090"])), "TU201"
    )
    assert "cu128" in found.fix  # 2.11 still has a CUDA 12.8 variant that R570 runs


def test_windows_driver_numbers() -> None:
    windows = "Microsoft Windows 11 Pro"
    assert "driver-too-old" not in categories(
        run(machine(cuda_torch("2.7.1+cu128"), "572.83", None, os=windows))
    )
    assert "TU201" in codes(run(machine(cuda_torch("2.7.1+cu128"), "511.79", None, os=windows)))


def test_missing_driver_line_is_unchecked() -> None:
    diagnosis = run(machine(cuda_torch("2.4.1+cu124"), None, None))
    assert any(area == "driver" for area, _ in diagnosis.unchecked)


def test_wsl_reports_the_windows_driver_number() -> None:
    # 451.48 passes the Linux 11.x floor (450.80.02) but not the Windows one (452.39).
    linux = machine(cuda_torch("2.0.1+cu118"), "451.48", None, os="Ubuntu 22.04.3 LTS (x86_64)")
    assert "driver-too-old" not in categories(run(linux))
    wsl = machine(cuda_torch("2.0.1+cu118"), "451.48", None, os="Ubuntu 22.04.3 LTS (x86_64)")
    wsl.platform.kernel = "5.15.153.1-microsoft-standard-WSL2"
    assert "TU201" in codes(run(wsl))


def test_insufficient_driver_error_text_without_a_driver_line() -> None:
    snapshot = machine(
        cuda_torch("1.6.0+cu102"),
        None,
        None,
        messages=[
            "cuda runtime error (35) : CUDA driver version is insufficient for CUDA runtime version"
        ],
    )
    assert "440.33" in only(run(snapshot), "TU201").fix


def test_a_driver_branch_without_its_minor_is_read_and_judged_by_branch() -> None:
    """A report written by hand often says only 'Nvidia driver version: 515'."""
    from tuneup.doctor.readers import read_report
    from tuneup.doctor.rules import diagnose

    def judged(torch: str, driver: str):
        return diagnose(read_report(f"PyTorch version: {torch}\nNvidia driver version: {driver}\n"))

    assert read_report("Nvidia driver version: 515\n").driver.version == "515"
    assert "driver-too-old" in categories(judged("2.0.0+cu118", "440"))  # below 11.x's 450.80
    assert codes(judged("2.0.0+cu117", "515")) == set()  # 515 is CUDA 11.7's own branch
    assert "TU202" in codes(judged("2.0.0+cu118", "515"))  # 11.8 came with 520: MVC
