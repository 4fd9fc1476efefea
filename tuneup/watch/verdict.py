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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Any

from tuneup.runtime.telemetry import STALL_HINT
from tuneup.watch.samples import MAIN, WORKER, RuntimeSample, Sample, StackCounts

GPU_BUSY = 90.0  # % of the time a kernel runs: the GPU itself is the limit
GPU_WORKING = 50.0  # below this, low clocks are the GPU resting, not throttling
IDLE = 5.0  # % of one core for the whole job, and % GPU utilisation
CORE_BUSY = 85.0  # % of one core: a process "at 100 %"
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
CPU_ONLY = "process CPU only"  # the basis of a verdict that could not tell loading from compute
STACKS = "py-spy stacks"  # ... that py-spy's samples of the training thread told apart
POWER_THERMAL = frozenset({"SwPowerCap", "HwSlowdown", "SwThermalSlowdown",
                           "HwThermalSlowdown", "HwPowerBrakeSlowdown"})


@dataclass(frozen=True)
class Verdict:
    """One kind, the line that says why, the figures it rests on, and what to change."""

    kind: str
    reason: str
    evidence: dict[str, Any]
    action: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "reason": self.reason, "evidence": self.evidence,
                "action": self.action}


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


def reduce(window: Sequence[Sample],
           runtime: tuple[Sequence[RuntimeSample], Sequence[RuntimeSample]] | None = None
           ) -> Figures:
    """The figures of ``window``. ``runtime`` = the (start, end) feed readings to difference;
    by default the window's first and last (``((), final)``: the whole run up to ``final``)."""
    start, end = runtime if runtime is not None else (
        (window[0].runtime, window[-1].runtime) if window else ((), ()))
    held_gpus = {g.index for s in window for g in s.gpus if g.job_memory}
    readings = [g for s in window for g in s.gpus if not held_gpus or g.index in held_gpus]
    linked = [g for g in readings if g.pcie_rx_bytes_s is not None and g.pcie_link_bytes_s]
    clocked = [g for g in readings if g.sm_clock_mhz is not None and g.sm_clock_max_mhz]
    throttle_known = [g for g in readings if g.sm_clock_mhz is not None]
    held = [g for g in throttle_known if POWER_THERMAL & set(g.throttle_reasons)]
    memory = [g.memory_used / g.memory_total for g in readings
              if g.memory_used is not None and g.memory_total]
    mains = [[p.cpu_percent for p in s.processes if p.role == MAIN and p.cpu_percent is not None]
             for s in window]
    workers = [[p.cpu_percent for p in s.processes if p.role == WORKER] for s in window]
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
    )


def rounded(value: float | None, digits: int = 1) -> float | None:
    return round(value, digits) if value is not None else None


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
    """The GPU runs kernels nearly all the time: nothing to gain from the input side."""
    if f.gpu_utilization is None or f.gpu_utilization < GPU_BUSY:
        return None
    return Verdict("compute-bound", f"the GPU is busy {f.gpu_utilization:.0f} % of the time",
                   {"gpu_utilization": rounded(f.gpu_utilization),
                    "data_wait_share": rounded(f.data_wait_share, 3)},
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
    return Verdict("host-bound",
                   f"the GPU is busy only {f.gpu_utilization or 0.0:.0f} % of the time while the "
                   f"main process runs at {f.main_cpu or 0.0:.0f} % of a core",
                   {"gpu_utilization": rounded(f.gpu_utilization),
                    "main_cpu_percent": rounded(f.main_cpu), "workers": f.workers,
                    "data_wait_share": rounded(f.data_wait_share, 3)},
                   action)


def compute_bound_cpu(f: Figures, script: str) -> Verdict | None:
    """No GPU: the loop waits little for data (runtime feed, or the training thread's stacks),
    or its workers keep up; with none of these, a training process measured busy is all
    there is (said as a guess). Nothing measured, or a process that is not busy: no claim."""
    evidence: dict[str, Any] = {
        "data_wait_share": rounded(f.data_wait_share, 3), "main_cpu_percent": rounded(f.main_cpu),
        "workers": f.workers, "worker_cpu_percent": rounded(f.worker_cpu),
        "samples_per_s": rounded(f.samples_per_s)}
    if f.data_wait_share is not None:
        reason = f"the loop waits for data only {f.data_wait_share:.0%} of the time"
    elif f.workers and f.worker_cpu is not None and f.main_cpu is not None:
        reason = (f"{f.workers} DataLoader workers keep up ({f.worker_cpu:.0f} % of a "
                  f"core each) while the main process computes at {f.main_cpu:.0f} %")
    elif f.loading_share is not None:
        reason = (f"the training thread is in the DataLoader only {f.loading_share:.0%} of the "
                  f"time ({STACKS})")
        evidence.update(loading_share=rounded(f.loading_share, 3), basis=STACKS)
    elif f.main_cpu is not None and f.main_cpu >= CORE_BUSY and not f.workers:
        reason = (f"the main process computes at {f.main_cpu:.0f} % of a core; with no "
                  "DataLoader workers and no runtime feed, loading cannot be told from compute")
        evidence["basis"] = CPU_ONLY
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
        missing = (f"the main process runs at {f.main_cpu or 0.0:.0f} % of a core, not busy "
                   "computing, and with no runtime feed, no DataLoader workers measured and no "
                   "py-spy stacks, loading cannot be told from compute or waiting")
        action = (f"run it under `tuneup watch -- python {script}` (its DataLoader is then "
                  "measured without a code change; a job that iterates none has no data wait "
                  "to measure), or install py-spy: pip install 'tuneup[stacks]'")
    return Verdict("undetermined", missing,
                   {"job_cpu_percent": rounded(f.job_cpu), "main_cpu_percent": rounded(f.main_cpu),
                    "workers": f.workers, "steps": f.steps}, action)


Rule = Callable[[Figures, str], "Verdict | None"]
# host_bound always holds with a GPU, undetermined without one: some rule always does.
RULES: tuple[Rule, ...] = (idle, memory_pressure, throttled, cpu_oversubscribed,
                           compute_bound_gpu, copy_bound, input_bound, host_bound,
                           compute_bound_cpu, undetermined)


def decide(figures: Figures, script: str = "train.py") -> Verdict:
    """The first rule of :data:`RULES` that holds, with the window it covers in its evidence."""
    verdict = next(v for rule in RULES if (v := rule(figures, script)) is not None)
    verdict.evidence["window_s"] = round(figures.seconds, 1)
    return verdict
