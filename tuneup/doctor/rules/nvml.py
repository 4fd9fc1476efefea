"""NVML that does not answer: the driver or a GPU is wedged, so every tool that asks hangs.

The probe asks NVML with a deadline (:mod:`tuneup.machine.probe.nvml_call`); a call that did
not return in time leaves the GPUs unknown and this fact behind."""

from __future__ import annotations

from tuneup.doctor.findings import ERROR
from tuneup.doctor.rules.context import Context

FIX = ("look for Xid errors (sudo dmesg | grep -i xid), then reset the GPU (sudo nvidia-smi "
       "-r -i N) or reboot; if the GPUs are only slow to come up (persistence mode off), turn "
       "persistence mode on (sudo nvidia-smi -pm 1) or wait longer: TUNEUP_NVML_TIMEOUT=60")


def check(ctx: Context) -> None:
    waited = ctx.snap.driver.nvml_timeout_s
    if waited is None:
        return
    ctx.add("TU204", ERROR,
            f"NVML did not answer within {waited:g} s: the NVIDIA driver or a GPU is stuck "
            "(nvidia-smi hangs the same way), so the GPUs could not be read.", FIX)
