"""Findings and the one registry of finding codes (documented in docs/findings.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

ERROR, WARNING, INFO = "error", "warning", "info"
SEVERITIES = (ERROR, WARNING, INFO)


@dataclass(frozen=True)
class Code:
    """One registered finding code."""

    code: str
    category: str
    area: str
    title: str


# Areas in report order.
AREAS = {
    "build": "PyTorch build and GPU architecture",
    "driver": "NVIDIA driver",
    "cudnn": "cuDNN",
    "nccl": "NCCL",
    "visibility": "GPU visibility",
    "rocm": "AMD / ROCm",
    "python": "Python",
    "performance": "Performance",
    "cpu": "CPU side",
    "program": "The program, not the environment",
}

_CODES = [
    Code(
        "TU101",
        "arch-unsupported",
        "build",
        "the GPU's compute capability has no kernels in this build",
    ),
    Code(
        "TU102",
        "arch-unsupported",
        "build",
        "the GPU probably has no kernels in this build (unverified arch list)",
    ),
    Code("TU103", "cpu-only-build", "build", "CPU-only PyTorch on a machine with an NVIDIA GPU"),
    Code(
        "TU104",
        "cpu-only-build",
        "build",
        "CPU-only PyTorch next to a CUDA toolkit or CUDA libraries",
    ),
    Code("TU105", "torch-not-installed", "build", "PyTorch is not installed"),
    Code("TU107", "arch-unsupported", "build", "a pasted error says the build lacks kernels for the GPU"),
    Code("TU108", "cpu-only-build", "build", "a pasted error says the build has no GPU support"),
    Code(
        "TU106",
        "arch-unsupported",
        "build",
        "the build's CUDA toolkit cannot target the GPU's architecture",
    ),
    Code(
        "TU201",
        "driver-too-old",
        "driver",
        "the driver is older than the build's CUDA runtime needs",
    ),
    Code(
        "TU202",
        "driver-minor-compat",
        "driver",
        "the build runs through CUDA minor-version compatibility",
    ),
    Code("TU203", "driver-too-old", "driver", "a pasted error says the driver is too old"),
    Code("TU204", "nvml-no-answer", "driver", "NVML did not answer within its deadline"),
    Code(
        "TU301",
        "cudnn-mismatch",
        "cudnn",
        "the cuDNN loaded at run time does not match the compiled one",
    ),
    Code(
        "TU302",
        "cudnn-mismatch",
        "cudnn",
        "a foreign cuDNN on LD_LIBRARY_PATH can shadow the bundled one",
    ),
    Code("TU303", "cudnn-mismatch", "cudnn", "cuDNN 9.11+ with a GPU below compute capability 7.5"),
    Code(
        "TU304", "cudnn-mismatch", "cudnn", "a system cuDNN of the same major beside torch's pip cuDNN"
    ),
    Code("TU305", "cudnn-mismatch", "cudnn", "a pasted error says cuDNN (or a CUDA library) is not the one torch needs"),
    Code("TU401", "nccl-problem", "nccl", "NCCL wheels for two CUDA majors are installed"),
    Code("TU402", "nccl-problem", "nccl", "the loaded libnccl lacks a symbol PyTorch needs"),
    Code(
        "TU403", "nccl-problem", "nccl", "an NCCL transport is disabled by an environment variable"
    ),
    Code("TU404", "nccl-problem", "nccl", "a second libnccl can shadow the one PyTorch expects"),
    Code("TU405", "nccl-problem", "nccl", "the NCCL wheel is for another CUDA major than torch"),
    Code("TU406", "nccl-problem", "nccl", "the NCCL wheel is older than the one torch pins"),
    Code("TU407", "nccl-problem", "nccl", "the NCCL cannot be captured in CUDA graphs"),
    Code("TU408", "nccl-problem", "nccl", "NCCL reported an unhandled system error"),
    Code("TU409", "nccl-problem", "nccl", "a pasted error from NCCL or torch.distributed"),
    Code("TU410", "nccl-problem", "nccl", "torch on Windows has no NCCL: distributed needs gloo"),
    Code("TU411", "nccl-problem", "nccl", "an NCCL too old for collectives between CC 12.0 GPUs"),
    Code("TU420", "rendezvous-failed", "nccl", "local ranks could not rendezvous"),
    Code(
        "TU421",
        "collective-failed",
        "nccl",
        "a collective between local ranks failed or did not complete",
    ),
    Code(
        "TU422",
        "socket-interface",
        "nccl",
        "NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME names no interface of this machine",
    ),
    Code("TU423", "shm-too-small", "nccl", "/dev/shm is below what NCCL's shm transport needs"),
    Code(
        "TU501",
        "no-gpu-visible",
        "visibility",
        "CUDA build and an NVIDIA GPU, but PyTorch sees no GPU",
    ),
    Code(
        "TU502",
        "no-gpu-visible",
        "visibility",
        "CUDA_VISIBLE_DEVICES hides GPUs or names a missing one",
    ),
    Code(
        "TU503",
        "no-gpu-visible",
        "visibility",
        "the container runtime does not expose CUDA compute",
    ),
    Code(
        "TU504",
        "no-gpu-visible",
        "visibility",
        "a CUDA build sees no GPU and nothing in the input explains why",
    ),
    Code("TU505", "no-gpu-visible", "visibility", "a pasted error says CUDA sees no usable GPU"),
    Code("TU506", "no-gpu-visible", "visibility", "a CUDA build sees no GPU: one may be hidden"),
    Code("TU507", "no-gpu-visible", "visibility", "several MIG instances: one process sees one"),
    Code("TU601", "rocm-build", "rocm", "an AMD GPU with a CUDA build of PyTorch"),
    Code("TU602", "rocm-build", "rocm", "a ROCm build of PyTorch on an NVIDIA machine"),
    Code("TU603", "rocm-build", "rocm", "an AMD GPU with a CPU-only build of PyTorch"),
    Code("TU604", "rocm-build", "rocm", "the ROCm build has no kernels for the AMD GPU's target"),
    Code(
        "TU605",
        "rocm-build",
        "rocm",
        "the ROCm wheel line ships no kernels for the AMD GPU's gfx target",
    ),
    Code("TU606", "rocm-build", "rocm", "a pasted HIP error says the ROCm build lacks the GPU's target"),
    Code("TU607", "rocm-build", "rocm", "HSA_OVERRIDE_GFX_VERSION names another GPU generation"),
    Code("TU608", "rocm-build", "rocm", "a ROCm build whose GPU's gfx target the input does not give"),
    Code(
        "TU701", "python-unsupported", "python", "no PyTorch wheel of this release for this Python"
    ),
    Code(
        "TU702",
        "python-unsupported",
        "python",
        "this Python is newer or older than any known PyTorch release supports",
    ),
    Code(
        "TU703", "python-unsupported", "python", "a Python other than CPython (PyPy, GraalPy...)"
    ),
    Code("TU705", "python-unsupported", "python", "a 32-bit Python (PyTorch has no 32-bit wheels)"),
    Code("TU704", "python-unsupported", "python", "a pasted installer error says no torch wheel fits this Python or platform"),
    Code("TU706", "python-unsupported", "python",
         "torch is missing and this Python predates every torch release with wheels for it"),
    Code("TU801", "pcie-link", "performance", "a GPU's PCIe link runs below its maximum width"),
    Code(
        "TU802", "pcie-link", "performance", "a GPU's PCIe link runs below its maximum generation"
    ),
    Code("TU803", "persistence-off", "performance", "persistence mode is off"),
    Code("TU804", "throttling", "performance", "a GPU is throttling its clocks (thermal or power)"),
    Code(
        "TU805",
        "data-loading-cores",
        "performance",
        "too few usable CPU cores per GPU for data loading",
    ),
    Code("TU806", "shm-too-small", "performance", "/dev/shm is too small for DataLoader workers"),
    Code("TU807", "ecc-errors", "performance", "a GPU reports uncorrected ECC errors"),
    Code("TU901", "no-nvidia-gpu", "cpu", "no NVIDIA GPU found; training runs on the CPU"),
    Code("TU902", "cpu-features", "cpu", "CPU bf16 support (AVX512-BF16 / AMX)"),
    Code("TU903", "cpu-features", "cpu", "usable CPU cores"),
    Code("TU904", "cpu-features", "cpu", "shared memory for DataLoader workers"),
    Code("TU905", "gpu-features", "performance", "GPU precision features (bf16, TF32, fp8)"),
    Code("TU960", "program-error", "program", "a pasted error is the program's fault, not the environment's"),
]

REGISTRY: dict[str, Code] = {c.code: c for c in _CODES}


@dataclass(frozen=True)
class Finding:
    """One diagnosis: what is wrong (or worth knowing) and the concrete fix."""

    code: str
    category: str
    severity: str
    message: str
    fix: str

    @property
    def area(self) -> str:
        return REGISTRY[self.code].area

    def to_dict(self) -> dict[str, Any]:
        """The fields, and ``install`` ({"pip": ..., "uv": ...}) when the fix installs torch."""
        from tuneup.doctor.knowledge import INSTALL_FIX

        found = INSTALL_FIX.search(self.fix)
        return asdict(self) | ({"install": found.groupdict()} if found else {})


def finding(code: str, severity: str, message: str, fix: str = "") -> Finding:
    """Build a finding for a registered code (the category comes from the registry)."""
    if code not in REGISTRY:
        raise KeyError(f"unregistered finding code {code}")
    if severity not in SEVERITIES:
        raise ValueError(f"unknown severity {severity}")
    return Finding(code, REGISTRY[code].category, severity, message, fix)
