"""ROCm rules: AMD GPUs need a ROCm build; NVIDIA GPUs need a CUDA build."""

from __future__ import annotations

from tuneup.doctor import knowledge as kb
from tuneup.doctor import messages
from tuneup.doctor.findings import ERROR, WARNING
from tuneup.doctor.rules.context import Context
from tuneup.doctor.rules.recommend import find_wheel, install_fix

AREA = "rocm"


def check(ctx: Context) -> None:
    _invalid_device_function(ctx)
    build = ctx.build
    amd = ctx.amd_gpus
    mixed = ctx.nvidia_present and build.kind == "cuda"  # the CUDA build serves the NVIDIA GPU
    if amd and build.kind in ("cuda", "cpu") and not mixed:
        names = ", ".join(g.name for g in amd)
        what = (
            f"a CUDA build ({build.basis})"
            if build.kind == "cuda"
            else f"a CPU-only build ({build.basis})"
        )
        code, severity = ("TU601", ERROR) if build.kind == "cuda" else ("TU603", WARNING)
        ctx.add(
            code,
            severity,
            f"{build.label} is {what}, which cannot use the AMD GPU ({names}).",
            _rocm_fix(ctx),
        )
    elif amd and build.kind == "rocm":
        ctx.ok(AREA, f"{build.label} is a ROCm build for the AMD GPU")
    if build.kind == "rocm" and ctx.nvidia_present and not amd:
        cc = next((g.cc for g in ctx.nvidia_gpus if g.cc), None)
        wheel = find_wheel(ctx, cc=cc, start=build.release)
        fix = (
            install_fix(ctx, *wheel)
            if wheel
            else "install a CUDA build from https://pytorch.org/get-started/locally/"
        )
        ctx.add(
            "TU602",
            ERROR,
            f"{build.label} is a ROCm build ({build.basis}) on a machine with an NVIDIA GPU.",
            fix,
        )


def _invalid_device_function(ctx: Context) -> None:
    """HIP's 'invalid device function': the ROCm build has no kernels for the card's gfx target."""
    if not messages.says(ctx.all_messages, "hip-invalid-device-function"):
        return
    targets = ", ".join(sorted({g.raw.arch for g in ctx.amd_gpus if g.raw.arch})) or "unknown"
    ctx.add(
        "TU604",
        ERROR if ctx.build.kind == "rocm" else WARNING,
        f"HIP reported 'invalid device function': {ctx.build.label} has no kernels for the AMD "
        f"GPU's gfx target ({targets}); ROCm wheels ship a fixed list of targets, and consumer "
        "and older cards are often not on it.",
        "install a ROCm build whose release lists this gfx target (ROCm's GPU support matrix), "
        "or, for an RDNA card next to a supported one, export HSA_OVERRIDE_GFX_VERSION=<the "
        "supported target, e.g. 10.3.0 for gfx103x, 11.0.0 for gfx110x>",
    )


def _rocm_fix(ctx: Context) -> str:
    if ctx.os_family == "windows":
        return "ROCm wheels are Linux-only: run PyTorch for ROCm under Linux (or WSL2 with ROCm support)"
    start = ctx.build.release
    ordered = list(kb.releases())
    if start is not None:
        ordered = ordered[ordered.index(start) :]
    for release in ordered:
        if release.rocm_variants and (not ctx.python or kb.python_supported(release, ctx.python, ctx.os_family)):
            return install_fix(ctx, release, release.rocm_variants[-1])
    return "install a ROCm build from https://pytorch.org/get-started/locally/ (Compute Platform: ROCm)"
