"""The error and warning texts the doctor recognises, one registry for readers and rules.

People paste what they have: a few collect_env lines, or only the error torch, pip, NCCL or HIP
printed. Each known message is evidence in its own right; readers accept any text holding one,
and rules look them up by name instead of keeping their own copy of the pattern.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Message:
    name: str
    pattern: re.Pattern[str]
    means: str  # what the message says, for the docs and the "evidence" of a finding


def _message(name: str, pattern: str, means: str) -> Message:
    return Message(name, re.compile(pattern, re.IGNORECASE), means)


MESSAGES = (
    _message("cudnn-incompatibility", r"cuDNN version incompatibility",
             "torch loaded a cuDNN other than the one it was compiled against"),
    _message("pip-no-matching-distribution",
             r"No matching distribution found for (?:torch|pytorch)\b",
             "pip found no torch wheel for this Python, platform or index"),
    _message("pip-no-version", r"Could not find a version that satisfies the requirement "
             r"(?:torch|pytorch)\b", "pip found no torch wheel for this Python, platform or index"),
    _message("driver-insufficient", r"CUDA driver version is insufficient",
             "the driver is older than the CUDA runtime of the build"),
    _message("driver-too-old", r"driver on your system is too old",
             "the driver is older than the CUDA runtime of the build"),
    _message("no-kernel-image", r"no kernel image is available",
             "the build has no kernels for the GPU's architecture"),
    _message("capability-not-compatible", r"with CUDA capability sm_\d+ is not compatible",
             "the build has no kernels for the GPU's architecture"),
    _message("no-nvidia-driver", r"Found no NVIDIA driver on your system",
             "torch cannot reach an NVIDIA driver"),
    _message("not-compiled-with-cuda", r"Torch not compiled with CUDA enabled",
             "a CPU-only build of torch"),
    _message("nccl-system-error", r"unhandled system error",
             "NCCL failed on a system call (shared memory, network, or peer access)"),
    _message("nccl-graph-capture", r"NCCL cannot be captured in a graph",
             "the loaded NCCL was built with a CUDA runtime too old for CUDA graphs"),
    _message("nccl-undefined-symbol", r"undefined symbol:?\s*(?P<symbol>nccl\w+)",
             "a libnccl older than the one torch was built against was loaded"),
    _message("hip-invalid-device-function",
             r"invalid device function|hipErrorInvalidDeviceFunction|HIP error: invalid device",
             "the ROCm build has no kernels for the AMD GPU's gfx target"),
    _message("cuda-initialization", r"CUDA initialization: |cudaGetDeviceCount\(\)",
             "CUDA failed to initialise"),
)
BY_NAME = {message.name: message for message in MESSAGES}
PIP_REQUEST = r"(?:No matching distribution found for|satisfies the requirement)\s+"
REQUESTED_TORCH = re.compile(
    PIP_REQUEST + r"(?:torch|pytorch)\s*==\s*(\d+\.\d+(?:\.\d+)?)", re.IGNORECASE,
)


def recognised(text: str) -> list[str]:
    """Names of the known messages ``text`` holds, in registry order."""
    return [message.name for message in MESSAGES if message.pattern.search(text)]


def says(text: str, name: str) -> bool:
    return find(text, name) is not None


def find(text: str, name: str) -> re.Match[str] | None:
    """The first place ``text`` holds the message ``name`` (its named groups are facts)."""
    return BY_NAME[name].pattern.search(text)


def requested_torch(text: str) -> str | None:
    """The torch version a pasted pip error asked for (``torch==2.5.1``), if any."""
    match = REQUESTED_TORCH.search(text)
    return match.group(1) if match else None
