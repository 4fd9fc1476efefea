"""One sample of a watched job, as plain data: what the samplers read, what the verdict
rules and the view take. ``None`` means not known (no GPU, no permission, a first reading
with nothing to compare it to), never zero."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

MAIN, WORKER, HELPER = "main", "worker", "helper"  # process roles in the job's tree
# a multiprocessing child nothing has yet shown to be a DataLoader worker or a trainer
CHILD = "child"


@dataclass(frozen=True)
class GpuSample:
    """One GPU as NVML reports it at one moment."""

    index: int
    name: str | None = None
    utilization: float | None = None  # % of the last sample period a kernel ran
    memory_used: int | None = None  # bytes, all processes
    memory_total: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    throttle_reasons: tuple[str, ...] = ()  # NVML names, e.g. ("SwPowerCap",)
    pcie_rx_bytes_s: float | None = None  # host -> GPU
    pcie_tx_bytes_s: float | None = None  # GPU -> host
    pcie_link_bytes_s: float | None = None  # the link's capacity, each direction
    temperature_c: float | None = None
    job_memory: int | None = None  # bytes held by the watched job's processes
    uuid: str | None = None
    # GPU performance metrics (GPM, Hopper and newer; None elsewhere), % over the time since
    # the reading before: what utilisation does not say, how much of the GPU the kernels use
    sm_activity: float | None = None  # SMs with work (at least one warp), averaged over SMs
    sm_occupancy: float | None = None  # resident warps / the SMs' maximum
    tensor_activity: float | None = None  # SMs running tensor-core instructions


@dataclass(frozen=True)
class ProcessSample:
    """One process of the job's tree, over the time since the previous sample."""

    pid: int
    role: str  # MAIN (a training process), WORKER (a DataLoader worker), HELPER, CHILD
    cpu_percent: float | None  # % of one core
    busy_threads: int | None  # threads that used at least a fifth of a core
    threads: int
    rss: int  # bytes
    read_bytes: int | None  # cumulative, from storage


@dataclass(frozen=True)
class HostSample:
    """The machine the job runs on."""

    cpu_percent: float | None  # all cores, 0..100
    iowait_percent: float | None
    swap_bytes_s: float | None  # swapped in + out
    memory_available: int | None
    memory_total: int | None
    usable_cores: float | None  # affinity mask and cgroup quota


@dataclass(frozen=True)
class RuntimeSample:
    """The runtime's own counters, cumulative since the first batch, as ``tuned_loop`` /
    ``tuned_loader`` published them through :mod:`tuneup.watch.feed`."""

    pid: int  # the training process
    steps: int
    samples: int
    elapsed_s: float  # first batch request -> latest one
    data_wait_s: float  # inside the loader, waiting for batches
    copy_s: float  # moving batches to the device
    device: str | None = None
    num_workers: int | None = None
    pin_memory: bool | None = None
    prefetch_factor: int | None = None
    batch_size: int | None = None
    torch_threads: int | None = None
    trainer: str | None = None  # the plain-DataLoader probe: "transformers", "lightning"


@dataclass(frozen=True)
class StackCounts:
    """py-spy's samples of the thread that iterates the DataLoader (:mod:`tuneup.watch.stacks`)."""

    loading: int  # inside DataLoader frames
    total: int  # all of that thread's samples, idle ones included: wall time

    def __add__(self, other: StackCounts) -> StackCounts:
        return StackCounts(self.loading + other.loading, self.total + other.total)


@dataclass(frozen=True)
class Sample:
    """Everything read at one tick."""

    t: float  # seconds since watching began
    gpus: tuple[GpuSample, ...]
    processes: tuple[ProcessSample, ...]
    host: HostSample
    runtime: tuple[RuntimeSample, ...]  # one per training process that publishes a feed
    stacks: StackCounts | None = None  # py-spy windows that ended since the sample before

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
