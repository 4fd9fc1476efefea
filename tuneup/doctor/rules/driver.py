"""Driver rule: does the NVIDIA driver run the CUDA runtime the torch build carries."""

from __future__ import annotations

from tuneup.doctor import knowledge as kb
from tuneup.doctor import messages
from tuneup.doctor.findings import ERROR, INFO, WARNING
from tuneup.doctor.rules.context import Context
from tuneup.doctor.rules.recommend import find_wheel, install_fix
from tuneup.machine import versions

AREA = "driver"
INSUFFICIENT = "CUDA driver version is insufficient for CUDA runtime version"


def check(ctx: Context) -> None:
    build = ctx.build
    if build.kind != "cuda" or not build.cuda:
        if _said_too_old(ctx):
            return
        if ctx.nvidia_present and build.kind is None:
            ctx.skip(AREA, "driver against the build's CUDA (the build's CUDA version is unknown)")
        return
    need = kb.driver_requirement(build.cuda, ctx.driver_os)
    if need is None:
        ctx.skip(AREA, f"driver for CUDA {build.cuda} (no table row)")
        return
    runs = ctx.driver_runs(build.cuda)
    driver = ctx.snap.driver.version
    known = ctx.driver_max_cuda
    if runs is None and messages.says(ctx.all_messages, "driver-insufficient"):
        ctx.add(
            "TU201",
            ERROR,
            f"torch reported '{INSUFFICIENT}': the driver is too old for {build.label} "
            f"(CUDA {need.cuda}, from {build.basis}).",
            _driver_step(need),
        )
        return
    if runs is None:
        ctx.skip(AREA, "driver version (the report has no driver line)")
        return
    have = (
        f"driver {driver}"
        if driver
        else f"the driver (CUDA {known[0]} at most: {known[1]})"
        if known
        else "the driver"
    )
    if not runs:
        _too_old(ctx, need, have)
        return
    ga = versions.release(need.ga_driver)
    numbers = versions.release(driver) if driver else None
    below_ga = numbers is not None and ga is not None and (
        numbers[0] < ga[0] if len(numbers) == 1 else numbers < ga)  # a bare branch: by branch
    if need.minor_version_compat and below_ga:
        ctx.add(
            "TU202",
            INFO,
            f"{have} is older than CUDA {need.cuda}'s own driver ({need.ga_driver}); {build.label} runs "
            f"through CUDA {need.cuda.split('.')[0]}.x minor-version compatibility (driver >= {need.floor_driver}).",
            f"nothing required; for PTX JIT of newer kernels and the newest CUDA APIs update to >= {need.ga_driver}",
        )
        return
    ctx.ok(AREA, f"{have} runs CUDA {need.cuda} ({build.label})")


def _too_old(ctx: Context, need: kb.DriverNeed, have: str) -> None:
    build = ctx.build
    compat = (
        f"CUDA {need.cuda.split('.')[0]}.x needs >= {need.floor_driver}"
        if need.minor_version_compat
        else f"CUDA {need.cuda} needs >= {need.floor_driver}"
    )
    message = (
        f"{have} is too old for {build.label} (CUDA {need.cuda}, from {build.basis}): {compat}."
    )
    driver_step = _driver_step(need)
    cc = next((g.cc for g in ctx.nvidia_gpus if g.cc), None)
    wheel = (
        find_wheel(ctx, cc=cc, start=build.release, same_release_only=True)
        if build.release
        else None
    )
    if wheel is not None and versions.cuda_from_tag(wheel[1]) != build.cuda:
        fix = f"{install_fix(ctx, *wheel)}, or {driver_step}"
    else:
        fix = driver_step
    guessed = build.assumed and not (build.release and build.release.verified)
    ctx.add("TU201", ERROR if need.verified and not guessed else WARNING, message, fix)


def _driver_step(need: kb.DriverNeed) -> str:
    return f"update the NVIDIA driver to {kb.driver_branch(need.floor_driver or '')} or newer (>= {need.floor_driver})"


def _said_too_old(ctx: Context) -> bool:
    """torch's own 'driver too old' / 'insufficient' message settles it without the build's CUDA."""
    text = ctx.all_messages
    if not (messages.says(text, "driver-too-old") or messages.says(text, "driver-insufficient")):
        return False
    known = ctx.driver_max_cuda
    level = f" (it runs CUDA {known[0]} at most: {known[1]})" if known else ""
    ctx.add(
        "TU201",
        ERROR,
        f"torch reported that the NVIDIA driver is too old for the CUDA runtime of the build{level}.",
        "update the NVIDIA driver to one whose CUDA level (nvidia-smi, top right) is at least "
        "torch.version.cuda; or install a torch build for an older CUDA"
        + (f" (<= {known[0]})" if known else ""),
    )
    return True
