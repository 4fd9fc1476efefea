"""ROCm rules: AMD GPUs need a ROCm build; NVIDIA GPUs need a CUDA build."""

from __future__ import annotations

from tuneup.doctor import knowledge as kb
from tuneup.doctor.findings import ERROR, WARNING
from tuneup.doctor.rules.context import Context
from tuneup.doctor.rules.recommend import find_wheel, install_fix

AREA = "rocm"


def check(ctx: Context) -> None:
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


def _rocm_fix(ctx: Context) -> str:
    if ctx.os_family == "windows":
        return "ROCm wheels are Linux-only: run PyTorch for ROCm under Linux (or WSL2 with ROCm support)"
    start = ctx.build.release
    ordered = list(kb.releases())
    if start is not None:
        ordered = ordered[ordered.index(start) :]
    for release in ordered:
        if release.rocm_variants and (not ctx.python or kb.python_supported(release, ctx.python)):
            return install_fix(ctx, release, release.rocm_variants[-1])
    return "install a ROCm build from https://pytorch.org/get-started/locally/ (Compute Platform: ROCm)"
