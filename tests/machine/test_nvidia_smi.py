"""The NVIDIA driver and GPUs read from the driver's file and ``nvidia-smi`` (fake answers
here), without NVML or torch: what set-up chooses the torch wheel from."""

from __future__ import annotations

from tuneup.doctor.wheel_choice import choose
from tuneup.machine.probe.nvidia_smi import NvidiaFacts, read_nvidia


def smi(answers: dict[str, list[list[str]] | None]):
    return lambda fields: answers.get(fields)


def test_no_driver_file_and_no_nvidia_smi_is_no_gpu(tmp_path):
    assert read_nvidia(tmp_path / "absent", smi({})) is None


def test_driver_and_gpus_from_the_driver_file_and_nvidia_smi(tmp_path):
    proc = tmp_path / "version"
    proc.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Release Build\n")
    rows = [["580.159.04", "NVIDIA H200", "9.0"], ["580.159.04", "NVIDIA H200", "9.0"]]
    facts = read_nvidia(proc, smi({"driver_version,name,compute_cap": rows}))
    assert facts == NvidiaFacts("580.159.04", (("NVIDIA H200", "9.0"), ("NVIDIA H200", "9.0")))


def test_an_old_nvidia_smi_without_compute_cap_gives_names(tmp_path):
    """nvidia-smi before compute_cap fails that query: the names go to the doctor's table."""
    facts = read_nvidia(tmp_path / "absent",
                        smi({"driver_version,name": [["470.182.03", "Tesla T4"]]}))
    assert facts == NvidiaFacts("470.182.03", (("Tesla T4", None),))
    assert choose(facts, "3.10.12").variant == "cu118"


def test_a_driver_whose_nvidia_smi_does_not_answer_is_still_a_gpu_machine(tmp_path):
    proc = tmp_path / "version"
    proc.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release\n")
    facts = read_nvidia(proc, smi({}))
    assert facts == NvidiaFacts("580.65.06", ())
    assert choose(facts, "3.12.3").variant != "cpu"
