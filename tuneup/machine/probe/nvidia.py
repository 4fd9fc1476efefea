"""The NVIDIA driver and GPUs through NVML (nvidia-ml-py, every call bounded by
:mod:`tuneup.machine.probe.nvml_call`) and /proc/driver/nvidia."""

from __future__ import annotations

import glob
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuneup.machine.probe.nvml_call import NvmlTimeout, bounded
from tuneup.machine.snapshot import GPU, Driver
from tuneup.machine import versions

# NVML clocks-throttle ("clocks event") reason bits and their NVML names.
THROTTLE_REASONS = (
    (0x1, "GpuIdle"),
    (0x2, "ApplicationsClocksSetting"),
    (0x4, "SwPowerCap"),
    (0x8, "HwSlowdown"),
    (0x10, "SyncBoost"),
    (0x20, "SwThermalSlowdown"),
    (0x40, "HwThermalSlowdown"),
    (0x80, "HwPowerBrakeSlowdown"),
    (0x100, "DisplayClockSetting"),
)


def throttle_reason_names(mask: int) -> list[str]:
    """NVML throttle-reason bitmask -> names (0x24 -> SwPowerCap, SwThermalSlowdown)."""
    return [name for bit, name in THROTTLE_REASONS if mask & bit]


def parse_proc_driver_version(text: str) -> str | None:
    """Driver version in ``/proc/driver/nvidia/version`` ("... Kernel Module  570.124.04 ...")."""
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return match.group(1) if match else None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _guarded(read: Callable[[], Any]) -> Any:
    """One NVML query; ``None`` when the GPU or driver does not support it."""
    try:
        return read()
    except Exception:  # NVMLError_NotSupported and friends: the fact stays unknown
        return None


def _gpu(nvml: Any, index: int) -> GPU:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    gpu = GPU(index=index, vendor="nvidia")
    name = _guarded(lambda: nvml.nvmlDeviceGetName(handle))
    gpu.name = _text(name) if name is not None else None
    capability = _guarded(lambda: nvml.nvmlDeviceGetCudaComputeCapability(handle))
    if capability:
        gpu.compute_capability = f"{capability[0]}.{capability[1]}"
    memory = _guarded(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    if memory is not None:
        gpu.memory_total_mib = int(memory.total) // 2**20
    gpu.pcie_gen_current = _guarded(lambda: nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle))
    gpu.pcie_gen_max = _guarded(lambda: nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle))
    gpu.pcie_width_current = _guarded(lambda: nvml.nvmlDeviceGetCurrPcieLinkWidth(handle))
    gpu.pcie_width_max = _guarded(lambda: nvml.nvmlDeviceGetMaxPcieLinkWidth(handle))
    persistence = _guarded(lambda: nvml.nvmlDeviceGetPersistenceMode(handle))
    gpu.persistence_mode = bool(persistence) if persistence is not None else None
    reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )
    mask = _guarded(lambda: reasons(handle)) if reasons else None
    gpu.throttle_reasons = throttle_reason_names(int(mask)) if mask is not None else None
    ecc = _guarded(lambda: nvml.nvmlDeviceGetEccMode(handle))
    if ecc is not None:
        gpu.ecc_enabled = bool(ecc[0])
        if gpu.ecc_enabled:
            gpu.ecc_uncorrected_errors = _guarded(
                lambda: nvml.nvmlDeviceGetTotalEccErrors(
                    handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
                )
            )
    return gpu


def _gpu_or_note(nvml: Any, index: int, notes: list[str]) -> GPU:
    """A GPU NVML cannot open (e.g. fallen off the bus) is still a GPU, with the reason noted."""
    try:
        return _gpu(nvml, index)
    except Exception as error:
        notes.append(f"NVML cannot open GPU {index}: {_text(error)}")
        return GPU(index=index, vendor="nvidia")


def _nvidia_device_nodes() -> bool:
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def probe_nvidia(notes: list[str] | None = None) -> tuple[Driver, list[GPU] | None]:
    """Driver and GPUs. GPUs are ``[]`` when there is no trace of NVIDIA hardware, ``None``
    when NVML failed but a driver or device node exists (visible but unreadable), or when
    NVML did not answer within its deadline (``driver.nvml_timeout_s`` says so)."""
    notes = notes if notes is not None else []
    driver = Driver()
    try:
        driver.proc_version = (
            Path("/proc/driver/nvidia/version").read_text().splitlines()[0].strip()
        )
        driver.version = parse_proc_driver_version(driver.proc_version)
    except (OSError, IndexError):
        pass
    try:
        nvml = bounded()
        nvml.nvmlInit()
    except NvmlTimeout as error:
        return driver, _stuck(driver, error, notes)
    except Exception as error:
        notes.append(f"NVML is not available ({_text(error) or type(error).__name__})")
        traces = driver.proc_version is not None or _nvidia_device_nodes()
        return driver, (None if traces else [])
    try:
        driver.version = _text(nvml.nvmlSystemGetDriverVersion())
        cuda = _guarded(nvml.nvmlSystemGetCudaDriverVersion)
        driver.cuda_version = versions.cuda_from_int(int(cuda)) if cuda else None
        gpus = [_gpu_or_note(nvml, index, notes) for index in range(nvml.nvmlDeviceGetCount())]
    except Exception as error:
        notes.append(f"NVML query failed: {_text(error)}")
        gpus = None
    finally:
        _guarded(nvml.nvmlShutdown)  # at once when a call is stuck: never into that driver
    if nvml.stuck is not None:  # a query, not the init, stopped answering
        return driver, _stuck(driver, nvml.stuck, notes)
    return driver, gpus


def _stuck(driver: Driver, error: NvmlTimeout, notes: list[str]) -> None:
    """NVML is there but does not answer: the GPUs are unknown, never "none"."""
    driver.nvml_timeout_s = error.timeout_s
    notes.append(f"{error}: the GPUs are unknown")
    return None
