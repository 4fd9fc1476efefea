"""The NVIDIA driver and GPUs as ``nvidia-smi`` and the driver's own file tell them, without
NVML or torch: what ``scripts/setup.sh`` reads before either is installed."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tuneup.machine.probe.nvidia import parse_proc_driver_version

PROC_VERSION = Path("/proc/driver/nvidia/version")
SMI_TIMEOUT_S = 20  # nvidia-smi on a wedged driver hangs: set-up goes on without it
CAPABILITY = re.compile(r"\d+\.\d+")  # "9.0"; "[N/A]" and the like are not read

SmiRows = list[list[str]]


@dataclass(frozen=True)
class NvidiaFacts:
    """What set-up needs to know of the NVIDIA driver and GPUs (``None`` = not read)."""

    driver: str | None
    gpus: tuple[tuple[str | None, str | None], ...]  # (name, compute capability "9.0")


def nvidia_smi(fields: str) -> SmiRows | None:
    """``nvidia-smi --query-gpu=fields`` as rows of cells; None when it is absent or fails."""
    try:
        done = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return [[cell.strip() for cell in line.split(",")] for line in done.stdout.splitlines()
            if line.strip()]


def read_nvidia(proc: Path = PROC_VERSION,
                smi: Callable[[str], SmiRows | None] = nvidia_smi) -> NvidiaFacts | None:
    """The driver and GPUs, or None where there is no NVIDIA GPU (no driver file, no
    ``nvidia-smi`` answering). A ``nvidia-smi`` too old for ``compute_cap`` gives names only:
    the doctor's GPU table knows their capability."""
    try:
        driver = parse_proc_driver_version(proc.read_text(errors="replace"))
    except OSError:
        driver = None
    rows = smi("driver_version,name,compute_cap")
    if rows is None:
        rows = [[*row, ""] for row in smi("driver_version,name") or []]
    if driver is None and not rows:
        return None
    gpus = tuple((row[1] or None, row[2] if CAPABILITY.fullmatch(row[2]) else None)
                 for row in rows if len(row) >= 3)
    return NvidiaFacts(driver or (rows[0][0] if rows else None), gpus)
