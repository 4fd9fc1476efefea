"""GPU figures from NVML, read through whatever module is handed in.

:func:`open_gpus` takes an nvml-like module (``pynvml`` from nvidia-ml-py by default), so
tests replay recorded readings through a stand-in with the same functions. Every call has
the probe's deadline (:mod:`tuneup.machine.probe.nvml_call`) and every query is guarded: a
figure the GPU or driver does not support stays ``None``, and a machine with no NVML (or an
NVML that does not answer) gives one note instead of GPU figures.

NVML's utilisation only says that a kernel ran, however few SMs it kept busy. Where the GPU
has GPU performance metrics (GPM: Hopper and newer), SM activity, SM occupancy and tensor
activity are read too, between two GPM samples taken a read apart.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from time import monotonic
from typing import Any

from tuneup.machine.probe.nvidia import throttle_reason_names
from tuneup.machine.probe.nvml_call import BoundedNvml, NvmlTimeout, bounded
from tuneup.watch.samples import GpuSample

# Usable bytes/s per lane and direction, by PCIe generation (after line encoding).
PCIE_LANE_BYTES_S = {1: 250e6, 2: 500e6, 3: 985e6, 4: 1969e6, 5: 3938e6, 6: 7563e6}
# GPM metrics read into GpuSample's sm_activity, sm_occupancy, tensor_activity (% each)
GPM_METRICS = ("NVML_GPM_METRIC_SM_UTIL", "NVML_GPM_METRIC_SM_OCCUPANCY",
               "NVML_GPM_METRIC_ANY_TENSOR_UTIL")
# NVML: two GPM samples closer than its internal refresh (100 ms) give no meaningful metrics;
# a read sooner than this after the last sample (the daemon reads once per job per tick)
# gets the metrics of the last one.
GPM_MIN_INTERVAL_S = 0.1
Activity = tuple[float | None, float | None, float | None]
NO_ACTIVITY: Activity = (None, None, None)


def _guarded(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except Exception:  # NVMLError_NotSupported and friends: the figure stays unknown
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Gpm:
    """One GPU's performance metrics between its last two GPM samples (two buffers, used in
    turn): how much of the GPU the kernels used, which NVML's utilisation does not say."""

    def __init__(self, nvml: Any, handle: Any, last: Any, spare: Any) -> None:
        self.nvml = nvml
        self.handle = handle
        self.last, self.spare = last, spare
        self.taken_at: float | None = None  # when ``last`` was taken
        self.activity = NO_ACTIVITY

    def read(self) -> Activity:
        """SM activity, SM occupancy and tensor activity (%) since the sample before; none on
        the first read. Raises what NVML raises."""
        now = monotonic()
        if self.taken_at is not None and now - self.taken_at < GPM_MIN_INTERVAL_S:
            return self.activity
        self.nvml.nvmlGpmSampleGet(self.handle, self.spare)
        before, self.last, self.spare = self.last, self.spare, self.last
        if self.taken_at is not None:
            self.activity = self._metrics(before, self.last)
        self.taken_at = now
        return self.activity

    def _metrics(self, before: Any, after: Any) -> Activity:
        nvml = self.nvml
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1, request.sample2 = before, after
        for slot, name in enumerate(GPM_METRICS):
            request.metrics[slot].metricId = getattr(nvml, name)
        nvml.nvmlGpmMetricsGet(request)
        sm, occupancy, tensor = (
            float(metric.value) if metric.nvmlReturn == nvml.NVML_SUCCESS else None
            for metric in request.metrics[:len(GPM_METRICS)])
        return sm, occupancy, tensor

    def close(self) -> None:
        for sample in (self.last, self.spare):
            _guarded(lambda s=sample: self.nvml.nvmlGpmSampleFree(s))


def open_gpm(nvml: Any, handle: Any) -> Gpm | None:
    """The GPU's GPM, or ``None`` where the GPU, its driver or the nvml module lacks it."""
    support = _guarded(lambda: nvml.nvmlGpmQueryDeviceSupport(handle))
    if support is None or not support.isSupportedDevice:
        return None
    samples = [_guarded(lambda: nvml.nvmlGpmSampleAlloc()) for _ in range(2)]
    if None in samples:
        for sample in samples:
            if sample is not None:
                _guarded(lambda s=sample: nvml.nvmlGpmSampleFree(s))
        return None
    return Gpm(nvml, handle, *samples)


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
        self.uuids = [_guarded(lambda h=h: _text(nvml.nvmlDeviceGetUUID(h)))
                      for h in self.handles]
        self.links = [self._link_bytes_s(h) for h in self.handles]
        self.gpm = [open_gpm(nvml, h) for h in self.handles]
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

    def _activity(self, index: int) -> Activity:
        """The GPU's GPM figures; GPM that failed once on a GPU stays off for it."""
        gpm = self.gpm[index]
        if gpm is None:
            return NO_ACTIVITY
        try:
            return gpm.read()
        except Exception:  # an NVMLError, or a module whose GPM is not what pynvml's is
            gpm.close()
            self.gpm[index] = None
            return NO_ACTIVITY

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
        sm_activity, sm_occupancy, tensor_activity = self._activity(index)
        return GpuSample(
            index=index, name=self.names[index], uuid=self.uuids[index],
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
            sm_activity=sm_activity, sm_occupancy=sm_occupancy, tensor_activity=tensor_activity,
        )

    @property
    def note(self) -> str | None:
        """Why the GPU figures stopped, when NVML stopped answering while the job ran."""
        stuck = self.nvml.stuck if isinstance(self.nvml, BoundedNvml) else None
        return f"{stuck}: no GPU figures from then on" if stuck is not None else None

    def close(self) -> None:
        """Free GPM and shut NVML down (at once, without calling it, when NVML is stuck)."""
        for gpm in self.gpm:
            if gpm is not None:
                gpm.close()
        _guarded(self.nvml.nvmlShutdown)


def open_gpus(nvml: Any = None) -> tuple[GpuReader | None, str | None]:
    """NVML's reader, or ``None`` and the one note that says why there are no GPU figures.
    Every call goes through the probe's deadline (``TUNEUP_NVML_TIMEOUT``): a stuck NVML
    costs the watcher that long once, then its GPU figures."""
    try:
        nvml = bounded(nvml)
        nvml.nvmlInit()
    except NvmlTimeout as error:
        return None, f"{error}: no GPU figures, the verdict rests on CPU and runtime figures"
    except Exception as error:
        return None, (f"NVML is not available ({_text(error) or type(error).__name__}): "
                      "no GPU figures, the verdict rests on CPU and runtime figures")
    try:
        reader = GpuReader(nvml)
    except Exception as error:
        _guarded(nvml.nvmlShutdown)
        return None, (f"{nvml.stuck}: no GPU figures" if nvml.stuck is not None else
                      f"NVML cannot list the GPUs ({_text(error)}): no GPU figures")
    if nvml.stuck is not None:  # a GPU's query, not the count, did not answer
        reader.close()
        return None, f"{nvml.stuck}: no GPU figures"
    if not reader.handles:
        reader.close()
        return None, "NVML sees no GPU: no GPU figures"
    return reader, None
