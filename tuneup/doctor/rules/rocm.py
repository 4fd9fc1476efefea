"""ROCm rules: AMD GPUs need a ROCm build; NVIDIA GPUs need a CUDA build."""

from __future__ import annotations

from tuneup.doctor import knowledge as kb
from tuneup.doctor import messages, rocm_tables
from tuneup.doctor.findings import ERROR, INFO, WARNING
from tuneup.doctor.rules.context import Context, GpuFact
from tuneup.doctor.rules.recommend import find_wheel, install_fix
from tuneup.machine import versions

AREA = "rocm"


def check(ctx: Context) -> None:
    _invalid_device_function(ctx)
    _override_of_another_generation(ctx)
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
    _gfx_targets(ctx)


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


# ---------------------------------------------------------------- TU605: the wheel's gfx list


def _gfx_targets(ctx: Context) -> None:
    """TU605: a ROCm build on an AMD GPU whose gfx target its wheel line ships no kernels for."""
    build = ctx.build
    if build.kind == "rocm" and not ctx.gpus and not ctx.nvidia_present:
        _target_unknown(ctx, "the input names no GPU")
    if build.kind != "rocm" or not ctx.amd_gpus:
        return
    found = _rocm_line(ctx)
    if isinstance(found, str):
        ctx.skip(AREA, found)
        return
    line, from_suffix = found
    override_text = ctx.env("HSA_OVERRIDE_GFX_VERSION")
    override = rocm_tables.gfx_from_override(override_text)
    for gpu in ctx.amd_gpus:
        gfx, basis, exact = _gpu_target(gpu)
        if gfx is None:
            ctx.skip(
                AREA,
                f"the gfx target of {gpu.name} is unknown (the report names none and no "
                "amd_gpus.csv row matches), so the ROCm wheel's target list was not checked",
            )
            _target_unknown(ctx, f"the input gives no gfx target for {gpu.name}")
            continue
        target = override or gfx
        shipped = line.ships(target)
        if shipped:
            via = (
                f" (HSA_OVERRIDE_GFX_VERSION={override_text.strip()} runs the {gfx} GPU as "
                f"{target})"
                if override and override != gfx
                else ""
            )
            ctx.ok(AREA, f"{build.label} ships kernels for {target}, the target of {gpu.name}{via}")
            continue
        if shipped is None:
            ctx.skip(
                AREA,
                f"whether {build.label} ships {target} kernels depends on the torch release of "
                f"its {line.variant} wheel, which is not known",
            )
            continue
        proven = line.verified and from_suffix and exact and not build.assumed
        wheels = f"the {line.variant} wheels" + (
            f" of torch {' / '.join(line.releases)}" if line.releases else ""
        )
        doubt = _doubt(line, from_suffix, exact, build.assumed)
        as_set = (
            f"; HSA_OVERRIDE_GFX_VERSION={override_text.strip()} makes it run as {target}"
            if override and override != gfx
            else ""
        )
        ctx.add(
            "TU605",
            ERROR if proven else WARNING,
            f"{build.label} {'has' if proven else 'probably has'} no kernels for {gpu.name} "
            f"({gfx}, {basis}{as_set}): {wheels} ship {' '.join(line.targets)}{doubt}. "
            + (
                "Its GPU operations fail with 'HIP error: invalid device function'."
                if proven
                else "If so, its GPU operations fail with 'HIP error: invalid device function'."
            ),
            _gfx_fix(ctx, gfx, line),
        )


def _rocm_line(ctx: Context, nearest: bool = False) -> tuple[rocm_tables.RocmTargets, bool] | str:
    """(the build's wheel line, whether it comes from the +rocm suffix) or why it is unknown;
    ``nearest``: for a nightly or custom ``+rocm`` build, its nearest release's line."""
    build = ctx.build
    release = build.release.release if build.release else None
    label = versions.local(build.version)
    if label.startswith("rocm"):
        if not build.is_published_wheel and not nearest:
            return (
                f"{build.label} is a nightly or custom ROCm build: its gfx target list is not "
                "the published wheel's"
            )
        line = rocm_tables.rocm_targets(label, release)
        if line is None:
            return f"no gfx target list for the {label} wheels (rocm_targets.csv has no row)"
        return line, True
    hip = None if build.requested else ctx.snap.torch.hip
    hip_mm = versions.major_minor(hip)
    custom = build.version is not None and not build.is_published_wheel
    if hip_mm is None or custom:
        return f"which gfx targets {build.label} ships is not known (no +rocm suffix to look up)"
    if release is None:  # every wheel of that ROCm line: a target none ships is missing
        line = rocm_tables.of_rocm(hip)
        return (line, False) if line is not None else f"no gfx target list for ROCm {hip}"
    wanted = versions.major_minor(release)
    names = {
        row.variant
        for row in rocm_tables.rocm_lines()
        if versions.major_minor(row.rocm) == hip_mm
        and any(versions.major_minor(rel) == wanted for rel in row.releases)
    }
    if len(names) != 1:
        return (
            f"which ROCm wheel line {build.label} (HIP {hip}) is, is not known, so its gfx "
            "target list was not checked"
        )
    line = rocm_tables.rocm_targets(names.pop(), release)
    return (line, False) if line is not None else "no gfx target list for this ROCm build"


def _gpu_target(gpu: GpuFact) -> tuple[str | None, str, bool]:
    """(gfx target, where it comes from, whether that is a fact) of an AMD GPU."""
    arch = (gpu.raw.arch or "").strip().lower().split(":")[0]
    if rocm_tables.GFX_TARGET.fullmatch(arch):
        return arch, "reported", True
    known = rocm_tables.amd_gpu_lookup(gpu.name)
    if known is None:
        return None, "", False
    if known.verified:
        return known.gfx, "from the AMD GPU table", True
    return known.gfx, "guessed from an UNVERIFIED AMD GPU table row", False


def _doubt(line: rocm_tables.RocmTargets, from_suffix: bool, exact: bool, assumed: bool) -> str:
    """Why a TU605 is only a warning, said after the target list."""
    if not line.verified:
        return " (by an UNVERIFIED rocm_targets.csv row)"
    if not from_suffix:
        return " (the wheel line is guessed from torch.version.hip)"
    if assumed or not exact:
        return " (the GPU's target is not certain)"
    return ""


def _gfx_fix(ctx: Context, gfx: str, line: rocm_tables.RocmTargets) -> str:
    options = []
    wheel = _wheel_shipping(ctx, gfx)
    if wheel is not None:
        release, row = wheel
        note = "" if row.verified else ", by an UNVERIFIED table row"
        options.append(
            f"{install_fix(ctx, release, row.variant)} (the {row.variant} wheels of torch "
            f"{release.release} ship {gfx}{note})"
        )
    sibling = rocm_tables.RDNA_SIBLINGS.get(gfx)
    if sibling is not None and line.ships(sibling[0]):
        options.append(
            f"keep this build and export HSA_OVERRIDE_GFX_VERSION={sibling[1]}, so the {gfx} GPU "
            f"runs its {sibling[0]} kernels (same RDNA family; not supported by AMD)"
        )
    if not options:
        options.append(
            f"build PyTorch from source with PYTORCH_ROCM_ARCH={gfx}: no ROCm wheel in the "
            "tables ships it"
        )
    return "; or ".join(options)


def _wheel_shipping(ctx: Context, gfx: str) -> tuple[kb.Release, rocm_tables.RocmTargets] | None:
    """The nearest (release, ROCm wheel line) whose target list has ``gfx``: the build's own
    release first, then newer ones, then older ones; only releases with wheels for this Python."""
    everything = list(kb.releases())
    start = ctx.build.release
    if start in everything:
        index = everything.index(start)
        order = everything[index:] + everything[:index][::-1]
    else:
        order = everything[::-1]
    for release in order:
        if ctx.python and not kb.python_supported(release, ctx.python, ctx.os_family):
            continue
        wanted = versions.major_minor(release.release)
        rows = [
            row
            for row in rocm_tables.rocm_lines()
            if any(versions.major_minor(rel) == wanted for rel in row.releases)
        ]
        rows.sort(key=lambda row: versions.release(row.rocm) or (), reverse=True)
        for row in rows:
            if gfx in row.targets:
                return release, row
    return None


# ---------------------------------------------------------------- TU607: an override of another ISA


def _override_of_another_generation(ctx: Context) -> None:
    """TU607: HSA_OVERRIDE_GFX_VERSION names a target of another generation than the GPU's.

    The override is a workaround for a close sibling of a supported target (gfx1031 run as
    gfx1030). Across generations (gfx1201 run as gfx1030, gfx1151 as gfx900) the kernels are of
    another instruction set: crashes, wrong results or a silent fall back to the CPU.
    """
    text = ctx.env("HSA_OVERRIDE_GFX_VERSION")
    override = rocm_tables.gfx_from_override(text)
    if override is None:
        return
    for gpu in ctx.amd_gpus:
        gfx = _gpu_target(gpu)[0]
        if gfx and _generation(gfx) != _generation(override):
            ctx.add("TU607", WARNING,
                    f"HSA_OVERRIDE_GFX_VERSION={text.strip()} runs the {gfx} GPU as {override}, "
                    "a target of another generation: its kernels are of another instruction set "
                    "(crashes, wrong results or a silent fall back to the CPU).",
                    f"unset HSA_OVERRIDE_GFX_VERSION when a build ships {gfx} kernels; set it only "
                    "to a sibling of the same generation (10.3.0 for gfx103x, 11.0.0 for gfx110x)")
            return


def _generation(gfx: str) -> str:
    """``gfx1030`` -> ``10``, ``gfx90a`` -> ``9``: the digits before the last two characters."""
    return gfx[3:-2]


# ---------------------------------------------------------------- TU608: the GPU's target unknown


def _target_unknown(ctx: Context, why: str) -> None:
    """TU608 (info): a ROCm wheel ships kernels for a short list of gfx targets, and a card
    outside it (most consumer Radeons and APUs at some point) fails at its first kernel; with
    the GPU's target unknown, say the list and how to read the target, claim nothing."""
    build = ctx.build
    found = _rocm_line(ctx, nearest=True)
    line = found[0] if isinstance(found, tuple) else None
    if line is None:
        ships = "its wheel line's gfx list is not in tuneup's tables"
    else:
        wheels = f"the {line.variant} wheels" + (
            f" of torch {' / '.join(line.releases)}" if line.releases else "")
        doubt = "" if line.verified else " (an UNVERIFIED table row)"
        if not build.is_published_wheel:  # TU605 claims no list for it: only the release's
            wheels = f"the nearest published wheels, {wheels},"
        ships = f"{wheels} ship kernels for {' '.join(line.targets)} only{doubt}"
        if not build.is_published_wheel:
            ships += "; this nightly or custom build's own list may differ"
    ctx.add(
        "TU608",
        INFO,
        f"{build.label} is a ROCm build, but {why}, so whether it has kernels for the GPU was not "
        f"checked: {ships}. A GPU whose target is not listed fails with 'HIP error: invalid "
        "device function' (hipErrorNoBinaryForGpu).",
        "read the GPU's target with rocminfo | grep gfx (or torch.cuda.get_device_properties(0)"
        ".gcnArchName); if it is not listed, install a wheel line that ships it, or run the "
        "kernels of a listed target of the same generation with HSA_OVERRIDE_GFX_VERSION "
        "(e.g. 11.0.0 for gfx1100 on other gfx11 GPUs, 10.3.0 for gfx1030 on other RDNA2 GPUs)",
    )
