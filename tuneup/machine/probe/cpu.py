"""Host CPU, cores (affinity mask and cgroup quota), RAM and /dev/shm."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from tuneup.machine.probe.cpu_flags import relevant_flags
from tuneup.machine.snapshot import CPU


def parse_cpuinfo(text: str) -> tuple[str | None, list[str] | None]:
    """CPU model and relevant flags in ``/proc/cpuinfo`` (x86 ``flags``, arm ``Features``)."""
    model = flags = None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        if model is None and key in ("model name", "hardware", "cpu model"):
            model = value.strip() or None
        elif flags is None and key in ("flags", "features"):
            flags = relevant_flags(value)
    return model, flags


def parse_cpu_max(text: str) -> float | None:
    """cgroup v2 ``cpu.max`` (``"200000 100000"`` -> 2.0, ``"max 100000"`` -> None)."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def parse_cfs_quota(quota_text: str, period_text: str) -> float | None:
    """cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (quota -1 = no limit -> None)."""
    try:
        quota, period = int(quota_text.strip()), int(period_text.strip())
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def cgroup_paths(proc_self_cgroup: str) -> tuple[str | None, str | None]:
    """This process's cgroup paths from ``/proc/self/cgroup``: (v2 unified path, v1 cpu path)."""
    unified = cpu = None
    for line in proc_self_cgroup.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            unified = path
        elif "cpu" in controllers.split(","):
            cpu = path
    return unified, cpu


def usable_cores(affinity: int | None, quota: float | None) -> float | None:
    """Cores a process may really use: the affinity mask, capped by the cgroup quota."""
    if affinity is None:
        return quota
    return min(float(affinity), quota) if quota is not None else float(affinity)


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def cgroup_quota(root: Path, proc_self_cgroup: str) -> float | None:
    """CPU quota in cores of the cgroup named in ``proc_self_cgroup``, read under ``root``
    (``/sys/fs/cgroup``: v2 ``cpu.max``, else v1 ``cpu.cfs_quota_us``); ``None`` = no limit."""
    unified, v1_path = cgroup_paths(proc_self_cgroup)
    candidates: list[tuple[Path, Path | None]] = []
    for path in dict.fromkeys(filter(None, (unified, "/"))):
        candidates.append((root / path.lstrip("/") / "cpu.max", None))
    for base in (root / "cpu", root / "cpu,cpuacct"):
        for path in dict.fromkeys(filter(None, (v1_path, "/"))):
            directory = base / path.lstrip("/")
            candidates.append((directory / "cpu.cfs_quota_us", directory / "cpu.cfs_period_us"))
    for first, second in candidates:
        text = _read(first)
        if text is None:
            continue
        if second is None:
            return parse_cpu_max(text)
        return parse_cfs_quota(text, _read(second) or "")
    return None


def probe_cpu(notes: list[str] | None = None) -> CPU:
    """CPU model, flags, cores, RAM and /dev/shm of this machine; failures go to ``notes``."""
    notes = notes if notes is not None else []
    cpu = CPU(architecture=platform.machine() or None, logical_cores=os.cpu_count())
    cpuinfo = _read("/proc/cpuinfo")
    if cpuinfo is not None:
        cpu.model, cpu.flags = parse_cpuinfo(cpuinfo)
    if cpu.model is None:
        cpu.model = platform.processor() or None
    try:
        affinity: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = cpu.logical_cores
    cpu.cgroup_quota_cores = cgroup_quota(Path("/sys/fs/cgroup"), _read("/proc/self/cgroup") or "")
    cpu.usable_cores = usable_cores(affinity, cpu.cgroup_quota_cores)
    try:
        import psutil

        cpu.ram_total_bytes = int(psutil.virtual_memory().total)
    except Exception as error:  # psutil missing or broken: RAM stays unknown
        notes.append(f"RAM size not read: {error}")
    try:
        stat = os.statvfs("/dev/shm")
        cpu.shm_total_bytes = stat.f_blocks * stat.f_frsize
    except (AttributeError, OSError) as error:
        notes.append(f"/dev/shm size not read: {error}")
    return cpu
