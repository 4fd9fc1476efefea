"""Visibility rules: the GPU is there but torch cannot see it."""

from __future__ import annotations

import pytest
from doctor_helpers import categories, codes, cuda_torch, machine, only, run

from tuneup.doctor.readers import read_report
from tuneup.doctor.rules import diagnose

WINDOWS = "Microsoft Windows 10 Pro"


def test_cuda_build_with_gpu_but_not_available() -> None:
    snapshot = machine(
        cuda_torch("1.12.1+cu113", available=False),
        None,
        ["NVIDIA GeForce RTX 2070 SUPER"],
        os=WINDOWS,
    )
    found = only(run(snapshot), "TU501")
    assert found.severity == "error" and "CUDA_VISIBLE_DEVICES" in found.fix


def test_driver_line_without_torch_details() -> None:
    snapshot = machine({"installed": None, "cuda_available": False}, "387.12", None, python="3.6")
    assert "TU501" in codes(run(snapshot))


def test_cuda_visible_devices_names_a_missing_gpu() -> None:
    snapshot = machine(
        cuda_torch("2.4.1+cu121", available=False),
        "550.54.14",
        ["NVIDIA GeForce RTX 3090"],
        env={"CUDA_VISIBLE_DEVICES": "2"},
    )
    found = only(run(snapshot), "TU502")
    assert "only 1 GPU" in found.message


def test_cuda_visible_devices_empty_hides_everything() -> None:
    snapshot = machine(
        cuda_torch("2.4.1+cu121", available=False),
        "550.54.14",
        ["NVIDIA A100-SXM4-80GB"],
        env={"CUDA_VISIBLE_DEVICES": ""},
    )
    assert "hides every GPU" in only(run(snapshot), "TU502").message


def test_container_without_compute_capability() -> None:
    snapshot = machine(
        cuda_torch("2.4.1+cu121", available=False),
        "550.54.14",
        ["NVIDIA A100-SXM4-80GB"],
        env={"NVIDIA_DRIVER_CAPABILITIES": "utility"},
    )
    assert "compute,utility" in only(run(snapshot), "TU503").fix


def test_driver_too_old_explains_the_missing_gpu() -> None:
    snapshot = machine(cuda_torch("2.1.0+cu121", available=False), "470.182.03", ["Tesla T4"])
    assert "no-gpu-visible" not in categories(run(snapshot))


def test_visible_gpu_is_fine_and_cpu_builds_are_not_this_rule() -> None:
    assert "no-gpu-visible" not in categories(
        run(machine(cuda_torch("2.4.1+cu121"), "550.54.14", ["Tesla T4"]))
    )
    cpu = machine({"version": "2.4.1+cpu", "cuda_available": False}, "550.54.14", ["Tesla T4"])
    assert "no-gpu-visible" not in categories(run(cpu))


def test_a_chosen_cuda_build_that_sees_no_gpu_is_an_error_even_with_nothing_else_known() -> None:
    for version in ("1.13.0+cu117", "2.1.1+cu121", "2.7.1+cu128"):
        torch = {**cuda_torch(version), "cuda_available": False}
        found = [f for f in run(machine(torch, None, None)).findings if f.code == "TU504"]
        assert len(found) == 1 and found[0].severity == "error", version
        assert "container" in found[0].fix and "CUDA_VISIBLE_DEVICES" in found[0].fix


def test_the_default_wheel_that_sees_no_gpu_is_only_a_warning() -> None:
    torch = {"version": "2.4.1", "build": "cuda", "cuda": "12.1", "cuda_available": False}
    found = [f for f in run(machine(torch, None, None)).findings if f.code == "TU504"]
    assert len(found) == 1 and found[0].severity == "warning"


def test_no_unexplained_finding_when_the_gpu_is_seen_or_known_absent_or_explained() -> None:
    seen = {**cuda_torch("2.1.1+cu121"), "cuda_available": True}
    assert "TU504" not in codes(run(machine(seen, None, None)))
    blind = {**cuda_torch("2.1.1+cu121"), "cuda_available": False}
    assert "TU504" not in codes(run(machine(blind, None, [])))  # known: no GPU
    old_driver = run(machine(blind, "470.82.01", ["NVIDIA GeForce RTX 3090"]))
    assert "TU504" not in codes(old_driver) and "driver-too-old" in categories(old_driver)


NO_GPU_SEEN = ("PyTorch version: 2.4.1+cu121\nCUDA used to build PyTorch: 12.1\n"
               "OS: Ubuntu 22.04.4 LTS (x86_64)\nIs CUDA available: False\n"
               "GPU models and configuration: No CUDA\nNvidia driver version: No CUDA\n")


@pytest.mark.parametrize("text", [
    NO_GPU_SEEN,
    NO_GPU_SEEN.replace("2.4.1+cu121", "2.4.1").replace("CUDA used to build PyTorch: 12.1\n", ""),
    "torch==2.6.0+cu124\n>>> torch.cuda.device_count()\n0\n",
])
def test_a_cuda_build_that_sees_no_gpu_is_warned_of_what_hides_one(text):
    found = [f for f in diagnose(read_report(text)).findings if f.code == "TU506"]
    assert len(found) == 1 and found[0].severity == "warning", found
    assert "--gpus all" in found[0].message and "CUDA_VISIBLE_DEVICES" in found[0].message


def test_the_warning_names_the_variable_the_report_shows_and_is_silent_when_there_is_no_gpu():
    hidden = diagnose(read_report(NO_GPU_SEEN + "NVIDIA_VISIBLE_DEVICES=void\n")).findings
    assert any(f.code == "TU506" and "NVIDIA_VISIBLE_DEVICES='void'" in f.message for f in hidden)
    said = diagnose(read_report(NO_GPU_SEEN + "This is a CPU-only server.\n")).findings
    assert not any(f.code == "TU506" for f in said)


def test_several_mig_instances_are_noted_one_process_sees_one():
    text = ("PyTorch version: 2.5.1+cu121\nGPU models and configuration:\n"
            "GPU 0: NVIDIA A100-SXM4-80GB\n"
            "MIG 3g.40gb Device 0:\nMIG 3g.40gb Device 1:\nNvidia driver version: 535.161.08\n")
    found = [f for f in diagnose(read_report(text)).findings if f.code == "TU507"]
    assert len(found) == 1 and found[0].severity == "info" and "2 MIG" in found[0].message
    single = text.replace("MIG 3g.40gb Device 1:\n", "")
    assert not any(f.code == "TU507" for f in diagnose(read_report(single)).findings)
