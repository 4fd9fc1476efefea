"""The environment fingerprint stored with settings, and what a change of it makes unsafe."""

from __future__ import annotations

from typing import Any

from tuneup.machine.snapshot import Snapshot
from tuneup.settings import store
from tuneup.settings.schema import knob_names

# Knobs that stay right when the machine changes: they cannot change the numbers the
# model computes, nor the data order, and cannot fail on other hardware (declared on each
# knob). Everything else was tuned for one machine and is dropped (back to PyTorch
# defaults) when the fingerprint differs.
SAFE_ACROSS_MACHINES = knob_names(safe_across_machines=True)
NVML_FACTS = frozenset({"gpu_model", "gpu_count", "driver"})  # what NVML alone may tell
_warned: list[str] = []  # the warnings given in this process


def from_snapshot(snapshot: Snapshot) -> dict[str, Any]:
    """The facts that decide whether tuned knobs still hold."""
    gpus = snapshot.gpus or []
    return {
        "gpu_model": gpus[0].name if gpus else None,
        "gpu_count": len(gpus),
        "driver": snapshot.driver.version,
        "torch": snapshot.torch.version,
        "torch_cuda": snapshot.torch.cuda,
        "cpu_model": snapshot.cpu.model,
        "cpu_cores": snapshot.cpu.usable_cores,
    }


def current() -> dict[str, Any]:
    """Fingerprint of this process's machine, from the doctor's light-weight probes (torch's
    version and build without asking CUDA, which would ask NVML).

    NVML is asked with the probe's deadline (``TUNEUP_NVML_TIMEOUT``); when it does not
    answer, the GPU facts it alone gives are left out (unknown, never compared) and one
    warning says so: training goes on."""
    from tuneup.machine import probe
    from tuneup.machine.probe import nvml_call
    from tuneup.machine.probe.torch_build import torch_identity

    snapshot = Snapshot(torch=torch_identity(), cpu=probe.probe_cpu())
    snapshot.driver, snapshot.gpus = probe.probe_nvidia()
    facts = from_snapshot(snapshot)
    stuck = snapshot.driver.nvml_timeout_s
    if stuck is None:
        return facts
    _warn_once(f"NVML did not answer within {stuck:g} s: the GPUs are left out of the "
               f"settings' machine check (a wedged driver or a GPU off the bus; nvidia-smi "
               f"would hang too; {nvml_call.ENV} sets the wait)")
    unknown = NVML_FACTS if snapshot.driver.version is None else NVML_FACTS - {"driver"}
    return {key: value for key, value in facts.items() if key not in unknown}


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.append(message)
        store.warn(message)


def differences(stored: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Human-readable list of what changed, e.g. ``["torch 2.12.0 -> 2.13.0"]``; a fact
    unknown now (missing from ``now``) is not compared."""
    changed = []
    for key in sorted(set(stored) & set(now)):
        if stored[key] != now[key]:
            changed.append(f"{key} {stored[key]} -> {now[key]}")
    return changed
