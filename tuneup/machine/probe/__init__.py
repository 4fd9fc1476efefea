"""The live probe: every fact about this machine, each step guarded.

A failing step is a fact recorded in ``Snapshot.notes``, never an exception. torch and
pynvml are imported only inside the probe functions, so importing this package is cheap.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from tuneup.machine.probe.cpu import probe_cpu as _probe_cpu
from tuneup.machine.probe.cudnn import library_versions
from tuneup.machine.probe.host import (
    installed_packages,
    nvcc_version,
    probe_platform,
    select_env,
    shared_libraries,
)
from tuneup.machine.probe.nvidia import probe_nvidia as _probe_nvidia
from tuneup.machine.probe.torch_build import probe_torch as _probe_torch
from tuneup.machine.probe.torch_build import torch_gpus
from tuneup.machine.snapshot import CPU, GPU, Driver, Snapshot, TorchBuild
from tuneup.machine import versions

__all__ = ["probe_cpu", "probe_nvidia", "probe_torch", "snapshot"]

T = TypeVar("T")


def probe_torch() -> TorchBuild:
    """The installed torch and its build (imports torch; no subprocess)."""
    return _probe_torch()


def probe_cpu() -> CPU:
    """CPU model, flags, usable cores, RAM and /dev/shm."""
    return _probe_cpu()


def probe_nvidia() -> tuple[Driver, list[GPU] | None]:
    """NVIDIA driver and GPUs from NVML (``[]`` = no NVIDIA hardware, ``None`` = unknown)."""
    return _probe_nvidia()


def _guard(notes: list[str], what: str, step: Callable[[], T], default: T) -> T:
    """Run one probe step; a failure becomes a note and the step's value stays ``default``."""
    try:
        return step()
    except Exception as error:  # the probe reports, it never crashes
        notes.append(f"{what} not probed: {type(error).__name__}: {error}")
        return default


def snapshot() -> Snapshot:
    """Everything the doctor can learn about this machine (``source="live"``)."""
    notes: list[str] = []
    messages: list[str] = []
    snap = Snapshot(source="live", notes=notes, messages=messages)
    snap.platform = _guard(notes, "platform", probe_platform, snap.platform)
    snap.driver, snap.gpus = _guard(
        notes, "NVIDIA driver", lambda: _probe_nvidia(notes), (snap.driver, None)
    )
    nvml_answers = snap.driver.nvml_timeout_s is None  # torch would ask the same NVML
    snap.torch = _guard(
        notes, "torch", lambda: _probe_torch(notes, messages, nvml_answers), snap.torch
    )
    if not snap.gpus:
        from_torch = _guard(
            notes, "GPUs through torch", lambda: torch_gpus(snap.torch, notes), None
        )
        snap.gpus = from_torch or snap.gpus
    snap.cpu = _guard(notes, "CPU", lambda: _probe_cpu(notes), snap.cpu)
    snap.env = select_env(os.environ)
    snap.cuda_toolkit = _guard(notes, "nvcc", nvcc_version, None)
    snap.pip_packages = _guard(notes, "installed packages", lambda: installed_packages(notes), None)
    libraries = _guard(
        notes,
        "shared libraries",
        lambda: shared_libraries(
            ("libcudnn", "libnccl"), os.environ.get("LD_LIBRARY_PATH", ""), notes
        ),
        {},
    )
    if libraries:
        snap.cudnn_libraries = libraries["libcudnn"]
        snap.cudnn_versions = versions.distinct_versions(snap.cudnn_libraries)
        snap.cudnn_library_versions = _guard(
            notes, "cuDNN library versions",
            lambda: library_versions(snap.cudnn_libraries, notes), None)
        snap.nccl_libraries = libraries["libnccl"]
        snap.nccl_versions = versions.distinct_versions(snap.nccl_libraries)
    return snap
