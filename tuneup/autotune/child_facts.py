"""What a trial child reads of its machine and process before its first trial.

Shared by the two kinds of trial session: :mod:`tuneup.autotune.child` (trials inside the
script's own ``tuned_loop``) and :mod:`tuneup.autotune.trainer_trial` (one trial a process
inside a trainer): the thread count torch starts with, the usable cores, which autocast
dtypes and compilers work here, and the atomic save of the run's reference state.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import platform
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import torch

from tuneup.files import write_atomic
from tuneup.machine import probe
from tuneup.runtime import apply
from tuneup.settings import AMP_DTYPES

SLOW_BFLOAT16 = 3.0  # bfloat16 this many times slower than float32: not worth a trial


def torch_default_threads(environ: dict[str, str] | None = None) -> int | None:
    """The intra-op thread count torch starts with (ATen's ``intraop_default_num_threads``):
    ``MKL_NUM_THREADS`` or ``OMP_NUM_THREADS``, else the physical cores where fewer than the
    logical ones (x86), else the logical ones; None when the cores cannot be counted."""
    environ = os.environ if environ is None else environ
    for name in ("MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        with contextlib.suppress(ValueError):
            if int(environ.get(name, "0")) > 0:
                return int(environ[name])
    logical = psutil.cpu_count(logical=True)
    physical = psutil.cpu_count(logical=False)
    if physical and logical and physical < logical and _x86():
        return physical
    return logical


def _x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")



def save_atomically(value: Any, path: Path) -> None:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    write_atomic(path, buffer.getvalue())



def usable_cores() -> int:
    """Whole cores the trials may use: the probe's affinity mask capped by the cgroup quota."""
    cores = probe.probe_cpu().usable_cores
    return max(1, int(cores)) if cores else (os.cpu_count() or 1)


def busy_cores(interval: float = 0.2) -> float:
    """Cores other processes keep busy now: this process's cores' busy time over
    ``interval`` less its own. On a loaded machine torch's default threads (one a core)
    time-share with that load, and fewer threads can be faster (2 cores, one busy: one
    thread ran a script 1.7-4.8x faster than two)."""
    try:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        me = psutil.Process()

        def busy() -> float:
            times = psutil.cpu_times(percpu=True)
            mine = [times[i] for i in cpus if i < len(times)] if cpus else times
            return sum(sum(t) - t.idle - getattr(t, "iowait", 0.0) for t in mine)

        def own() -> float:
            t = me.cpu_times()
            return t.user + t.system + t.children_user + t.children_system

        start_busy, start_own, start = busy(), own(), time.perf_counter()
        time.sleep(interval)
        spent = time.perf_counter() - start
        return max(0.0, round((busy() - start_busy - own() + start_own) / spent, 2))
    except (OSError, psutil.Error, AttributeError):
        return 0.0  # unknown: the cores count as the script's


def amp_dtypes_here(device_type: str, reasons: dict[str, str], measure: bool = True
                    ) -> list[str]:
    """The autocast dtypes worth a trial on this device. Where bfloat16 is measured
    (``measure``) slow on this CPU it is left out, with the reason added to ``reasons``; the
    measurement leaves torch's generator as it was (a trial's draws stay the others')."""
    bf16 = device_type != "cuda" or torch.cuda.is_bf16_supported()
    dtypes = [d for d in AMP_DTYPES if apply.amp_problem(d, device_type, bf16) is None]
    if "bfloat16" in dtypes and device_type == "cpu" and measure:
        with torch.random.fork_rng(devices=[]):
            slowdown = cpu_bfloat16_slowdown()
        if slowdown > SLOW_BFLOAT16:
            dtypes.remove("bfloat16")
            reasons["amp_dtype"] = (f"this CPU has no fast bfloat16 (a matmul under bfloat16 "
                                    f"autocast measured {slowdown:.0f}x slower than float32)")
    return dtypes


def cpu_bfloat16_slowdown(size: int = 256) -> float:
    """How many times slower a matmul runs under bfloat16 autocast than in float32 here.

    CPUs without native bfloat16 (no AVX512-BF16 / AMX / ARM BF16) emulate it, tens of
    times slower: measured, not guessed from flags. About 10 ms where bfloat16 is native.
    """
    a, b = torch.randn(size, size), torch.randn(size, size)

    def best_of(repeats: int, dtype: torch.dtype | None) -> float:
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                a @ b
            times.append(time.perf_counter() - started)
        return min(times)

    best_of(1, torch.bfloat16)  # first-call set-up
    # float32 is the quick one: more tries, so a busy machine cannot inflate its best
    return least_slowdown(lambda: best_of(3, torch.bfloat16) / max(best_of(20, None), 1e-6))


def least_slowdown(measure: Callable[[], float], rounds: int = 5) -> float:
    """The smallest of up to ``rounds`` measured slowdowns, stopping at the first within
    :data:`SLOW_BFLOAT16`. A slow verdict takes bfloat16 out of the search, where it can be
    the largest gain (2x on docs/examples/train_images.py), so it must hold in every round:
    in a tuning child on a CPU with AVX512-BF16 one round once measured 116x, where 0.6-0.9x
    is usual. Where bfloat16 is emulated the rounds cost ~0.2 s more."""
    slowdowns = []
    for _ in range(rounds):
        slowdowns.append(measure())
        if slowdowns[-1] <= SLOW_BFLOAT16:
            break
    return min(slowdowns)


def compile_available(device: torch.device) -> bool:
    """torch.compile can work here: dynamo supports this Python and the backend has its tools."""
    if not torch._dynamo.is_dynamo_supported():
        return False
    if device.type == "cuda":
        return importlib.util.find_spec("triton") is not None
    return any(shutil.which(name) for name in ("c++", "g++", "clang++"))
