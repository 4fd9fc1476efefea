"""The installed PyTorch: version, build, and what its CUDA runtime says about this machine."""

from __future__ import annotations

import dataclasses
import importlib.util
import warnings
from typing import Any

from tuneup.machine.probe.nvml_call import NvmlTimeout, bounded_call
from tuneup.machine.snapshot import GPU, TorchBuild
from tuneup.machine import versions


def _version_text(value: Any) -> str | None:
    """cuDNN/NCCL versions come as ints (90100), tuples ((2, 21, 5)) or strings."""
    if value is None:
        return None
    if isinstance(value, tuple):
        return ".".join(str(part) for part in value)
    if isinstance(value, int) and value >= 1000:  # cuDNN 8: 8902 -> 8.9.2; cuDNN 9: 90100 -> 9.1.0
        major, rest = (
            (value // 10000, value % 10000) if value >= 10000 else (value // 1000, value % 1000)
        )
        minor, patch = (rest // 100, rest % 100)
        return f"{major}.{minor}.{patch}"
    return str(value)


def _warning_texts(caught: list[warnings.WarningMessage]) -> list[str]:
    return [" ".join(str(w.message).split()) for w in caught]


def torch_identity(notes: list[str] | None = None,
                   messages: list[str] | None = None) -> TorchBuild:
    """The installed torch's version and build, without asking CUDA anything (no GPU, no
    NVML: what a training run's fingerprint check may afford); never raises."""
    messages = messages if messages is not None else []
    if importlib.util.find_spec("torch") is None:
        return TorchBuild(installed=False)
    build = TorchBuild(installed=True)
    try:
        import torch
    except Exception as error:  # a broken install (missing symbol, bad library path) is a fact
        build.importable = False
        build.init_error = f"import torch failed: {' '.join(str(error).split())}"
        messages.append(build.init_error)
        return build
    build.importable = True
    build.version = str(torch.__version__)
    build.debug_build = bool(getattr(torch.version, "debug", False))
    build.cuda = versions.major_minor_text(torch.version.cuda) if torch.version.cuda else None
    build.hip = getattr(torch.version, "hip", None)
    build.build = "rocm" if build.hip else "cuda" if build.cuda else "cpu"
    return build


def probe_torch(notes: list[str] | None = None, messages: list[str] | None = None,
                read_cuda: bool = True) -> TorchBuild:
    """Import torch (if installed) and read its build and CUDA state; never raises.

    ``torch.cuda.device_count()`` asks NVML itself (ctypes, ``nvmlInit``), so the CUDA state
    is read with the NVML deadline, and not at all (``read_cuda=False``) where NVML is
    known not to answer: then it stays unknown, with a note."""
    notes = notes if notes is not None else []
    messages = messages if messages is not None else []
    build = torch_identity(notes, messages)
    if not build.importable:
        return build
    if not read_cuda:
        notes.append("torch's CUDA state not read: NVML does not answer, and torch asks it "
                     "for the GPU count")
        return build
    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            build, read_notes = bounded_call("torch.cuda.device_count()",
                                             lambda: _cuda_state(torch, build))
        except NvmlTimeout as error:
            notes.append(f"torch's CUDA state not read: {error}")
            return build
    notes.extend(read_notes)
    texts = _warning_texts(caught)
    messages.extend(texts)
    if texts and build.cuda_available is False and build.init_error is None:
        build.init_error = texts[0]
    return build


def _cuda_state(torch: Any, build: TorchBuild) -> tuple[TorchBuild, list[str]]:
    """A copy of ``build`` with the CUDA state read, and the notes: a read that outlives its
    deadline changes nothing the caller holds."""
    read, notes = dataclasses.replace(build), []
    _read_cuda_state(torch, read, notes)
    return read, notes


def _read_cuda_state(torch: Any, build: TorchBuild, notes: list[str]) -> None:
    try:
        build.arch_list = list(torch.cuda.get_arch_list())
    except Exception as error:
        notes.append(f"torch.cuda.get_arch_list() failed: {error}")
    cudnn_c = getattr(torch._C, "_cudnn", None)
    if cudnn_c is not None:
        try:
            build.cudnn_compiled = _version_text(cudnn_c.getCompileVersion())
        except Exception as error:
            notes.append(f"compiled cuDNN version not read: {error}")
    try:
        build.cudnn_runtime = _version_text(torch.backends.cudnn.version())
    except Exception as error:  # e.g. "cuDNN version incompatibility: ..." — a key fact
        build.init_error = " ".join(str(error).split())
    if build.cuda:
        try:
            build.nccl = _version_text(torch.cuda.nccl.version())
        except Exception as error:
            notes.append(f"NCCL version not read: {error}")
    try:
        build.cuda_available = bool(torch.cuda.is_available())
        build.device_count = int(torch.cuda.device_count())
    except Exception as error:
        build.cuda_available = False
        build.init_error = " ".join(str(error).split())


def torch_gpus(build: TorchBuild, notes: list[str]) -> list[GPU] | None:
    """The GPUs as torch sees them (used when NVML cannot say, e.g. ROCm or no NVML library)."""
    if not build.cuda_available or not build.device_count:
        return None
    import torch

    gpus = []
    for index in range(build.device_count):
        try:
            props = torch.cuda.get_device_properties(index)
        except Exception as error:
            notes.append(f"torch could not describe GPU {index}: {error}")
            continue
        gpus.append(
            GPU(
                index=index,
                name=props.name,
                vendor="amd" if build.hip else "nvidia",
                arch=(getattr(props, "gcnArchName", None) or "").split(":")[0] or None
                if build.hip
                else None,
                compute_capability=None if build.hip else f"{props.major}.{props.minor}",
                memory_total_mib=int(props.total_memory) // 2**20,
            )
        )
    return gpus
