"""Partial reports and pasted errors: every known fact or message is evidence."""

from __future__ import annotations

import pytest

from tuneup.doctor.findings import REGISTRY
from tuneup.doctor.messages import MESSAGES, recognised, requested_torch
from tuneup.doctor.readers import read_report
from tuneup.doctor.rules import diagnose

CATEGORIES = {entry.category for entry in REGISTRY.values()}
PASTED = {  # error text as torch, pip, NCCL or HIP print it -> the category a diagnosis must hold
    "RuntimeError: cuDNN version incompatibility: PyTorch was compiled against (9, 1, 0) but "
    "found runtime version (8, 9, 2). PyTorch already comes bundled with cuDNN.": "cudnn-mismatch",
    "RuntimeError: CUDA error: no kernel image is available for execution on the device\n"
    "CUDA kernel errors might be asynchronously reported": "arch-unsupported",
    "RuntimeError: The NVIDIA driver on your system is too old (found version 11040). Please "
    "update your GPU driver": "driver-too-old",
    "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled "
    "system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3": "nccl-problem",
    "RuntimeError: HIP error: invalid device function\nHIP kernel errors might be asynchronously "
    "reported": "rocm-build",
    "NCCL WARN NCCL cannot be captured in a graph if either it wasn't built with CUDA runtime "
    ">= 11.3 or if the installed CUDA driver < R465.": "nccl-problem",
}


@pytest.mark.parametrize("text", sorted(PASTED))
def test_a_pasted_error_alone_is_read_and_diagnosed(text: str) -> None:
    diagnosis = diagnose(read_report(text))
    assert PASTED[text] in {f.category for f in diagnosis.findings}


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: m.name)
def test_every_registered_message_has_a_source_a_fix_and_is_evidence(message) -> None:
    assert message.source and message.fix and message.means
    assert message.category in CATEGORIES and message.severity in ("error", "warning", "info")
    assert message.name in recognised(message.example)
    read_report(message.example)  # accepted, not refused


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: m.name)
def test_a_known_message_alone_is_placed_in_its_category(message) -> None:
    """Pasted on its own, every registered text gives a finding of its category (from the
    rule that knows most, or the pasted-errors rule); a program's fault is said as such."""
    diagnosis = diagnose(read_report(message.example))
    assert message.category in {f.category for f in diagnosis.findings}, message.example


def test_the_registry_covers_every_cuda_runtime_and_driver_error() -> None:
    origins = {m.origin for m in MESSAGES}
    assert {"cuda-runtime", "cuda-driver", "torch", "nccl", "hip", "pip", "uv", "container",
            "windows"} <= origins
    assert len(MESSAGES) >= 250
    assert sum(m.origin == "cuda-runtime" for m in MESSAGES) >= 100


@pytest.mark.parametrize(
    "lines",
    [
        "Python version: 3.12.1 (main) [GCC 11.4.0] (64-bit runtime)",
        "OS: Ubuntu 22.04.4 LTS (x86_64)",
        "Python platform: Linux-5.15.0-x86_64-with-glibc2.35",
        "NVIDIA-SMI 550.54.14    Driver Version: 550.54.14    CUDA Version: 12.4",
    ],
)
def test_a_single_report_line_is_a_partial_report(lines: str) -> None:
    snapshot = read_report(lines)
    assert snapshot.notes and snapshot.notes[0].startswith("not in the report")


@pytest.mark.parametrize("text", ["hello world", "Traceback: nothing here", "x = 1\nprint(x)"])
def test_text_without_any_known_fact_gets_a_report(text: str) -> None:
    snapshot = read_report(text)
    assert snapshot.notes[0].startswith("no collect_env report")


@pytest.mark.parametrize(
    ("python", "platform", "torch", "supported"),
    [
        ("3.13.1", "Windows-11-10.0.22631-SP0", "2.5.1", False),  # Linux-only cp313 in 2.5
        ("3.13.1", "macOS-14.5-arm64-arm-64bit", "2.5.1", False),
        ("3.13.1", "Linux-6.8.0-x86_64-with-glibc2.39", "2.5.1", True),
        ("3.13.1", "Windows-11-10.0.22631-SP0", "2.6.0", True),
        ("3.12.4", "Linux-6.8.0-x86_64-with-glibc2.39", "2.1.0", False),
        ("3.8.10", "Linux-5.4.0-x86_64-with-glibc2.31", "1.3.1", False),
    ],
)
def test_the_torch_a_pip_error_asked_for_is_judged_against_the_python(
    python: str, platform: str, torch: str, supported: bool
) -> None:
    text = (
        f"Python version: {python} (main) [GCC 11.4.0] (64-bit runtime)\n"
        f"Python platform: {platform}\n\n"
        f"ERROR: Could not find a version that satisfies the requirement torch=={torch}\n"
        f"ERROR: No matching distribution found for torch=={torch}\n"
    )
    assert requested_torch(text) == torch
    diagnosis = diagnose(read_report(text))
    unsupported = [f for f in diagnosis.findings if f.category == "python-unsupported"]
    assert bool(unsupported) is not supported, [f.message for f in diagnosis.findings]
    if unsupported:
        assert unsupported[0].fix


@pytest.mark.parametrize(
    "python_line",
    [
        "3.9.16 (feeb267ead3e, Dec 29 2022, 14:23:21) [PyPy 7.3.11 with GCC 10.2.1] (64-bit runtime)",
        "3.10.13 (Oracle GraalVM Native 23.1.0) [Graal, GraalVM CE, Java 21] GraalPy (64-bit runtime)",
    ],
)
def test_an_interpreter_other_than_cpython_is_the_python_problem(python_line: str) -> None:
    diagnosis = diagnose(read_report(f"PyTorch version: N/A\nPython version: {python_line}\n"))
    codes = {f.code for f in diagnosis.findings}
    assert "TU703" in codes


def test_cpython_is_not_flagged() -> None:
    text = "Python version: 3.11.9 (main, Apr  6 2024) [GCC 11.4.0] (64-bit runtime)\n"
    assert read_report(text).platform.python_implementation == "CPython"
    assert "TU703" not in {f.code for f in diagnose(read_report(text)).findings}
