"""GPU figures from NVML, read through whatever module is handed in.

:func:`open_gpus` takes an nvml-like module (``pynvml`` from nvidia-ml-py by default), so
tests replay recorded readings through a stand-in with the same functions. Every query is
guarded: a figure the GPU or driver does not support stays ``None``, and a machine with no
NVML gives one note instead of GPU figures.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from tuneup.machine.probe.nvidia import throttle_reason_names
from tuneup.watch.samples import GpuSample

# Usable bytes/s per lane and direction, by PCIe generation (after line encoding).
PCIE_LANE_BYTES_S = {1: 250e6, 2: 500e6, 3: 985e6, 4: 1969e6, 5: 3938e6, 6: 7563e6}


def _guarded(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except Exception:  # NVMLError_NotSupported and friends: the figure stays unknown
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class GpuReader:
    """An initialised NVML and its GPUs; :meth:`read` gives one :class:`GpuSample` each."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(index)
                        for index in range(nvml.nvmlDeviceGetCount())]
        self.names = [_guarded(lambda h=h: _text(nvml.nvmlDeviceGetName(h)))
                      for h in self.handles]
        self.max_clocks = [
            _guarded(lambda h=h: nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_SM))
            for h in self.handles]
        self.links = [self._link_bytes_s(h) for h in self.handles]
        self._reasons = (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                         or getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None))

    def _link_bytes_s(self, handle: Any) -> float | None:
        """The link's capacity as it runs (an idle GPU may train its link down: the max)."""
        generation = _guarded(lambda: self.nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle))
        width = _guarded(lambda: self.nvml.nvmlDeviceGetCurrPcieLinkWidth(handle))
        if generation not in PCIE_LANE_BYTES_S or not width:
            return None
        return PCIE_LANE_BYTES_S[generation] * width

    def read(self, pids: Collection[int]) -> tuple[GpuSample, ...]:
        """Every GPU now; ``job_memory`` counts the memory held by ``pids``."""
        return tuple(self._read_one(index, handle, pids)
                     for index, handle in enumerate(self.handles))

    def _read_one(self, index: int, handle: Any, pids: Collection[int]) -> GpuSample:
        nvml = self.nvml
        utilization = _guarded(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        memory = _guarded(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        power = _guarded(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        limit = _guarded(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle))
        mask = _guarded(lambda: self._reasons(handle)) if self._reasons else None
        rx, tx = (_guarded(lambda c=counter: nvml.nvmlDeviceGetPcieThroughput(handle, c))
                  for counter in (nvml.NVML_PCIE_UTIL_RX_BYTES, nvml.NVML_PCIE_UTIL_TX_BYTES))
        processes = _guarded(lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        job_memory = None
        if processes is not None:
            job_memory = sum(int(p.usedGpuMemory or 0) for p in processes if p.pid in pids)
        return GpuSample(
            index=index, name=self.names[index],
            utilization=float(utilization.gpu) if utilization is not None else None,
            memory_used=int(memory.used) if memory is not None else None,
            memory_total=int(memory.total) if memory is not None else None,
            power_w=power / 1000 if power is not None else None,  # NVML: milliwatts
            power_limit_w=limit / 1000 if limit is not None else None,
            sm_clock_mhz=_guarded(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
            sm_clock_max_mhz=self.max_clocks[index],
            throttle_reasons=tuple(throttle_reason_names(int(mask))) if mask is not None else (),
            pcie_rx_bytes_s=rx * 1024 if rx is not None else None,  # NVML: KB/s
            pcie_tx_bytes_s=tx * 1024 if tx is not None else None,
            pcie_link_bytes_s=self.links[index],
            temperature_c=_guarded(
                lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
            job_memory=job_memory,
        )

    def close(self) -> None:
        _guarded(self.nvml.nvmlShutdown)


def open_gpus(nvml: Any = None) -> tuple[GpuReader | None, str | None]:
    """NVML's reader, or ``None`` and the one note that says why there are no GPU figures."""
    try:
        if nvml is None:
            import pynvml as nvml
        nvml.nvmlInit()
    except Exception as error:
        return None, (f"NVML is not available ({_text(error) or type(error).__name__}): "
                      "no GPU figures, the verdict rests on CPU and runtime figures")
    try:
        reader = GpuReader(nvml)
    except Exception as error:
        _guarded(nvml.nvmlShutdown)
        return None, f"NVML cannot list the GPUs ({_text(error)}): no GPU figures"
    if not reader.handles:
        reader.close()
        return None, "NVML sees no GPU: no GPU figures"
    return reader, None
