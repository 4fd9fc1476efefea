"""A stand-in for ``pynvml`` that replays recorded NVML readings, tick by tick.

A recording names each device's fixed facts (``devices``) and, per tick, what NVML
answered for every device (``ticks``). A figure missing from a tick raises NVML's "not
supported", as a real GPU does for queries it lacks.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

NVML_CLOCK_SM = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_TEMPERATURE_GPU = 0


class NVMLError(Exception):
    pass


class FakeNvml:
    """``FakeNvml(recording)``; :meth:`advance` moves to the next tick."""

    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVML_PCIE_UTIL_TX_BYTES = NVML_PCIE_UTIL_TX_BYTES
    NVML_PCIE_UTIL_RX_BYTES = NVML_PCIE_UTIL_RX_BYTES
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU

    def __init__(self, recording: dict[str, Any], fail_init: str | None = None) -> None:
        self.devices = recording.get("devices", [])
        self.ticks = recording.get("ticks", [])
        self.tick = -1
        self.fail_init = fail_init
        self.shut_down = False

    def advance(self) -> None:
        self.tick += 1

    def _now(self, handle: int, key: str) -> Any:
        value = self.ticks[self.tick][handle].get(key)
        if value is None:
            raise NVMLError("Not Supported")
        return value

    def _fact(self, handle: int, key: str) -> Any:
        value = self.devices[handle].get(key)
        if value is None:
            raise NVMLError("Not Supported")
        return value

    # -- the pynvml functions the watcher calls ------------------------------------------
    def nvmlInit(self) -> None:
        if self.fail_init:
            raise NVMLError(self.fail_init)

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return self._fact(handle, "name").encode()

    def nvmlDeviceGetMaxClockInfo(self, handle: int, kind: int) -> int:
        assert kind == NVML_CLOCK_SM
        return self._fact(handle, "max_sm_clock")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: int) -> int:
        return self._fact(handle, "pcie_gen")

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: int) -> int:
        return self._fact(handle, "pcie_width")

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int) -> int:
        return self._fact(handle, "power_limit_mw")

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=self._now(handle, "util"), memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        total = self._fact(handle, "memory_total")
        used = self._now(handle, "memory_used")
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return self._now(handle, "power_mw")

    def nvmlDeviceGetClockInfo(self, handle: int, kind: int) -> int:
        assert kind == NVML_CLOCK_SM
        return self._now(handle, "sm_clock")

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        return self._now(handle, "reasons")

    def nvmlDeviceGetPcieThroughput(self, handle: int, counter: int) -> int:
        return self._now(handle, "rx_kbs" if counter == NVML_PCIE_UTIL_RX_BYTES else "tx_kbs")

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return self._now(handle, "temp")

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=memory)
                for pid, memory in self._now(handle, "processes")]
