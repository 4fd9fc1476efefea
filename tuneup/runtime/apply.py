"""Turning knobs into PyTorch state: which knobs hold here, AMP, compile, process-wide switches.

Two modes: the runtime (``strict=False``) warns once and keeps PyTorch's default for a knob
that cannot apply here; the autotune child (``strict=True``) raises, so the trial is recorded
as failed instead of silently measuring the default.
"""

from __future__ import annotations

import os
from dataclasses import fields
from typing import Any

import torch

from tuneup.runtime import distributed, malloc_thresholds
from tuneup.settings import Knobs, Settings, SettingsError, store

_cache: dict[tuple, Knobs] = {}
MAX_PREFETCH = 64  # batches per worker held in memory; more only costs memory


def settings_knobs() -> Knobs:
    """The knobs this process applies: from the settings file, after the fingerprint check.

    All ``None`` (plain PyTorch) when there is no file, it is broken, or ``TUNEUP_DISABLE``
    is set. Loaded once per file version, so a warning shows once per process. Under a
    process group the ranks' knobs are compared once: a SettingsError when they differ.
    """
    path = None if store.disabled() else store.resolve_path()
    key = (str(path), _stamp(path), store.disabled())
    if key not in _cache:
        _cache[key] = _load_knobs()
    distributed.check_same_knobs(_cache[key])
    return _cache[key]


def _stamp(path: Any) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except (OSError, TypeError):
        return None
    return stat.st_mtime_ns, stat.st_size


def _load_knobs() -> Knobs:
    settings = store.load()
    if settings is None:
        return Knobs()
    knobs = _for_this_machine(settings)
    _note_other_layout(settings, knobs)
    return bounded(knobs)


def _note_other_layout(settings: Settings, knobs: Knobs) -> None:
    """Worker and thread counts are tuned per rank: say so when this job starts another
    number of local ranks than autotune measured with (the bound below still holds)."""
    tuned, here = settings.measured.local_ranks or 1, distributed.local_world_size()
    sized = any(getattr(knobs, name) is not None for name in ("num_workers", "cpu_threads"))
    if settings.measured.tuned_samples_per_s is None or tuned == here or not sized:
        return
    store.warn(f"the settings were tuned with {tuned} local rank(s) and this job runs {here}: "
               f"their worker and thread counts were chosen for {tuned}; re-run `tuneup autotune "
               f"--nproc-per-node {here}` for this layout")


def bounded(knobs: Knobs) -> Knobs:
    """``knobs`` cut to what this machine can hold, with one warning naming each cut: a
    hand-edited or foreign file must not start 10**9 workers or threads. The ranks torchrun
    starts on one machine share its cores, so each is bounded by its part of them."""
    ranks = distributed.local_world_size()
    cores = rank_cores()
    limits = {"num_workers": 4 * cores, "cpu_threads": cores, "prefetch_factor": MAX_PREFETCH}
    cuts = {name: limit for name, limit in limits.items()
            if (getattr(knobs, name) or 0) > limit}
    if not cuts:
        return knobs
    where = (f"this machine's {cores} usable cores" if ranks == 1 else
             f"{cores} usable cores per local rank ({usable_cores()} shared by {ranks} ranks)")
    store.warn(f"settings cut to {where}: " + ", ".join(
        f"{name} {getattr(knobs, name)} -> {limit}" for name, limit in cuts.items()))
    return knobs.replace(**cuts)


def rank_cores() -> int:
    """This process's part of the usable cores: torchrun's local ranks share them."""
    return max(1, usable_cores() // distributed.local_world_size())


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask), without psutil."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _for_this_machine(settings: Settings) -> Knobs:
    """The settings' knobs, or only those safe across machines when it was tuned elsewhere."""
    if not settings.fingerprint:
        return settings.knobs
    from tuneup.settings import fingerprint  # probes the machine: only for a stamped file

    try:
        changed = fingerprint.differences(settings.fingerprint, fingerprint.current())
    except Exception as exc:  # a probe failure must never stop training
        changed = [f"this machine could not be fingerprinted ({one_line(exc)})"]
    if not changed:
        return settings.knobs
    safe = fingerprint.SAFE_ACROSS_MACHINES
    store.warn(f"the settings were tuned on a different machine ({'; '.join(changed)}); "
               f"applying only {', '.join(safe)} — re-run `tuneup autotune` here")
    return Knobs(**{name: getattr(settings.knobs, name) for name in safe})


def amp_problem(dtype: str, device_type: str, bf16_supported: bool) -> str | None:
    """Why autocast to ``dtype`` cannot be used on this device, or None when it can."""
    if device_type not in ("cpu", "cuda"):
        return f"tuneup applies autocast on cpu and cuda only, not {device_type}"
    if dtype == "float16" and device_type == "cpu":
        return "float16 autocast is not used on the CPU (slow, and needs loss scaling)"
    if dtype == "bfloat16" and not bf16_supported:
        return "this GPU does not support bfloat16"
    return None


def resolve_amp(name: str | None, device: torch.device, strict: bool) -> torch.dtype | None:
    """The autocast dtype to use, or None for float32."""
    if name is None:
        return None
    bf16 = device.type != "cuda" or torch.cuda.is_bf16_supported()
    problem = amp_problem(name, device.type, bf16)
    if problem is None:
        return getattr(torch, name)
    if strict:
        raise SettingsError(f"amp_dtype {name}: {problem}")
    store.warn(f"amp_dtype {name} ignored: {problem}; training in float32")
    return None


def make_scaler(dtype: torch.dtype | None, device: torch.device) -> torch.amp.GradScaler | None:
    """A GradScaler for float16 on CUDA (bfloat16 has float32's range and needs none)."""
    if dtype is torch.float16 and device.type == "cuda":
        return torch.amp.GradScaler("cuda")
    return None


def compile_model(model: torch.nn.Module, mode: str, strict: bool) -> torch.nn.Module:
    """``torch.compile(model, mode=mode)``, falling back to ``model`` with one warning.

    torch.compile is lazy: most failures happen at the first call, so the first forward
    goes through a guard that, on failure, turns the compiled module into a thin wrapper
    around the eager one (anyone holding it keeps working) and re-runs the call eagerly.
    With ``strict`` nothing is caught.
    """
    try:
        compiled = torch.compile(model, mode=mode)
    except Exception as exc:
        if strict:
            raise
        store.warn(f"torch.compile(mode={mode!r}) failed ({one_line(exc)}); running eager")
        return model
    if strict:
        return compiled
    compiled_forward = compiled.forward

    def first_call(*args: Any, **kwargs: Any) -> Any:
        try:
            output = compiled_forward(*args, **kwargs)
        except Exception as exc:
            if is_out_of_memory(exc):
                raise
            store.warn(f"torch.compile(mode={mode!r}) failed at the first call "
                       f"({one_line(exc)}); running eager")
            compiled.forward = model.__call__
            return model(*args, **kwargs)
        compiled.forward = compiled_forward
        return output

    compiled.forward = first_call
    return compiled


def apply_process_knobs(knobs: Knobs) -> None:
    """Set the process-wide switches that are not None: threads, cuDNN autotuner, matmul,
    malloc's thresholds (fixed only: glibc's own cannot be restored in a process)."""
    if knobs.fixed_malloc_thresholds:
        problem = malloc_thresholds.fix()
        if problem is not None:
            store.warn(f"fixed_malloc_thresholds ignored: {problem}")
    if knobs.cpu_threads is not None:
        torch.set_num_threads(knobs.cpu_threads)
    if knobs.cudnn_benchmark is not None:
        torch.backends.cudnn.benchmark = knobs.cudnn_benchmark
    if knobs.float32_matmul_precision is not None:
        torch.set_float32_matmul_precision(knobs.float32_matmul_precision)


def process_defaults() -> Knobs:
    """The current values of the process-wide switches, to restore between trials."""
    return Knobs(cpu_threads=torch.get_num_threads(),
                 cudnn_benchmark=torch.backends.cudnn.benchmark,
                 float32_matmul_precision=torch.get_float32_matmul_precision())


def filled(knobs: Knobs, defaults: Knobs) -> Knobs:
    """``knobs`` with each None replaced by the value in ``defaults``."""
    return Knobs(**{f.name: getattr(knobs, f.name) if getattr(knobs, f.name) is not None
                    else getattr(defaults, f.name) for f in fields(Knobs)})


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA OOM, Python's MemoryError, or the CPU allocator's "can't allocate memory"."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in text
                                             or "out of memory" in text)


def one_line(exc: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message``, cut to ``limit`` characters."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= limit else text[:limit - 1] + "…"
