"""ROCm rules."""

from __future__ import annotations

from doctor_helpers import categories, codes, cuda_torch, machine, only, run

from tuneup.doctor import knowledge as kb


def test_amd_gpu_with_default_pypi_wheel() -> None:
    snapshot = machine({"version": "2.4.1"}, None, ["AMD Radeon RX 6650 XT"], os="Linux")
    found = only(run(snapshot), "TU601")
    assert found.severity == "error"
    assert (
        found.fix == kb.install_fix_text("2.4.1", "rocm6.1")
    )


def test_amd_gpu_with_release_before_rocm_wheels() -> None:
    found = only(run(machine({"version": "1.6.0"}, None, ["AMD Raven"], python="3.6")), "TU601")
    assert "rocm" in found.fix


def test_rocm_build_on_nvidia_machine() -> None:
    snapshot = machine(
        {"version": "2.6.0+rocm6.2.4", "build": "rocm", "hip": "6.2.41133"},
        "560.35.03",
        ["NVIDIA GeForce RTX 4090"],
    )
    found = only(run(snapshot), "TU602")
    assert "cu126" in found.fix


def test_rocm_build_with_amd_gpu_is_fine() -> None:
    snapshot = machine(
        {"version": "2.6.0+rocm6.2.4", "build": "rocm", "hip": "6.2.41133"},
        None,
        ["AMD Instinct MI250X"],
    )
    assert "rocm-build" not in categories(run(snapshot))


def test_windows_amd_fix_names_linux() -> None:
    snapshot = machine(
        cuda_torch("2.4.1+cu121"), None, ["AMD Radeon RX 7900 XTX"], os="Microsoft Windows 11"
    )
    assert "Linux" in only(run(snapshot), "TU601").fix


def test_rocm_build_without_a_named_gpu_says_which_targets_it_ships() -> None:
    """Only a pip list: the wheel line's gfx list and how to read the GPU's target, no claim."""
    snapshot = machine({"version": "2.10.0.dev20250929+rocm7.0"}, None, None)
    found = only(run(snapshot), "TU608")
    assert found.severity == "info" and found.category == "rocm-build"
    assert "rocm7.0 wheels of torch 2.10" in found.message and "gfx1100" in found.message
    assert "rocminfo | grep gfx" in found.fix and "HSA_OVERRIDE_GFX_VERSION" in found.fix


def test_rocm_build_with_a_known_target_or_on_nvidia_needs_no_note() -> None:
    amd = machine({"version": "2.5.1+rocm6.2"}, None, ["AMD Radeon RX 7900 XTX"])
    nvidia = machine({"version": "2.5.1+rocm6.2"}, "550.54.14", None)
    assert "TU608" not in codes(run(amd)) | codes(run(nvidia))
