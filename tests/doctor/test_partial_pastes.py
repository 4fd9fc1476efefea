"""Partial pastes: facts the reader takes from text that is not a collect_env report.

Each test states one general form (not a corpus case): torch's own capability warning alone,
torch's CPU-build error, a retyped NCCL symbol error, a suffixed torch version in prose, and
`nvidia-smi -L` lines.
"""

from __future__ import annotations

from tuneup.doctor.readers import read_report
from tuneup.doctor.rules import diagnose


def codes(text: str) -> dict[str, str]:
    return {f.code: f.severity for f in diagnose(read_report(text)).findings}


WARNING_ONLY = (
    "NVIDIA GeForce RTX 4090 with CUDA capability sm_89 is not compatible with the current "
    "PyTorch installation.\nThe current PyTorch install supports CUDA capabilities {arches}.\n"
)


def test_capability_warning_alone_is_judged_with_torchs_own_arch_list() -> None:
    found = codes(WARNING_ONLY.format(arches="sm_37 sm_50 sm_60 sm_70 sm_75 compute_37"))
    assert found.get("TU101") == "error"  # compute_37 PTX of an older major does not count


def test_nvidia_smi_list_alone_is_a_report() -> None:
    snap = read_report("GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-1)\nGPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-2)\n")
    assert [g.vendor for g in snap.gpus or []] == ["nvidia", "nvidia"]
    assert not any(f.severity == "error" for f in diagnose(snap).findings)


def test_not_compiled_with_cuda_and_a_driver_is_a_cpu_build_error() -> None:
    text = (
        "NVIDIA-SMI 535.98       Driver Version: 535.98       CUDA Version: 12.2\n"
        "AssertionError: Torch not compiled with CUDA enabled\n"
    )
    assert codes(text).get("TU103") == "error"


def test_not_compiled_with_cuda_alone_invents_no_gpu() -> None:
    found = codes("AssertionError: Torch not compiled with CUDA enabled\n")
    assert found.get("TU103") != "error"


def test_stated_build_wins_over_the_cpu_error_message() -> None:
    text = "PyTorch version: 2.4.1+cu121\nAssertionError: Torch not compiled with CUDA enabled\n"
    assert "TU103" not in codes(text)


def test_nccl_symbol_error_without_colon() -> None:
    assert codes("ImportError: libtorch_cuda.so: undefined symbol ncclCommWindowRegister\n").get("TU402") == "error"


def test_suffixed_torch_version_in_prose() -> None:
    snap = read_report("we run torch 2.6.0+cu124 here\nGPU 0: NVIDIA GeForce RTX 5090 (UUID: GPU-1234)\n")
    assert snap.torch.version == "2.6.0+cu124"
    assert snap.torch.cuda == "12.4"
    assert [g.name for g in snap.gpus or []] == ["NVIDIA GeForce RTX 5090"]
    assert codes("torch==2.6.0+cu124\nGPU 0: NVIDIA GeForce RTX 5090\n").get("TU101") == "error"


def test_two_different_suffixed_versions_settle_nothing() -> None:
    snap = read_report("tried torch 2.6.0+cu124, then torch 2.7.1+cu128\nCUDA driver version is insufficient\n")
    assert snap.torch.version is None


def test_unsuffixed_version_in_prose_is_read_without_inventing_its_build() -> None:
    snap = read_report("the version torch is 2.0.1\nCUDA driver version is insufficient\n")
    assert snap.torch.version == "2.0.1" and snap.torch.build is None
    assert any("from 'the version torch is 2.0.1'" in note for note in snap.notes)


def test_gpu_field_wins_over_loose_gpu_lines() -> None:
    text = "GPU models and configuration: GPU 0: Tesla T4\nPyTorch version: 2.4.1+cu121\n"
    assert [g.name for g in read_report(text).gpus or []] == ["Tesla T4"]


def test_a_version_pip_could_not_find_is_not_read_as_installed() -> None:
    text = (
        "ERROR: Could not find a version that satisfies the requirement torch==2.5.1+cu121\n"
        "ERROR: No matching distribution found for torch==2.5.1+cu121\n"
        "GPU 0: NVIDIA GeForce RTX 5090 (UUID: GPU-1)\n"
    )
    snap = read_report(text)
    assert snap.torch.installed is not True and snap.torch.version is None
    assert "TU101" not in codes(text)  # what was asked for is judged, not blamed as installed
