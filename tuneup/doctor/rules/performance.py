"""Performance rules: PCIe link, persistence, throttling, ECC, CPU cores and /dev/shm per GPU."""

from __future__ import annotations

from tuneup.doctor import knowledge as kb
from tuneup.doctor.findings import INFO, WARNING
from tuneup.doctor.rules.context import Context

AREA = "performance"
MIN_CORES_PER_GPU = 4  # a main process plus ~3 DataLoader workers per GPU
PREFETCH_FACTOR = 2  # DataLoader default
BATCH_BYTES = 64 * 2**20  # assumed size of one collated batch held in /dev/shm
SLOWDOWN_WORDS = ("thermal", "power", "hwslowdown", "hw_slowdown", "powerbrake")


def check(ctx: Context) -> None:
    for gpu in ctx.nvidia_gpus:
        raw = gpu.raw
        _pcie(
            ctx,
            gpu.name,
            raw.pcie_width_current,
            raw.pcie_width_max,
            raw.pcie_gen_current,
            raw.pcie_gen_max,
        )
        if raw.persistence_mode is False and ctx.os_family == "linux":
            ctx.add(
                "TU803",
                INFO,
                f"{gpu.name}: persistence mode is off; each new process pays driver start-up.",
                "sudo nvidia-smi -pm 1 (or enable the nvidia-persistenced service)",
            )
        slow = [
            r for r in raw.throttle_reasons or [] if any(w in r.lower() for w in SLOWDOWN_WORDS)
        ]
        if slow:
            ctx.add(
                "TU804",
                WARNING,
                f"{gpu.name} is throttling its clocks: {', '.join(slow)}.",
                "check cooling and power limits: nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE",
            )
        if raw.ecc_uncorrected_errors:
            ctx.add(
                "TU807",
                WARNING,
                f"{gpu.name} reports {raw.ecc_uncorrected_errors} uncorrected ECC errors.",
                "nvidia-smi -q -d ECC; reset the GPU (nvidia-smi -r) or have the board checked",
            )
        if gpu.cc:
            features = kb.hardware_features(gpu.cc)
            listed = ", ".join(f"{name} {'yes' if on else 'no'}" for name, on in features.items())
            ctx.add("TU905", INFO, f"{gpu.name} (CC {gpu.cc}): {listed}.")
    if ctx.nvidia_gpus:
        _cores(ctx, len(ctx.nvidia_gpus))
        _shm(ctx, len(ctx.nvidia_gpus))


def _pcie(
    ctx: Context,
    name: str,
    width: int | None,
    width_max: int | None,
    gen: int | None,
    gen_max: int | None,
) -> None:
    if width and width_max and width < width_max:
        ctx.add(
            "TU801",
            WARNING,
            f"{name}: PCIe link x{width} of x{width_max}; host-device copies run slower.",
            "reseat the card in a full-width slot or check the BIOS lane split",
        )
    if gen and gen_max and gen < gen_max:
        ctx.add(
            "TU802",
            INFO,
            f"{name}: PCIe gen {gen} of gen {gen_max} (normal while idle; a problem under load).",
            "re-check under load: nvidia-smi --query-gpu=pcie.link.gen.current,pcie.link.gen.max --format=csv",
        )


def usable_cores(ctx: Context) -> float | None:
    cpu = ctx.snap.cpu
    return cpu.usable_cores if cpu.usable_cores is not None else cpu.logical_cores


def loader_workers(cores: float, gpus: int) -> int:
    """DataLoader workers per GPU the usable cores allow (one core kept for the main process)."""
    return max(1, int(cores / max(gpus, 1)) - 1)


def _cores(ctx: Context, gpus: int) -> None:
    cores = usable_cores(ctx)
    if cores is None:
        ctx.skip(AREA, "CPU cores per GPU (core count unknown)")
        return
    per_gpu = cores / gpus
    if per_gpu < MIN_CORES_PER_GPU:
        ctx.add(
            "TU805",
            WARNING,
            f"{cores:g} usable CPU cores for {gpus} GPU(s) = {per_gpu:.1f} per GPU (< {MIN_CORES_PER_GPU}); "
            "data loading will likely starve the GPUs.",
            "give the job more CPUs (docker --cpus, Kubernetes CPU limits, taskset) or move decoding/"
            "augmentation to the GPU; keep num_workers <= usable cores per GPU - 1",
        )
    else:
        ctx.ok(AREA, f"{per_gpu:.1f} usable CPU cores per GPU")


def shm_needed(workers: int) -> int:
    return workers * PREFETCH_FACTOR * BATCH_BYTES


def _shm(ctx: Context, gpus: int) -> None:
    shm = ctx.snap.cpu.shm_total_bytes
    cores = usable_cores(ctx)
    if shm is None or cores is None:
        ctx.skip(AREA, "/dev/shm size against DataLoader workers (unknown)")
        return
    workers = loader_workers(cores, gpus) * gpus
    needed = shm_needed(workers)
    if shm < needed:
        ctx.add(
            "TU806",
            WARNING,
            f"/dev/shm is {shm / 2**20:.0f} MiB; {workers} DataLoader workers x prefetch {PREFETCH_FACTOR} "
            f"x ~{BATCH_BYTES // 2**20} MiB batches need ~{needed / 2**20:.0f} MiB (bus error when full).",
            "docker run --shm-size=8g (or --ipc=host); Kubernetes: mount an emptyDir with medium: Memory "
            "at /dev/shm",
        )
    else:
        ctx.ok(AREA, f"/dev/shm {shm / 2**30:.1f} GiB is enough for {workers} workers")
