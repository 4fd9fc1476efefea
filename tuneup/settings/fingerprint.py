"""The environment fingerprint stored with settings, and what a change of it makes unsafe."""

from __future__ import annotations

from typing import Any

from tuneup.machine.snapshot import Snapshot
from tuneup.settings.schema import knob_names

# Knobs that stay right when the machine changes: they cannot change the numbers the
# model computes, nor the data order, and cannot fail on other hardware (declared on each
# knob). Everything else was tuned for one machine and is dropped (back to PyTorch
# defaults) when the fingerprint differs.
SAFE_ACROSS_MACHINES = knob_names(safe_across_machines=True)


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
    """Fingerprint of this process's machine, from the doctor's light-weight probes."""
    from tuneup.machine import probe

    snapshot = Snapshot(torch=probe.probe_torch(), cpu=probe.probe_cpu())
    snapshot.driver, snapshot.gpus = probe.probe_nvidia()
    return from_snapshot(snapshot)


def differences(stored: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Human-readable list of what changed, e.g. ``["torch 2.12.0 -> 2.13.0"]``."""
    changed = []
    for key in sorted(set(stored) | set(now)):
        if key in stored and stored.get(key) != now.get(key):
            changed.append(f"{key} {stored.get(key)} -> {now.get(key)}")
    return changed
