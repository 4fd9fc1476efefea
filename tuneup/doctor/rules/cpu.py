"""CPU-side facts: on a machine without an NVIDIA GPU, what decides training speed."""

from __future__ import annotations

from tuneup.doctor.findings import INFO, WARNING
from tuneup.doctor.rules.context import Context
from tuneup.doctor.rules.performance import loader_workers, shm_needed, usable_cores

AREA = "cpu"
BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def check(ctx: Context) -> None:
    if ctx.nvidia_present or ctx.amd_gpus:
        return
    if ctx.snap.gpus is None and ctx.snap.source != "live":
        if not any("GPU" in text for _, text in ctx.diagnosis.unchecked):
            ctx.skip(AREA, "whether the machine has a GPU (the report lists none)")
        return
    ctx.add(
        "TU901",
        INFO,
        "No NVIDIA GPU found (no driver, no GPU): training runs on the CPU, where bf16 support, usable cores "
        "and /dev/shm decide the speed (facts below; tuneup autotune uses them).",
    )
    _bf16(ctx)
    _cores(ctx)


def _bf16(ctx: Context) -> None:
    flags = ctx.snap.cpu.flags
    if flags is None:
        ctx.skip(AREA, "CPU bf16 support (CPU flags unknown)")
        return
    native = [f for f in BF16_FLAGS if f in flags]
    model = ctx.snap.cpu.model or "this CPU"
    if native:
        ctx.add(
            "TU902",
            INFO,
            f"{model} has native bf16 ({', '.join(native)}): bf16 autocast is usually faster "
            "than fp32 here.",
            "with torch.autocast('cpu', dtype=torch.bfloat16): ...",
        )
    else:
        ctx.add(
            "TU902",
            INFO,
            f"{model} has no AVX512-BF16 or AMX: bf16 is emulated and rarely faster than fp32.",
            "keep fp32 on this CPU",
        )


def _cores(ctx: Context) -> None:
    cpu = ctx.snap.cpu
    cores = usable_cores(ctx)
    if cores is None:
        ctx.skip(AREA, "usable CPU cores (unknown)")
        return
    limit = (
        f" of {cpu.logical_cores} (affinity / cgroup quota)"
        if cpu.logical_cores and cpu.logical_cores > cores
        else ""
    )
    workers = loader_workers(cores, 1)
    ctx.add(
        "TU903",
        INFO,
        f"{cores:g} usable CPU cores{limit}: compute threads and DataLoader workers share them.",
        f"torch.set_num_threads({max(1, int(cores))}); DataLoader num_workers <= {workers}",
    )
    shm = cpu.shm_total_bytes
    if shm is None:
        ctx.skip(AREA, "/dev/shm size (unknown)")
        return
    needed = shm_needed(workers)
    severity = WARNING if shm < needed else INFO
    ctx.add(
        "TU904",
        severity,
        f"/dev/shm is {shm / 2**20:.0f} MiB; {workers} DataLoader worker(s) need about "
        f"{needed / 2**20:.0f} MiB.",
        "docker run --shm-size=8g (or --ipc=host)" if shm < needed else "",
    )
