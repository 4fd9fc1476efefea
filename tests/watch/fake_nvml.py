"""A stand-in for ``pynvml`` that replays recorded NVML readings, tick by tick.

A recording names each device's fixed facts (``devices``) and, per tick, what NVML
answered for every device (``ticks``). A figure missing from a tick raises NVML's "not
supported", as a real GPU does for queries it lacks.

A device whose facts say ``"gpm": true`` offers GPU performance metrics the way pynvml's
GPM functions do (Hopper and newer): ``sm_active``, ``sm_occupancy`` and ``tensor_active``
of the tick of the later sample, in %; one missing from that tick is that metric's "not
supported". ``gpm_error`` makes every GPM metrics call raise.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import pytest

NVML_CLOCK_SM = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_TEMPERATURE_GPU = 0
NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_GPM_METRICS_GET_VERSION = 1
GPM_KEYS = {2: "sm_active", 3: "sm_occupancy", 5: "tensor_active"}  # pynvml's metric ids


class NVMLError(Exception):
    pass


class MetricsGet:
    """pynvml's ``c_nvmlGpmMetricsGet_t``, as plain attributes."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: SimpleNamespace | None = None
        self.sample2: SimpleNamespace | None = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=NVML_SUCCESS, value=0.0)
                        for _ in range(8)]


def tick_clock(monkeypatch: pytest.MonkeyPatch, seconds: float = 1.0) -> None:
    """The watcher's clock for GPM samples moves ``seconds`` a look, as a recording's ticks do
    (replayed at once, they would all fall within GPM's 100 ms)."""
    counter = itertools.count(step=seconds)
    monkeypatch.setattr("tuneup.watch.nvml.monotonic", lambda: float(next(counter)))


class FakeNvml:
    """``FakeNvml(recording)``; :meth:`advance` moves to the next tick."""

    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVML_PCIE_UTIL_TX_BYTES = NVML_PCIE_UTIL_TX_BYTES
    NVML_PCIE_UTIL_RX_BYTES = NVML_PCIE_UTIL_RX_BYTES
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVML_SUCCESS = NVML_SUCCESS
    NVML_GPM_METRICS_GET_VERSION = NVML_GPM_METRICS_GET_VERSION
    NVML_GPM_METRIC_SM_UTIL = 2
    NVML_GPM_METRIC_SM_OCCUPANCY = 3
    NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
    c_nvmlGpmMetricsGet_t = MetricsGet

    def __init__(self, recording: dict[str, Any], fail_init: str | None = None,
                 gpm_error: str | None = None) -> None:
        self.devices = recording.get("devices", [])
        self.ticks = recording.get("ticks", [])
        self.tick = -1
        self.fail_init = fail_init
        self.shut_down = False
        self.gpm_error = gpm_error
        self.gpm_calls = 0  # nvmlGpmMetricsGet calls
        self.gpm_samples: list[SimpleNamespace] = []  # allocated and not freed

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

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self._fact(handle, "uuid")

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

    # -- GPM (Hopper and newer) ------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(version=1, isSupportedDevice=int(bool(
            self.devices[handle].get("gpm"))))

    def nvmlGpmSampleAlloc(self) -> SimpleNamespace:
        sample = SimpleNamespace(handle=None, tick=None)
        self.gpm_samples.append(sample)
        return sample

    def nvmlGpmSampleFree(self, sample: SimpleNamespace) -> None:
        self.gpm_samples.remove(sample)

    def nvmlGpmSampleGet(self, handle: int, sample: SimpleNamespace) -> SimpleNamespace:
        assert sample in self.gpm_samples
        sample.handle, sample.tick = handle, self.tick
        return sample

    def nvmlGpmMetricsGet(self, request: MetricsGet) -> MetricsGet:
        self.gpm_calls += 1
        if self.gpm_error:
            raise NVMLError(self.gpm_error)
        first, second = request.sample1, request.sample2
        assert request.version == NVML_GPM_METRICS_GET_VERSION
        assert first is not second and first.handle == second.handle
        assert first.tick < second.tick
        for metric in request.metrics[:request.numMetrics]:
            value = self.ticks[second.tick][second.handle].get(GPM_KEYS[metric.metricId])
            metric.nvmlReturn = NVML_SUCCESS if value is not None else NVML_ERROR_NOT_SUPPORTED
            metric.value = float(value or 0.0)
        return request
