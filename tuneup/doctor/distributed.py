"""``tuneup doctor --distributed``: time the collectives between N local ranks, and check the
setup that silently slows or hangs them, as findings in the doctor's report.

The timing follows nccl-tests: for each message size, warm-up iterations, then timed ones;
one iteration takes as long as its slowest rank, and the figure is the median iteration.
Algorithm bandwidth is ``size / time``; bus bandwidth scales it by what each rank must send
for the operation, so it compares with the link's speed whatever the rank count:
``all_reduce: algbw * 2(n-1)/n`` and ``all_gather: algbw * (n-1)/n``. The size of an
all_reduce is one rank's buffer, of an all_gather the gathered output (as nccl-tests).

The ranks are started with torch.multiprocessing and meet at a TCPStore this process holds,
so a rank that cannot join or hangs is seen from outside and stopped after ``timeout``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

import psutil
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tuneup.doctor import messages
from tuneup.doctor.findings import ERROR, WARNING, Finding, finding
from tuneup.doctor.rules.context import Diagnosis
from tuneup.errors import UsageError
from tuneup.machine.snapshot import Snapshot, printable

AREA = "nccl"
SIZES = tuple(1 << power for power in range(10, 27, 2))  # 1 KiB .. 64 MiB, x4 per step
WARMUP, ITERATIONS = 5, 20  # nccl-tests' defaults (-w 5 -n 20)
DEFAULT_TIMEOUT = 60.0
HOST = "127.0.0.1"  # local ranks meet over loopback
POLL = 0.1
OPERATIONS = ("all_reduce", "all_gather")
ELEMENT_BYTES = 4  # float32
RANK_BYTES = 200 << 20  # a gloo rank's resident memory, with a margin (measured ~135 MB)
RANKS_PER_CORE = 4  # gloo ranks mostly wait on each other; beyond this they time out
# NCCL's troubleshooting guide: in containers, --shm-size=1g --ulimit memlock=-1
# (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html)
NCCL_SHM_ADVISED = 1 << 30
EVIDENCE_CHARS = 300  # of one line of a rank's error or NCCL's warnings
FORMULA = ("algbw = size / time; busbw = algbw * 2(n-1)/n for all_reduce, algbw * (n-1)/n for "
           "all_gather (n ranks; GB/s = 1e9 bytes/s; size: all_reduce's buffer per rank, "
           "all_gather's whole output, as nccl-tests)")


@dataclass(frozen=True)
class Timing:
    """One operation at one message size."""

    operation: str
    size_bytes: int
    seconds: float  # median over iterations of the slowest rank's time
    algbw_gbps: float
    busbw_gbps: float


@dataclass
class Measurement:
    """What the ranks measured, or how they failed (``failure``; ``phase`` says where)."""

    backend: str
    ranks: int
    timeout_s: float
    timings: list[Timing] = field(default_factory=list)
    joined_s: float | None = None  # from the start to every rank in the process group
    phase: str | None = None  # "rendezvous" or "collectives" when it failed
    failure: str | None = None
    note: str | None = None  # what the plan means for the figures (plan_note)
    evidence: list[str] = field(default_factory=list)  # a rank's error, NCCL's WARN lines

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "formula": FORMULA, "warmup": WARMUP, "iterations": ITERATIONS}


def algbw(size_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s: the bytes of the operation over its time."""
    return size_bytes / seconds / 1e9


def busbw(operation: str, algbw_gbps: float, ranks: int) -> float:
    """Bus bandwidth in GB/s: algbw times the share of the data each rank must send and
    receive for ``operation`` with a ring, comparable with the hardware's link speed."""
    factor = {"all_reduce": 2 * (ranks - 1) / ranks, "all_gather": (ranks - 1) / ranks}
    return algbw_gbps * factor[operation]


def message_bytes(operation: str, size: int, ranks: int) -> int:
    """The bytes ``operation`` moves at nominal ``size``: an all_gather's output is whole
    float32 parts, one per rank."""
    elements = max(1, size // ELEMENT_BYTES)
    if operation == "all_gather":
        elements = max(1, elements // ranks) * ranks
    return elements * ELEMENT_BYTES


def plan(nproc: int | None, cores: float | None = None, gpus: int = 0,
         nccl: bool = False) -> tuple[str, int]:
    """The backend and rank count, from the probe's facts (``gpus`` torch sees, ``nccl``: the
    build has NCCL): NCCL with one rank per GPU wherever there is a GPU (a single GPU gets a
    one-rank communicator), gloo on the CPU only where there is none (2 ranks unless told, at
    most what ``cores`` and the free memory hold)."""
    if gpus < 1 or not nccl:
        if nproc is not None:
            _refuse_more_than_the_host_holds(nproc, cores)
        return "gloo", nproc or 2
    if nproc is not None and nproc > gpus:
        raise UsageError(f"--nproc {nproc} needs {nproc} GPUs for NCCL (one per rank); this "
                         f"machine has {gpus}")
    return "nccl", nproc or gpus


def plan_note(backend: str, ranks: int, gpus: int, nccl_version: str | None) -> str | None:
    """What the report says about the plan beside the figures: why gloo on a GPU machine, or
    what one NCCL rank proves and does not."""
    if backend == "nccl" and ranks == 1:
        library = f"NCCL {nccl_version}" if nccl_version else "NCCL"
        return (f"one GPU: a one-rank {library} communicator runs all_reduce and all_gather, "
                "which proves NCCL loads and runs; bus bandwidth needs two GPUs (one rank "
                "moves no data between GPUs)")
    if backend == "gloo" and gpus > 0:
        return (f"{gpus} GPU(s), but this torch build has no NCCL: gloo on the CPU, so NCCL "
                "is not checked")
    if backend == "gloo":
        return "no GPU visible to torch: gloo ranks on the CPU (NCCL needs an NVIDIA GPU)"
    return None


def _refuse_more_than_the_host_holds(nproc: int, cores: float | None) -> None:
    """Each gloo rank is a Python process with torch (about 135 MB: 64 ranks took 8.6 GB) and
    a busy core: far more ranks than cores or memory would time out and be blamed on the
    network."""
    available = psutil.virtual_memory().available
    limits = [(int(available // RANK_BYTES), f"{available / 2**30:.1f} GiB of free memory")]
    if cores:
        limits.append((int(RANKS_PER_CORE * cores), f"{cores:g} usable cores"))
    most, reason = min(limits)
    if nproc > max(2, most):
        raise UsageError(f"--nproc {nproc} starts {nproc} CPU ranks; {reason} hold at most "
                         f"{max(2, most)}: give a smaller --nproc")


# -- the ranks ------------------------------------------------------------------------------
def _rank(rank: int, port: int, ranks: int, backend: str, sizes: Sequence[int],
          timeout: float, logs: str | None = None) -> None:
    """One rank: join through the parent's store, time every operation and size, report.
    NCCL writes its warnings to ``logs``, where the parent reads them."""
    if logs is not None:
        nccl_warnings_to(logs, rank, os.environ)
    wait = timedelta(seconds=timeout)
    store = dist.TCPStore(HOST, port, ranks, False, timeout=wait)
    dist.init_process_group(backend, store=store, rank=rank, world_size=ranks, timeout=wait)
    store.set(f"joined/{rank}", repr(time.time()))  # the parent reads when all had joined
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    times: dict[str, list[list[float]]] = {}
    for operation in OPERATIONS:
        times[operation] = []
        for size in sizes:
            store.set(f"at/{rank}", f"{operation} of {_size(size)}")
            times[operation].append(_time(_operation(operation, size, ranks, backend, device)))
    store.set(f"result/{rank}", json.dumps(times))
    dist.destroy_process_group()


def nccl_warnings_to(logs: str, rank: int, environ: MutableMapping[str, str]) -> None:
    """Have NCCL write its warnings (NCCL's own words on what failed) to a file in ``logs``;
    not where the user set NCCL_DEBUG or NCCL_DEBUG_FILE: their output stays where they
    asked for it."""
    if not {"NCCL_DEBUG", "NCCL_DEBUG_FILE"} & set(environ):
        environ["NCCL_DEBUG"] = "WARN"
        environ["NCCL_DEBUG_FILE"] = os.path.join(logs, f"rank{rank}.log")


def _operation(operation: str, size: int, ranks: int, backend: str,
               device: torch.device) -> Callable[[], None]:
    """One call of ``operation`` at ``size`` on fixed buffers, waiting for the device."""
    elements = message_bytes(operation, size, ranks) // ELEMENT_BYTES
    if operation == "all_reduce":
        buffer = torch.ones(elements, device=device)

        def call() -> None:
            dist.all_reduce(buffer)
    else:
        output = torch.empty(elements, device=device)
        part = torch.ones(elements // ranks, device=device)
        parts = list(output.chunk(ranks))
        # NCCL into one output buffer, as nccl-tests (all_gather_single from torch 2.13 on);
        # gloo into a list, which it supports on every torch release
        single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

        def call() -> None:
            if backend == "nccl":
                single(output, part)
            else:
                dist.all_gather(parts, part)
    if device.type != "cuda":
        return call

    def synchronised() -> None:
        call()
        torch.cuda.synchronize(device)

    return synchronised


def _time(run: Callable[[], None]) -> list[float]:
    for _ in range(WARMUP):
        run()
    times = []
    for _ in range(ITERATIONS):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return times


# -- the parent -----------------------------------------------------------------------------
def measure(nproc: int, backend: str, timeout: float = DEFAULT_TIMEOUT,
            sizes: Sequence[int] = SIZES) -> Measurement:
    """Start ``nproc`` ranks, wait for them (``timeout`` for the rendezvous, then again for
    the collectives) and return the timings, or the failure; the ranks never outlive it."""
    store = dist.TCPStore(HOST, 0, None, True, timeout=timedelta(seconds=timeout),
                          wait_for_workers=False)
    result = Measurement(backend, nproc, timeout)
    logs = tempfile.TemporaryDirectory(prefix="tuneup-nccl-") if backend == "nccl" else None
    started, wall = time.monotonic(), time.time()
    context = mp.start_processes(
        _rank, args=(store.port, nproc, backend, tuple(sizes), timeout, logs and logs.name),
        nprocs=nproc, join=False, start_method="spawn")
    spawn_log = logging.getLogger("torch.multiprocessing.spawn")
    level = spawn_log.level
    spawn_log.setLevel(logging.ERROR)  # its "Terminating process" note: the finding says why
    try:
        _watch(context, store, result, started)
    finally:
        spawn_log.setLevel(level)
        for process in context.processes:
            if process.is_alive():
                process.kill()
            process.join()
        _remove_error_files(context)
        if logs is not None:
            result.evidence.extend(nccl_warnings(Path(logs.name)))
            logs.cleanup()
    if result.failure is None:
        result.joined_s = max(float(store.get(f"joined/{rank}")) for rank in range(nproc)) - wall
        reports = [json.loads(store.get(f"result/{rank}")) for rank in range(nproc)]
        result.timings = _timings(reports, sizes, nproc)
    return result


def _remove_error_files(context: mp.ProcessContext) -> None:
    """torch.multiprocessing gives each rank a traceback file in the temporary directory and
    never removes it; a rank that failed would leave its file behind."""
    for path in context.error_files:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _watch(context: mp.ProcessContext, store: dist.TCPStore, result: Measurement,
           started: float) -> None:
    """Wait for the ranks; on a failure or a deadline, say which ranks and where."""
    ranks, deadline, joined = result.ranks, started + result.timeout_s, False
    while True:
        try:
            if context.join(POLL):
                return
        except mp.ProcessRaisedException as exc:
            result.evidence.extend(_tail(exc.msg))
            _failed(result, store, f"rank {exc.error_index} failed: {_last_line(exc.msg)}")
            return
        except mp.ProcessExitedException as exc:
            if _all(store, "result", ranks):  # every rank reported: it died tearing down
                return  # (gloo's threads can abort interpreter exit, pytorch/pytorch#179291)
            _failed(result, store, f"rank {exc.error_index} {_exit_text(exc.exit_code)}")
            return
        now = time.monotonic()
        if not joined and _all(store, "joined", ranks):  # the collectives get their own time
            joined, deadline = True, now + result.timeout_s
        if now > deadline:
            _failed(result, store, None)
            return


def _failed(result: Measurement, store: dist.TCPStore, error: str | None) -> None:
    """Record the failure: ``error`` from a rank, or (None) the deadline passed."""
    joined = [rank for rank in range(result.ranks) if store.check([f"joined/{rank}"])]
    where = f"{result.ranks} local {result.backend} ranks"
    if len(joined) < result.ranks:
        result.phase = "rendezvous"
        missing = [rank for rank in range(result.ranks) if rank not in joined]
        result.failure = (f"{where} could not rendezvous: {error}" if error else
                          f"{_ranks(missing)} of {where} did not join the process group "
                          f"within {result.timeout_s:g} s")
        return
    result.phase = "collectives"
    if error:
        result.failure = f"{where} joined, but {error}"
        return
    stuck = [f"rank {rank} in {store.get(f'at/{rank}').decode()}" for rank in range(result.ranks)
             if not store.check([f"result/{rank}"]) and store.check([f"at/{rank}"])]
    result.failure = (f"{where} joined, but the collectives did not complete within "
                      f"{result.timeout_s:g} s ({', '.join(stuck) or 'no rank started'})")


def _all(store: dist.TCPStore, key: str, ranks: int) -> bool:
    return store.check([f"{key}/{rank}" for rank in range(ranks)])


def _timings(reports: list[dict[str, list[list[float]]]], sizes: Sequence[int],
             ranks: int) -> list[Timing]:
    timings = []
    for operation in OPERATIONS:
        for index, size in enumerate(sizes):
            slowest = [max(step) for step in zip(*(r[operation][index] for r in reports))]
            seconds = statistics.median(slowest)
            moved = message_bytes(operation, size, ranks)
            bandwidth = algbw(moved, seconds)
            timings.append(Timing(operation, moved, seconds, bandwidth,
                                  busbw(operation, bandwidth, ranks)))
    return timings


def _last_line(text: str, limit: int = 300) -> str:
    """The exception line at the end of a rank's traceback, cut to ``limit``."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = lines[-1] if lines else "no message"
    return line if len(line) <= limit else line[:limit - 1] + "…"


def _tail(text: str, lines: int = 12) -> list[str]:
    """The end of a rank's error, where torch puts NCCL's message ("Last error: ...")."""
    kept = [printable(line.strip(), EVIDENCE_CHARS) for line in text.strip().splitlines()]
    return [line for line in kept if line][-lines:]


def nccl_warnings(logs: Path, most: int = 20) -> list[str]:
    """The ``NCCL WARN`` lines the ranks wrote to their debug files in ``logs``."""
    found: list[str] = []
    for path in sorted(logs.glob("rank*.log")):
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read(1 << 20)
        found.extend(printable(line.strip(), EVIDENCE_CHARS) for line in text.splitlines()
                     if "NCCL WARN" in line)
    return list(dict.fromkeys(found))[:most]


def _exit_text(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _size(size: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):g} {unit}"
    return f"{size} B"


# -- the checks -----------------------------------------------------------------------------
def interface_findings(environ: Mapping[str, str], interfaces: set[str],
                       backend: str) -> tuple[list[Finding], list[str]]:
    """Findings for NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME naming no interface here, and
    what passed. Gloo takes exact names (each must exist); NCCL takes prefixes, ``=name``
    for an exact one, and ``^`` to exclude (an exclusion list names nothing to find)."""
    found, passed = [], []
    listed = ", ".join(sorted(interfaces)) or "none"
    gloo = environ.get("GLOO_SOCKET_IFNAME")
    if gloo:
        missing = [name for name in gloo.split(",") if name.strip() not in interfaces]
        if missing:
            found.append(finding(
                "TU422", ERROR,
                f"GLOO_SOCKET_IFNAME={gloo} names {', '.join(missing)}, which this machine does "
                f"not have (interfaces: {listed}): gloo fails to start every process group.",
                "set GLOO_SOCKET_IFNAME to the interface that reaches the other nodes, or unset "
                "it (ip -br addr lists them)"))
        else:
            passed.append(f"GLOO_SOCKET_IFNAME={gloo} names interfaces of this machine")
    nccl = environ.get("NCCL_SOCKET_IFNAME")
    if nccl and not nccl.startswith("^"):
        if not any(_nccl_matches(entry.strip(), interfaces) for entry in nccl.split(",")):
            found.append(finding(
                "TU422", ERROR if backend == "nccl" else WARNING,
                f"NCCL_SOCKET_IFNAME={nccl} matches no interface of this machine (NCCL reads "
                f"prefixes; interfaces: {listed}): NCCL finds no socket to bootstrap with and "
                "fails or hangs at init.",
                "set NCCL_SOCKET_IFNAME to the interface (or prefix) that reaches the other "
                "nodes, or unset it"))
        else:
            passed.append(f"NCCL_SOCKET_IFNAME={nccl} matches an interface of this machine")
    return found, passed


def _nccl_matches(entry: str, interfaces: set[str]) -> bool:
    if entry.startswith("="):
        return entry[1:] in interfaces
    return any(name.startswith(entry) for name in interfaces)


def shm_finding(shm_bytes: int | None, in_container: bool | None) -> Finding | None:
    """A warning when /dev/shm is below what NCCL advises for its shared-memory transport."""
    if shm_bytes is None or shm_bytes >= NCCL_SHM_ADVISED:
        return None
    where = "in this container " if in_container else ""
    return finding(
        "TU423", WARNING,
        f"/dev/shm {where}is {shm_bytes / 2**20:.0f} MiB: NCCL keeps its shared-memory transport "
        "buffers there and fails at init when it cannot grow them ('failed to extend "
        "/dev/shm/nccl-…'); NCCL advises at least 1 GiB.",
        "docker run --ipc=host (or --shm-size=1g --ulimit memlock=-1); Kubernetes: mount an "
        "emptyDir with medium: Memory at /dev/shm")


_FIXES = {
    "TU420": "rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL (and NCCL_DEBUG=INFO); check the "
             "socket-interface variables and firewalls on loopback; a slow start needs a longer "
             "--timeout",
    "TU421": "rerun with NCCL_DEBUG=INFO (or TORCH_DISTRIBUTED_DEBUG=DETAIL) to see the "
             "transport; check NCCL_P2P/SHM/IB settings and /dev/shm",
}


def check(snapshot: Snapshot, diagnosis: Diagnosis, nproc: int | None,
          timeout: float) -> Measurement:
    """Run the checks and the measurement on this machine; add their findings to
    ``diagnosis`` (NCCL_*_DISABLE is the nccl rules' TU403, already in it)."""
    torch = snapshot.torch
    gpus = (torch.device_count or 0) if torch.cuda_available else 0
    backend, ranks = plan(nproc, snapshot.cpu.usable_cores, gpus, torch.nccl is not None)
    found, passed = interface_findings(os.environ, set(psutil.net_if_addrs()), backend)
    if backend == "nccl" and not _switched_on(os.environ.get("NCCL_SHM_DISABLE")):
        shm = shm_finding(snapshot.cpu.shm_total_bytes, snapshot.platform.in_container)
        if shm is not None:
            found.append(shm)
        elif snapshot.cpu.shm_total_bytes is None:
            diagnosis.unchecked.append((AREA, "/dev/shm for NCCL's shared-memory transport "
                                              "(size unknown)"))
        else:
            passed.append(f"/dev/shm {snapshot.cpu.shm_total_bytes / 2**30:.1f} GiB for NCCL's "
                          "shared-memory transport")
    result = measure(ranks, backend, timeout, SIZES)
    result.note = plan_note(backend, ranks, gpus, torch.nccl)
    if result.failure is not None:
        found.append(failure_finding(result))
    else:
        passed.append(_summary(result))
    diagnosis.findings.extend(f for f in found if f not in diagnosis.findings)
    diagnosis.passed.extend((AREA, text) for text in passed)
    return result


def failure_finding(result: Measurement) -> Finding:
    """TU420 / TU421 for a failed measurement; where the rank's error or NCCL's warnings hold
    a text of the doctor's message registry, its cause and its fix."""
    code = "TU420" if result.phase == "rendezvous" else "TU421"
    known = _known_message(result.evidence)
    if known is None:
        return finding(code, ERROR, result.failure + ".", _FIXES[code])
    message, line = known
    return finding(code, ERROR, f"{result.failure}; the rank said '{line}': {message.means}.",
                   message.fix)


def _known_message(evidence: list[str]) -> tuple[messages.Message, str] | None:
    """The first registry message in ``evidence`` (NCCL's lines before torch's summary of
    them), with the line that holds it, cut short."""
    ordered = sorted(evidence, key=lambda line: "NCCL WARN" not in line)
    for line in ordered:
        for name in messages.recognised(line):
            message = messages.BY_NAME[name]
            if message.category != "program-error":
                return message, line if len(line) <= 160 else line[:159] + "…"
    return None


def _switched_on(value: str | None) -> bool:
    return value is not None and value.strip() not in ("", "0")


def _summary(result: Measurement) -> str:
    if result.ranks == 1:
        return (f"1 local {result.backend} rank joined in {result.joined_s:.1f} s and ran "
                "all_reduce and all_gather: NCCL loads and runs on this GPU; bus bandwidth "
                "needs two GPUs")
    best = max((t for t in result.timings if t.operation == "all_reduce"),
               key=lambda t: t.busbw_gbps)
    return (f"{result.ranks} local {result.backend} ranks joined in {result.joined_s:.1f} s; "
            f"all_reduce bus bandwidth up to {best.busbw_gbps:.2f} GB/s "
            f"(at {_size(best.size_bytes)})")


# -- output ---------------------------------------------------------------------------------
def write_table(result: Measurement, out: IO[str] | None = None) -> None:
    """The nccl-tests-like table (rich), one row per size, and the formula under it."""
    from rich import box
    from tuneup import terminal
    from rich.table import Table

    if not result.timings:
        return
    console = terminal.console(file=out, highlight=False, soft_wrap=True)
    table = Table(title=f"Collectives: {result.ranks} local ranks, {result.backend}, median of "
                        f"{ITERATIONS} iterations after {WARMUP} warm-up (bandwidth in GB/s)",
                  title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("size", justify="right")
    for operation in OPERATIONS:
        table.add_column(f"{operation} µs", justify="right")
        table.add_column("algbw", justify="right")
        table.add_column("busbw", justify="right")
    by_operation = {op: [t for t in result.timings if t.operation == op] for op in OPERATIONS}
    for row in zip(*by_operation.values()):
        table.add_row(_size(row[0].size_bytes), *(
            text for t in row for text in (f"{t.seconds * 1e6:,.0f}", f"{t.algbw_gbps:.3f}",
                                           f"{t.busbw_gbps:.3f}")))
    console.print()
    console.print(table)
    console.print(FORMULA)
    if result.note:
        console.print(result.note)


def write_json(snapshot: Snapshot, diagnosis: Diagnosis, result: Measurement,
               out: IO[str]) -> None:
    """The doctor's JSON object with the measurement under ``"distributed"``."""
    from tuneup.doctor.report import to_json

    document = to_json(snapshot, diagnosis)
    document["distributed"] = result.to_dict()
    json.dump(document, out, indent=2, allow_nan=False)
    out.write("\n")
