"""Why a job runs at the speed it does: a window of samples -> one verdict.

Two pure steps. :func:`reduce` turns the window into the few figures the rules read (means
over the window; the runtime's counters as the difference between the window's ends).
:func:`decide` runs :data:`RULES` in order and the first rule that holds is the verdict:
the order is what to fix first (a job that swaps or whose clocks are held is that before
it is anything else). Every rule is a small function of the figures that returns a
:class:`Verdict` with the figures it rests on, or ``None``. docs/watch.md explains each.

No rule claims more than was measured: ``compute-bound`` (and its "nothing to gain from the
input side") needs a busy GPU, the runtime's data wait, workers that keep up, the stacks, or
at least a training process measured busy; a window without any of these is
``undetermined``, whose reason names what is missing and whose action how to get it.

A busy GPU is one whose SMs have work where GPM gives SM activity (Hopper and newer), and one
that runs kernels nearly all the time elsewhere (NVML's utilisation, which a single small
kernel fills); the verdict's evidence names the basis (``gpu_basis``).

Every verdict gets a :class:`Ceiling`: the most that fixing what it names can gain, from the
measured figures, or no bound where none of them bounds it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from statistics import fmean
from typing import Any

from tuneup.runtime.telemetry import STALL_HINT
from tuneup.watch.samples import CHILD, MAIN, WORKER, GpuSample, RuntimeSample, Sample, StackCounts

GPU_BUSY = 90.0  # % of the time a kernel runs: the GPU itself is the limit
# % SM activity (GPM; DCGM's DCGM_FI_PROF_SM_ACTIVE): the share of time the SMs have at least
# one warp, averaged over the SMs. DCGM's guide calls 0.8 or more necessary (not sufficient)
# for effective use of the GPU and less than 0.5 likely ineffective: from 80 % the SMs are
# busy and the GPU itself is the limit; below it, the host leaves SMs idle even while
# utilisation (some kernel ran) says 99 %.
SM_BUSY = 80.0
GPU_WORKING = 50.0  # below this, low clocks are the GPU resting, not throttling
IDLE = 5.0  # % of one core for the whole job, and % GPU utilisation
WORKER_SATURATED = 80.0  # % of one core, each DataLoader worker on average
STALL = STALL_HINT  # share of the loop's time spent waiting for data (the runtime's own hint)
COPY_SHARE = 0.15  # share of the loop's time spent copying batches to the GPU
PCIE_BUSY = 0.6  # host -> GPU traffic as a share of the link
CLOCK_HELD = 0.9  # SM clock below this share of its maximum ...
HELD_SHARE = 0.5  # ... with a power or thermal reason, in at least this share of samples
MACHINE_SATURATED = 90.0  # % of all cores busy
EXTRA_THREADS = 0.5  # busy threads beyond the usable cores, on average: one more most of the time
SWAP_BYTES_S = 1 << 20  # swapped in + out per second
GPU_MEMORY_FULL = 0.95
HOST_MEMORY_LOW = 0.05  # available share of RAM
IOWAIT = 20.0  # % of CPU time waiting for storage
STACKS = "py-spy stacks"  # ... that py-spy's samples of the training thread told apart
SM_ACTIVITY, UTILIZATION = "sm_activity", "utilization"  # the basis of "the GPU is busy"
BUSY_AT = {SM_ACTIVITY: SM_BUSY, UTILIZATION: GPU_BUSY}
UTILIZATION_NOTE = "NVML utilisation (a kernel ran), SM activity not available on this GPU"
INPUT_SIDE = "the input side"
POWER_THERMAL = frozenset({"SwPowerCap", "HwSlowdown", "SwThermalSlowdown",
                           "HwThermalSlowdown", "HwPowerBrakeSlowdown"})


@dataclass(frozen=True)
class Ceiling:
    """The most the job can speed up by fixing what its verdict names, bounded by the figures
    (Amdahl: removing a share s of the time leaves 1 - s of it, at most 1/(1-s) as fast), so
    that a verdict says how much is at stake; ``speedup_at_most`` is ``None`` where nothing
    measured bounds it, and ``why`` says so."""

    speedup_at_most: float | None
    source: str | None  # what the gain comes from ("the input side"); JSON "from"
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"speedup_at_most": self.speedup_at_most, "from": self.source, "why": self.why}


@dataclass(frozen=True)
class Verdict:
    """One kind, the line that says why, the figures it rests on, and what to change."""

    kind: str
    reason: str
    evidence: dict[str, Any]
    action: str
    ceiling: Ceiling | None = None  # set by :func:`decide`

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "reason": self.reason, "evidence": self.evidence,
                "action": self.action,
                "ceiling": self.ceiling.to_dict() if self.ceiling is not None else None}


def ceiling_line(ceiling: dict[str, Any]) -> str:
    """A ceiling (as JSON) in a few words, for the view and the summary."""
    if ceiling["speedup_at_most"] is None:
        return f"no bound: {ceiling['why']}"
    return f"at most {ceiling['speedup_at_most']:.2f}x from {ceiling['from']}"


@dataclass(frozen=True)
class Figures:
    """A window reduced to what the rules read; ``None`` = not measured in the window."""

    seconds: float
    gpus: int  # GPUs the figures below cover (those the job holds memory on, when known)
    gpu_utilization: float | None  # %, mean
    gpu_memory_share: float | None  # highest used / total
    sm_clock_ratio: float | None  # mean SM clock / its maximum
    held_share: float | None  # share of readings with a power or thermal throttle reason
    held_reasons: tuple[str, ...]
    pcie_rx_share: float | None  # mean host -> GPU traffic / link capacity
    main_cpu: float | None  # the busiest training process, % of one core
    workers: int  # DataLoader workers (most seen at once)
    worker_cpu: float | None  # % of one core, mean per worker
    job_cpu: float | None  # the whole tree, % of one core
    busy_threads: float | None  # the job's threads using a fifth of a core or more
    usable_cores: float | None
    machine_cpu: float | None  # %
    iowait: float | None  # %
    swap_bytes_s: float | None
    memory_available_share: float | None  # lowest
    steps: int | None  # optimizer steps the runtime made in the window (None: no feed)
    data_wait_share: float | None
    copy_share: float | None
    samples_per_s: float | None
    runtime: RuntimeSample | None  # the latest feed record (its loader knobs)
    loading_share: float | None = None  # py-spy: the training thread's samples in DataLoader code
    sm_activity: float | None = None  # GPM: %, mean; None unless every GPU counted gives it
    trainers: int = 0  # processes that publish a feed (most at once): the figures sum them
    children: int = 0  # multiprocessing children of unknown role (most seen at once)


def _busy_sms(readings: Sequence[GpuSample]) -> float | None:
    """Mean SM activity, only when every GPU read gives it: a GPU without GPM among GPUs
    with it would be left out of the mean."""
    known = [g for g in readings if g.sm_activity is not None]
    if not known or {g.index for g in known} != {g.index for g in readings}:
        return None
    return fmean(g.sm_activity for g in known)


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return fmean(known) if known else None


def _runtime_totals(start: Sequence[RuntimeSample], end: Sequence[RuntimeSample]
                    ) -> tuple[int, float, float, float, float]:
    """(steps, elapsed, data wait, copy, samples/s) between two readings of every trainer."""
    before = {r.pid: r for r in start}
    steps, elapsed, wait, copy, rate = 0, 0.0, 0.0, 0.0, 0.0
    for last in end:
        first = before.get(last.pid)
        span = last.elapsed_s - (first.elapsed_s if first else 0.0)
        steps += last.steps - (first.steps if first else 0)
        elapsed += span
        wait += last.data_wait_s - (first.data_wait_s if first else 0.0)
        copy += last.copy_s - (first.copy_s if first else 0.0)
        if span > 0:  # ranks train side by side: their rates add up
            rate += (last.samples - (first.samples if first else 0)) / span
    return steps, elapsed, wait, copy, rate


def _trains_off_the_gpus(window: Sequence[Sample], end: Sequence[RuntimeSample]) -> bool:
    """Every training process's feed names its device, and none is ``cuda`` (ROCm's too):
    the job trains elsewhere (``--device cpu`` on a GPU machine), whatever NVML reads of the
    GPUs. A job without a feed, or one that does not say, keeps the GPUs (NVML's process list
    cannot tell: in a container its pids are the host's)."""
    devices = {r.device for r in end} | {r.device for s in window for r in s.runtime}
    return bool(devices) and None not in devices and "cuda" not in devices


def reduce(window: Sequence[Sample],
           runtime: tuple[Sequence[RuntimeSample], Sequence[RuntimeSample]] | None = None
           ) -> Figures:
    """The figures of ``window``. ``runtime`` = the (start, end) feed readings to difference;
    by default the window's first and last (``((), final)``: the whole run up to ``final``)."""
    start, end = runtime if runtime is not None else (
        (window[0].runtime, window[-1].runtime) if window else ((), ()))
    held_gpus = {g.index for s in window for g in s.gpus if g.job_memory}
    readings = [g for s in window for g in s.gpus if not held_gpus or g.index in held_gpus]
    if not held_gpus and _trains_off_the_gpus(window, end):
        readings = []  # a CPU job on a GPU machine: the GPUs' figures are not its own
    linked = [g for g in readings if g.pcie_rx_bytes_s is not None and g.pcie_link_bytes_s]
    clocked = [g for g in readings if g.sm_clock_mhz is not None and g.sm_clock_max_mhz]
    throttle_known = [g for g in readings if g.sm_clock_mhz is not None]
    held = [g for g in throttle_known if POWER_THERMAL & set(g.throttle_reasons)]
    memory = [g.memory_used / g.memory_total for g in readings
              if g.memory_used is not None and g.memory_total]
    mains = [[p.cpu_percent for p in s.processes if p.role == MAIN and p.cpu_percent is not None]
             for s in window]
    workers = [[p.cpu_percent for p in s.processes if p.role == WORKER] for s in window]
    fed_pids = {r.pid for r in end}  # a child that published later was a trainer all along
    children = max((sum(p.role == CHILD and p.pid not in fed_pids for p in s.processes)
                    for s in window), default=0)
    measured = [s for s in window if any(p.cpu_percent is not None for p in s.processes)]
    steps, elapsed, wait, copy, rate = _runtime_totals(start, end)
    fed = bool(end)
    host = [s.host for s in window]
    stacks = sum((s.stacks for s in window if s.stacks is not None), StackCounts(0, 0))
    return Figures(
        seconds=window[-1].t - window[0].t if window else 0.0,
        gpus=len({g.index for g in readings}),
        gpu_utilization=_mean([g.utilization for g in readings]),
        gpu_memory_share=max(memory) if memory else None,
        sm_clock_ratio=_mean([g.sm_clock_mhz / g.sm_clock_max_mhz for g in clocked]),
        held_share=len(held) / len(throttle_known) if throttle_known else None,
        held_reasons=tuple(sorted({r for g in held for r in g.throttle_reasons} & POWER_THERMAL)),
        pcie_rx_share=_mean([g.pcie_rx_bytes_s / g.pcie_link_bytes_s for g in linked]),
        main_cpu=_mean([max(cpus) for cpus in mains if cpus]),
        workers=max((len(cpus) for cpus in workers), default=0),
        worker_cpu=_mean([fmean(c for c in cpus if c is not None)
                          for cpus in workers if any(c is not None for c in cpus)]),
        job_cpu=_mean([sum(p.cpu_percent or 0.0 for p in s.processes) for s in measured]),
        busy_threads=_mean([sum(p.busy_threads or 0 for p in s.processes) for s in measured]),
        usable_cores=host[-1].usable_cores if host else None,
        machine_cpu=_mean([h.cpu_percent for h in host]),
        iowait=_mean([h.iowait_percent for h in host]),
        swap_bytes_s=_mean([h.swap_bytes_s for h in host]),
        memory_available_share=min((h.memory_available / h.memory_total for h in host
                                    if h.memory_available is not None and h.memory_total),
                                   default=None),
        steps=steps if fed else None,
        data_wait_share=min(1.0, wait / elapsed) if fed and elapsed > 0 else None,
        copy_share=min(1.0, copy / elapsed) if fed and elapsed > 0 else None,
        samples_per_s=rate if fed and elapsed > 0 else None,
        runtime=end[0] if end else None,
        loading_share=stacks.loading / stacks.total if stacks.total else None,
        sm_activity=_busy_sms(readings),
        trainers=max([len(end), *(len(s.runtime) for s in window)]),
        children=children,
    )


def rounded(value: float | None, digits: int = 1) -> float | None:
    return round(value, digits) if value is not None else None


def _gpu_busy(f: Figures) -> tuple[float | None, str]:
    """How busy the GPU is (%) and on what basis: SM activity where GPM gives it, NVML's
    utilisation (a kernel ran, however few SMs it used) elsewhere."""
    if f.sm_activity is not None:
        return f.sm_activity, SM_ACTIVITY
    return f.gpu_utilization, UTILIZATION


def _gpu_evidence(f: Figures) -> dict[str, Any]:
    return {"gpu_utilization": rounded(f.gpu_utilization), "sm_activity": rounded(f.sm_activity),
            "gpu_basis": _gpu_busy(f)[1]}


def _cores(f: Figures) -> str:
    return f"{f.usable_cores:g}" if f.usable_cores is not None else "?"


def _loader_knobs(f: Figures) -> str:
    """The loader's knobs as the runtime reported them ("" without a feed)."""
    r = f.runtime
    if r is None:
        return ""
    return (f" (now num_workers={r.num_workers}, prefetch_factor={r.prefetch_factor}, "
            f"pin_memory={r.pin_memory}; {_cores(f)} usable cores)")


# -- the rules, in the order they are tried ------------------------------------------------
def idle(f: Figures, script: str) -> Verdict | None:
    """Alive, but nothing runs: no CPU, no GPU, no steps (and no storage it waits for)."""
    if f.job_cpu is None or f.job_cpu >= IDLE or (f.gpu_utilization or 0.0) >= IDLE:
        return None
    if f.steps or (f.iowait or 0.0) >= IOWAIT:
        return None
    return Verdict("idle", f"the job is alive but runs nothing ({f.job_cpu:.0f} % of a core"
                   + (f", GPU {f.gpu_utilization:.0f} %)" if f.gpus else ")"),
                   {"job_cpu_percent": rounded(f.job_cpu),
                    "gpu_utilization": rounded(f.gpu_utilization), "steps": f.steps},
                   "see what it waits on: `py-spy dump --pid PID` (a lock, a barrier, input(), "
                   "a debugger, a dead peer)")


def memory_pressure(f: Figures, script: str) -> Verdict | None:
    """Swapping, host memory nearly gone, or GPU memory nearly full."""
    swapping = (f.swap_bytes_s or 0.0) >= SWAP_BYTES_S
    low_host = f.memory_available_share is not None and f.memory_available_share < HOST_MEMORY_LOW
    full_gpu = f.gpu_memory_share is not None and f.gpu_memory_share >= GPU_MEMORY_FULL
    if not (swapping or low_host or full_gpu):
        return None
    parts = []
    if swapping:
        parts.append(f"the machine swaps {f.swap_bytes_s / 2**20:.1f} MiB/s")
    if low_host:
        parts.append(f"{f.memory_available_share:.0%} of host memory is free")
    if full_gpu:
        parts.append(f"GPU memory is {f.gpu_memory_share:.0%} full")
    action = (f"a smaller micro-batch keeps the effective batch: `tuneup autotune {script} "
              "--only batch`" if full_gpu else
              f"fewer DataLoader workers (each holds a copy of the dataset object) and a "
              f"smaller batch: `tuneup autotune {script} --only loader,batch`; free host memory")
    return Verdict("memory-pressure", "; ".join(parts),
                   {"swap_bytes_s": rounded(f.swap_bytes_s, 0),
                    "memory_available_share": rounded(f.memory_available_share, 3),
                    "gpu_memory_share": rounded(f.gpu_memory_share, 3)}, action)


def throttled(f: Figures, script: str) -> Verdict | None:
    """A working GPU whose clocks a power or thermal limit holds down."""
    if (f.held_share is None or f.held_share < HELD_SHARE or f.sm_clock_ratio is None
            or f.sm_clock_ratio >= CLOCK_HELD or (f.gpu_utilization or 0.0) < GPU_WORKING):
        return None
    return Verdict("throttled",
                   f"SM clocks at {f.sm_clock_ratio:.0%} of their maximum, held by "
                   f"{', '.join(f.held_reasons)}",
                   {"sm_clock_ratio": rounded(f.sm_clock_ratio, 2),
                    "held_share": rounded(f.held_share, 2), "reasons": list(f.held_reasons),
                    "gpu_utilization": rounded(f.gpu_utilization)},
                   "check cooling and the power limit: `nvidia-smi -q -d PERFORMANCE,POWER,"
                   "TEMPERATURE`; nothing in the script will fix it")


def cpu_oversubscribed(f: Figures, script: str) -> Verdict | None:
    """More of the job's threads want a core than there are usable cores (one more, most of
    the time), and the machine is saturated: they take turns, and every step waits for the
    slowest. A job that uses exactly its cores is not oversubscribed."""
    if (f.busy_threads is None or f.usable_cores is None or f.machine_cpu is None
            or f.busy_threads <= f.usable_cores + EXTRA_THREADS
            or f.machine_cpu < MACHINE_SATURATED):
        return None
    threads = f.runtime.torch_threads if f.runtime is not None else None
    return Verdict("cpu-oversubscribed",
                   f"{f.busy_threads:.1f} busy threads on {_cores(f)} usable cores, "
                   f"machine CPU {f.machine_cpu:.0f} %",
                   {"busy_threads": rounded(f.busy_threads), "usable_cores": f.usable_cores,
                    "machine_cpu_percent": rounded(f.machine_cpu), "workers": f.workers,
                    "torch_threads": threads},
                   "keep torch threads x (1 + num_workers) within the cores: "
                   f"`tuneup autotune {script} --only threads,loader` (or OMP_NUM_THREADS)")


def compute_bound_gpu(f: Figures, script: str) -> Verdict | None:
    """The GPU's SMs have work nearly all the time (or, without SM activity, it runs
    kernels nearly all the time): nothing to gain from the input side."""
    busy, basis = _gpu_busy(f)
    if busy is None or busy < BUSY_AT[basis]:
        return None
    reason = (f"the GPU's SMs are busy {busy:.0f} % of the time (SM activity)"
              if basis == SM_ACTIVITY else
              f"the GPU is busy {busy:.0f} % of the time; {UTILIZATION_NOTE}")
    return Verdict("compute-bound", reason,
                   {**_gpu_evidence(f), "data_wait_share": rounded(f.data_wait_share, 3)},
                   "nothing to gain from the input side; less work per step: "
                   f"`tuneup autotune {script} --only amp,compile,batch`")


def copy_bound(f: Figures, script: str) -> Verdict | None:
    """Host -> GPU copies take a large share of the loop, or fill the PCIe link."""
    copies = f.copy_share is not None and f.copy_share >= COPY_SHARE
    link = f.pcie_rx_share is not None and f.pcie_rx_share >= PCIE_BUSY
    if not f.gpus or not (copies or link):
        return None
    pinned = f.runtime.pin_memory if f.runtime is not None else None
    reason = (f"copies to the GPU take {f.copy_share:.0%} of the loop" if copies else
              f"host -> GPU traffic at {f.pcie_rx_share:.0%} of the PCIe link")
    return Verdict("copy-bound", reason,
                   {"copy_share": rounded(f.copy_share, 3),
                    "pcie_rx_share": rounded(f.pcie_rx_share, 2), "pin_memory": pinned,
                    "gpu_utilization": rounded(f.gpu_utilization)},
                   "pin host memory so copies overlap compute (pin_memory=True, non_blocking): "
                   f"`tuneup autotune {script} --only loader`; send compact dtypes (uint8 "
                   "images) and convert on the GPU")


def _workers_lead(f: Figures) -> bool:
    """Without the runtime's measure: the DataLoader workers are saturated, or each works
    harder than the training process (which then mostly waits for their batches; a worker
    that keeps up idles once its prefetch queue is full). Relative, because on a crowded
    machine a saturated worker gets less than a core."""
    if not f.workers or f.worker_cpu is None:
        return False
    return f.worker_cpu >= WORKER_SATURATED or f.worker_cpu >= (f.main_cpu or 0.0)


def input_bound(f: Figures, script: str) -> Verdict | None:
    """The loop waits for data: measured by the runtime (or seen in the training thread's
    stacks), or seen as workers that lead the training process (or storage the CPUs wait
    for) while the GPU is not busy."""
    evidence: dict[str, Any] = {}
    if f.data_wait_share is not None:
        if f.data_wait_share < STALL:
            return None
        reason = f"the loop waits for data {f.data_wait_share:.0%} of the time"
    elif f.loading_share is not None and not f.workers:
        if f.loading_share < STALL:
            return None
        reason = (f"the training thread is in the DataLoader {f.loading_share:.0%} of the time "
                  f"({STACKS})")
        evidence = {"loading_share": rounded(f.loading_share, 3), "basis": STACKS}
    elif _workers_lead(f):
        reason = (f"{f.workers} DataLoader workers at {f.worker_cpu:.0f} % of a core each, "
                  f"the main process at {f.main_cpu or 0.0:.0f} %: it waits for them")
    elif f.gpus and (f.iowait or 0.0) >= IOWAIT:
        reason = f"the CPUs wait for storage {f.iowait:.0f} % of the time"
    else:
        return None
    return Verdict("input-bound", reason,
                   {"data_wait_share": rounded(f.data_wait_share, 3), "workers": f.workers,
                    "worker_cpu_percent": rounded(f.worker_cpu),
                    "main_cpu_percent": rounded(f.main_cpu), "iowait_percent": rounded(f.iowait),
                    "usable_cores": f.usable_cores, "gpu_utilization": rounded(f.gpu_utilization),
                    "samples_per_s": rounded(f.samples_per_s), **evidence},
                   f"more DataLoader workers and prefetching{_loader_knobs(f)}: "
                   f"`tuneup autotune {script} --only loader`")


def host_bound(f: Figures, script: str) -> Verdict | None:
    """A GPU left waiting that neither the loader nor copies explain: the training process
    itself (launching small kernels, synchronising, logging) keeps it waiting."""
    if not f.gpus:
        return None
    loads_too = f.workers == 0 and (f.runtime is None or not f.runtime.num_workers)
    action = ("fewer, larger kernels: a larger batch, torch.compile or CUDA graphs: "
              f"`tuneup autotune {script} --only batch,compile`; avoid .item() and prints "
              "every step")
    if loads_too:
        action = (f"with no DataLoader workers the main process also loads the data: "
                  f"`tuneup autotune {script} --only loader` first; then " + action)
    busy, basis = _gpu_busy(f)
    main = f"while the main process runs at {f.main_cpu or 0.0:.0f} % of a core"
    reason = (f"the GPU's SMs are busy only {busy:.0f} % of the time (SM activity; kernels "
              f"run {f.gpu_utilization or 0.0:.0f} % of it) {main}" if basis == SM_ACTIVITY else
              f"the GPU is busy only {busy or 0.0:.0f} % of the time {main}; {UTILIZATION_NOTE}")
    return Verdict("host-bound", reason,
                   {**_gpu_evidence(f), "main_cpu_percent": rounded(f.main_cpu),
                    "workers": f.workers, "data_wait_share": rounded(f.data_wait_share, 3)},
                   action)


def compute_bound_cpu(f: Figures, script: str) -> Verdict | None:
    """No GPU: the loop waits little for data (runtime feed, or the training thread's stacks),
    or its workers keep up. A busy process alone is no claim: it may be loading its data
    (a job without workers decoding images runs at 100 % too)."""
    evidence: dict[str, Any] = {
        "data_wait_share": rounded(f.data_wait_share, 3), "main_cpu_percent": rounded(f.main_cpu),
        "workers": f.workers, "worker_cpu_percent": rounded(f.worker_cpu),
        "samples_per_s": rounded(f.samples_per_s)}
    if f.data_wait_share is not None:
        reason = f"the loop waits for data only {f.data_wait_share:.0%} of the time"
    elif f.workers and f.worker_cpu is not None and f.main_cpu is not None:
        reason = (f"{f.workers} DataLoader workers keep up ({f.worker_cpu:.0f} % of a "
                  f"core each) while the main process computes at {f.main_cpu:.0f} %")
    elif f.loading_share is not None and not f.children:  # else its children may train
        reason = (f"the training thread is in the DataLoader only {f.loading_share:.0%} of the "
                  f"time ({STACKS})")
        evidence.update(loading_share=rounded(f.loading_share, 3), basis=STACKS)
    else:
        return None
    return Verdict("compute-bound", reason, evidence,
                   "nothing to gain from the input side; faster compute: "
                   f"`tuneup autotune {script} --only threads,amp,compile`")


def undetermined(f: Figures, script: str) -> Verdict:
    """No GPU and nothing that tells loading from compute, or no CPU reading at all: say
    what is missing and how to get it, rather than guess."""
    if f.job_cpu is None:
        missing = "no CPU reading of the job: its processes were not sampled twice"
        action = "watch it for longer (a shorter --interval reads it sooner)"
    else:
        missing = (f"the main process runs at {f.main_cpu or 0.0:.0f} % of a core, and with no "
                   "runtime feed, no DataLoader workers measured and no py-spy stacks, loading "
                   "cannot be told from compute or waiting")
        if f.children:  # Hogwild's trainers look like forked DataLoader workers
            missing = (f"{f.children} child processes of unknown role (DataLoader workers or "
                       "trainers: neither is assumed) and no runtime feed of theirs: loading "
                       "cannot be told from compute or waiting")
        action = (f"run it under `tuneup watch -- python {script}` (its DataLoader is then "
                  "measured without a code change; a job that iterates none has no data wait "
                  "to measure), or install py-spy: pip install 'tuneup[stacks]'")
    return Verdict("undetermined", missing,
                   {"job_cpu_percent": rounded(f.job_cpu), "main_cpu_percent": rounded(f.main_cpu),
                    "workers": f.workers, "children": f.children, "steps": f.steps}, action)


# -- the ceiling of each verdict -----------------------------------------------------------
def _amdahl(share: float) -> float | None:
    """1/(1-s): the speed-up from removing a share s of the time (none when s is all of it)."""
    return round(1 / (1 - share), 2) if share < 1 else None


def _removing(share: float, what: str, source: str) -> Ceiling:
    """The ceiling from removing all of ``what``, which takes ``share`` of the time."""
    bound = _amdahl(share)
    if bound is None:
        return Ceiling(None, source, f"{what} all of the time: removing it bounds nothing")
    return Ceiling(bound, source, f"{what} {share * 100:.0f} % of the time: removing all of it "
                   f"gives at most 1/(1-{share:.2f}) = {bound:.2f}x")


def _waited(f: Figures, v: Verdict) -> tuple[float, str] | None:
    """The measured share of the loop spent loading, as the verdict read it: the feed's data
    wait, else py-spy's share of the training thread in the DataLoader."""
    if f.data_wait_share is not None:
        return f.data_wait_share, "the loop waits for data"
    if v.evidence.get("basis") == STACKS and f.loading_share is not None:
        return f.loading_share, "the training thread is in the DataLoader"
    return None


def _input_ceiling(f: Figures, v: Verdict) -> Ceiling:
    waited = _waited(f, v)
    if waited is None:
        return Ceiling(None, INPUT_SIDE, "the wait for data was not measured (workers or "
                       "storage were seen busy): the runtime's feed measures it")
    return _removing(*waited, INPUT_SIDE)


def _copy_ceiling(f: Figures, v: Verdict) -> Ceiling:
    if f.copy_share is None:
        return Ceiling(None, "the copies", "copies were seen as PCIe traffic, not measured as "
                       "a share of the loop: the runtime's feed measures it")
    return _removing(f.copy_share, "copies to the GPU take", "the copies")


def _compute_ceiling(f: Figures, v: Verdict) -> Ceiling:
    """Nothing from the input side (at most what the little wait measured gives): only
    faster compute makes the job faster."""
    faster = "only faster compute (less work per step, AMP, compile) makes it faster"
    waited = _waited(f, v)
    if waited is None:
        return Ceiling(1.0, INPUT_SIDE, f"the GPU is the limit: nothing to gain from the input "
                       f"side; {faster}")
    bounded = _removing(*waited, INPUT_SIDE)
    return replace(bounded, why=f"{bounded.why}; {faster}")


def _host_ceiling(f: Figures, v: Verdict) -> Ceiling:
    busy, basis = _gpu_busy(f)
    source = "removing host overhead"
    if not busy:
        return Ceiling(None, source, "the GPU's busy share is not known or zero: no bound")
    share = min(busy, 100.0) / 100
    what = ("the GPU's SMs are busy" if basis == SM_ACTIVITY else "kernels run")
    return Ceiling(round(1 / share, 2), source,
                   f"{what} {busy:.0f} % of the time: the GPU could do the same work in "
                   f"{busy:.0f} % of it, so removing host overhead gives at most "
                   f"1/{share:.2f} = {1 / share:.2f}x")


def _throttled_ceiling(f: Figures, v: Verdict) -> Ceiling:
    ratio = f.sm_clock_ratio
    if not ratio:
        return Ceiling(None, "full clocks", "the SM clock's ratio is not known: no bound")
    return Ceiling(round(1 / ratio, 2), "full clocks",
                   f"SM clocks at {ratio:.0%} of their maximum: at full clocks at most "
                   f"1/{ratio:.2f} = {1 / ratio:.2f}x (less where memory, not the SMs, limits it)")


def _oversubscribed_ceiling(f: Figures, v: Verdict) -> Ceiling:
    threads, cores = f.busy_threads, f.usable_cores
    source = "no more busy threads than cores"
    if not threads or not cores:
        return Ceiling(None, source, "busy threads or usable cores not known: no bound")
    return Ceiling(round(threads / cores, 2), source,
                   f"{threads:.1f} busy threads take turns on {cores:g} cores: with no more "
                   f"threads than cores at most {threads:.1f}/{cores:g} = {threads / cores:.2f}x")


CEILINGS: dict[str, Callable[[Figures, Verdict], Ceiling]] = {
    "input-bound": _input_ceiling, "copy-bound": _copy_ceiling,
    "compute-bound": _compute_ceiling, "host-bound": _host_ceiling,
    "throttled": _throttled_ceiling, "cpu-oversubscribed": _oversubscribed_ceiling}
UNBOUNDED = {  # why the other kinds have no ceiling
    "idle": "the job runs nothing: there is no running time to shorten, only a wait to end",
    "memory-pressure": "what swapping or a full memory costs is not measured as a share of the "
                       "time",
    "undetermined": "nothing measured tells loading from compute"}


def ceiling(f: Figures, v: Verdict) -> Ceiling:
    """The ceiling of verdict ``v`` over figures ``f``."""
    if v.kind in CEILINGS:
        return CEILINGS[v.kind](f, v)
    return Ceiling(None, None, UNBOUNDED.get(v.kind, "no rule bounds this verdict"))


Rule = Callable[[Figures, str], "Verdict | None"]
# host_bound always holds with a GPU, undetermined without one: some rule always does.
RULES: tuple[Rule, ...] = (idle, memory_pressure, throttled, cpu_oversubscribed,
                           compute_bound_gpu, copy_bound, input_bound, host_bound,
                           compute_bound_cpu, undetermined)


def decide(figures: Figures, script: str = "train.py") -> Verdict:
    """The first rule of :data:`RULES` that holds, with the window it covers in its evidence
    and its ceiling."""
    verdict = next(v for rule in RULES if (v := rule(figures, script)) is not None)
    verdict.evidence["window_s"] = round(figures.seconds, 1)
    return replace(verdict, ceiling=ceiling(figures, verdict))
