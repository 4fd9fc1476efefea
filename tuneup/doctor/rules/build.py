"""Build rules: is torch installed, is it a CUDA build, and does it carry kernels for each GPU."""

from __future__ import annotations

from tuneup.doctor import knowledge as kb
from tuneup.doctor import messages
from tuneup.doctor.findings import ERROR, INFO, WARNING
from tuneup.doctor.readers.facts import unsure_fact
from tuneup.doctor.rules.context import Context, GpuFact
from tuneup.doctor.rules.recommend import find_wheel, install_fix
from tuneup.machine import versions

AREA = "build"
NO_KERNEL_IMAGE = "no kernel image is available for execution on the device"
JETPACK_FIX = ("install NVIDIA's PyTorch for JetPack (a '+nv' wheel matching the JetPack "
               "release: https://docs.nvidia.com/deeplearning/frameworks/install-pytorch-jetson-"
               "platform/), or use the l4t-pytorch / jetson-containers image")


def check(ctx: Context) -> None:
    build = ctx.build
    torch = ctx.snap.torch
    stated = unsure_fact(ctx.snap, "torch.build") is not None  # "installs the CPU version"
    if build.kind == "cpu" and (build.version is not None or not build.assumed or stated):
        _cpu_only(ctx)  # also without a version: torch's own error or the user can say so
    elif build.kind == "cuda" and (build.version is not None or torch.arch_list):
        _arch(ctx)  # torch's own arch list judges the build even when its version is not given
    elif build.version is None:
        if torch.installed is False or torch.importable is False:
            _not_installed(ctx)
        else:
            ctx.skip(AREA, "the PyTorch version (not in the report)")
    elif build.kind is None:
        ctx.skip(AREA, f"whether {build.label} is a CUDA build (not stated)")
    _capability_range(ctx)
    if build.kind != "cuda":
        _no_kernel_message(ctx)  # the message is evidence even when the build is unknown
    if build.kind in ("cuda", None) and not ctx.has("arch-unsupported"):
        _older_than_every_release(ctx)


def _older_than_every_release(ctx: Context) -> None:
    """A GPU below the oldest architecture any published wheel has kernels for cannot run any
    PyTorch build, so it needs no build facts to be an error."""
    oldest = kb.oldest_cc_any_release_runs()
    for gpu in ctx.nvidia_gpus:
        cc = kb.cc_tuple(gpu.cc or "")
        if cc is None or oldest is None or cc >= oldest or gpu.cc_guessed:
            continue
        arch = kb.architecture(gpu.cc or "")
        ctx.add("TU101", ERROR,
                f"{gpu.name} is compute capability {gpu.cc}"
                f"{f' ({arch.name})' if arch else ''}: no published PyTorch wheel has kernels "
                f"for it (the oldest any has is {oldest[0]}.{oldest[1]}).",
                "use a newer GPU (or the CPU); no PyTorch release runs on this one")


def _not_installed(ctx: Context) -> None:
    gpu = ctx.nvidia_gpus[0] if ctx.nvidia_gpus else None
    wheel = find_wheel(ctx, cc=gpu.cc if gpu else None) if ctx.nvidia_present else None
    if wheel is not None:
        release, variant = wheel
        fix = install_fix(ctx, release, variant)
    else:
        fix = "pip install torch"
    state = "is not importable" if ctx.snap.torch.importable is False else "is not installed"
    ctx.add("TU105", INFO, f"PyTorch {state} in this environment.", fix)


def _cpu_only(ctx: Context) -> None:
    build = ctx.build
    conda = "pytorch" in (ctx.snap.conda_packages or {})
    if ctx.nvidia_present:
        gpus = ", ".join(g.name for g in ctx.nvidia_gpus) or f"driver {ctx.snap.driver.version}"
        cc = next((g.cc for g in ctx.nvidia_gpus if g.cc), None)
        wheel = find_wheel(ctx, cc=cc, start=build.release) if build.release else None
        fix = (
            install_fix(ctx, *wheel)
            if wheel
            else "install a CUDA build from https://pytorch.org/get-started/locally/"
        )
        if ctx.jetson_gpus:
            fix = JETPACK_FIX
        elif conda or (build.version and "+" not in build.version and ctx.os_family == "linux"):
            fix += f" (conda: remove cpuonly and pin the CUDA build, 'pytorch={build.base_version}=*cuda*')"
        severity = WARNING if build.assumed else ERROR
        ctx.add(
            "TU103",
            severity,
            f"{build.label} is a CPU-only build ({build.basis}) but this machine has an NVIDIA GPU ({gpus}).",
            fix,
        )
        return
    hints = _cuda_hints(ctx) if ctx.snap.gpus is None else ""  # gpus == []: known to have none
    if hints:
        if build.is_dev:
            cuda = versions.cuda_tag(ctx.snap.cuda_toolkit or "") or "cu128"
            fix = (
                f"pip install --pre torch --index-url https://download.pytorch.org/whl/nightly/{cuda} "
                "(conda: pin the CUDA build, 'pytorch=*=*cuda*')"
            )
        else:
            fix = "if this machine has an NVIDIA GPU, install a CUDA build from https://pytorch.org/get-started/locally/"
        ctx.add(
            "TU104",
            WARNING,
            f"{build.label} is a CPU-only build ({build.basis}) while {hints} is installed: "
            "it cannot use an NVIDIA GPU.",
            fix,
        )
    elif ctx.snap.gpus is None and ctx.snap.source != "live":
        ctx.add(
            "TU104",
            WARNING,
            f"{build.label} is a CPU-only build ({build.basis}); the report lists no GPU, which "
            "does not mean the machine has none: this build can use no NVIDIA GPU.",
            "check with nvidia-smi; on a machine with an NVIDIA GPU install a CUDA build (tuneup "
            "doctor there names the index that fits its GPU and driver)",
        )
    else:
        ctx.ok(AREA, f"{build.label} is a CPU build and no NVIDIA GPU was found")


def _cuda_hints(ctx: Context) -> str:
    if ctx.snap.cuda_toolkit:
        return f"a CUDA toolkit ({ctx.snap.cuda_toolkit})"
    cuda_pips = sorted(p for p in ctx.snap.pip_packages or {} if p.startswith("nvidia-cu"))
    return f"CUDA libraries ({', '.join(cuda_pips)})" if cuda_pips else ""


def _arch(ctx: Context) -> None:
    if not ctx.nvidia_gpus and ctx.snap.gpus is None:
        ctx.skip(AREA, "GPU architecture (the report lists no GPU)")
    targets = ctx.arch_targets()
    for gpu in ctx.nvidia_gpus:
        if gpu.cc is None:
            ctx.skip(AREA, f"{gpu.name}: compute capability unknown (not in the GPU table)")
        elif targets is None:
            if not _toolkit_cannot_target(ctx, gpu):
                ctx.skip(AREA, f"{gpu.name}: the arch list of {ctx.build.label} is unknown")
        else:
            _arch_one(ctx, gpu, *targets)
    _no_kernel_message(ctx)


def _capability_range(ctx: Context) -> None:
    """torch's ``Minimum and Maximum cuda capability supported ... is (8.0) - (12.0)`` states
    the range of the build's own arch list. A GPU below the minimum, or of a major above the
    maximum's, has no kernels (an error: torch said so); one of the maximum's major with a
    higher minor runs its kernels (binary compatibility), so the warning is a false alarm."""
    found = messages.find(ctx.all_messages, "capability-min-max")
    if found is None or ctx.has("arch-unsupported"):
        return
    low, high = kb.cc_tuple(found["min"]), kb.cc_tuple(found["max"])
    for gpu in ctx.nvidia_gpus:
        cc = kb.cc_tuple(gpu.cc or "")
        if cc is None or low is None or high is None:
            continue
        if cc < low or cc[0] > high[0]:
            ctx.add("TU107", ERROR,
                    f"torch says its build covers capabilities {found['min']} to {found['max']}: "
                    f"{gpu.name} ({gpu.cc}) is outside, so it has no kernels for it.",
                    _wheel_fix(ctx, gpu))
            return


def _wheel_fix(ctx: Context, gpu: GpuFact) -> str:
    wheel = find_wheel(ctx, cc=gpu.cc)
    return (install_fix(ctx, *wheel) if wheel else
            "install a build whose arch list covers the GPU (tuneup doctor on the machine names it)")


def _no_kernel_message(ctx: Context) -> None:
    if messages.says(ctx.all_messages, "no-kernel-image") and not ctx.has("arch-unsupported"):
        ctx.add(
            "TU102",
            WARNING,
            f"torch reported '{NO_KERNEL_IMAGE}': {ctx.build.label} (or an extension) lacks kernels for the GPU.",
            "compare python -c 'import torch; print(torch.cuda.get_arch_list())' with "
            "nvidia-smi --query-gpu=name,compute_cap --format=csv and install a build that lists your GPU's sm_XY",
        )


def _toolkit_cannot_target(ctx: Context, gpu: GpuFact) -> bool:
    """When the build's arch list is unknown (a nightly, a dev or unlisted version), its CUDA
    toolkit still settles it: a toolkit compiles only for the architectures in its range
    (sm_120 needs CUDA >= 12.8; CUDA 12.0 dropped Kepler, 13.0 Maxwell to Volta), so a GPU
    outside that range has no kernels in the build, whatever its version. Adds the finding
    and returns True in that case."""
    build, cc = ctx.build, gpu.cc or ""
    arch = kb.architecture(cc)
    have = versions.major_minor(build.cuda)
    if build.kind != "cuda" or have is None or arch is None:
        return False
    first, last = versions.major_minor(arch.first_cuda), versions.major_minor(arch.last_cuda)
    sibling = kb.targetable_sibling(cc, build.cuda or "")
    if first is not None and have < first and sibling:
        ctx.skip(AREA, f"{gpu.name} (CC {cc}): CUDA {build.cuda} cannot target it, but it runs "
                       f"sm_{sibling.replace('.', '')} kernels (same major) if {build.label} "
                       "carries them: its arch list is unknown")
        return True
    if first is not None and have < first:
        reason = f"which cannot target it (the first toolkit that can is CUDA {arch.first_cuda})"
    elif last is not None and have > last:
        reason = f"which no longer targets it (the last toolkit that does is CUDA {arch.last_cuda})"
    else:
        return False
    wheel = find_wheel(ctx, cc=cc, start=build.release)
    if wheel is not None:
        fix = install_fix(ctx, *wheel)
    elif first is not None and have < first:
        fix = (f"install a build made with CUDA >= {arch.first_cuda}, e.g. the nightly: "
               f"pip install --pre torch --index-url https://download.pytorch.org/whl/nightly/"
               f"{versions.cuda_tag(arch.first_cuda)}")
    else:
        fix = (f"install a build made with CUDA <= {arch.last_cuda} (an older release for "
               f"{arch.name}), or build PyTorch from source with TORCH_CUDA_ARCH_LIST={cc}")
    ctx.add("TU106", WARNING if gpu.cc_guessed else ERROR,
            f"{gpu.name} is compute capability {cc} ({arch.name}{gpu.cc_note}); {build.label} was built with "
            f"CUDA {build.cuda} ({build.basis}), {reason}: the build has no kernels for this GPU.",
            fix)
    return True


def _arch_one(
    ctx: Context, gpu: GpuFact, sass: list[str], ptx: list[str], where: str, verified: bool
) -> None:
    build = ctx.build
    cc = gpu.cc or ""
    shown = (
        " ".join([_arch_name(a, "sm_") for a in sass] + [_arch_name(a, "compute_") for a in ptx])
        or "none"
    )
    if kb.arch_covers(sass, ptx, cc):
        ctx.ok(AREA, f"{gpu.name} (CC {cc}) runs {build.label} kernels ({shown})")
        return
    arch = kb.architecture(cc)
    family = f" ({arch.name})" if arch else ""
    message = (
        f"{gpu.name} is compute capability {cc}{family}{gpu.cc_note}, but {build.label} has "
        f"kernels only for "
        f"{shown} (from {where})."
    )
    wheel = find_wheel(ctx, cc=cc, start=build.release)
    if wheel is not None:
        fix = install_fix(ctx, *wheel)
        if ctx.driver_runs(versions.cuda_from_tag(wheel[1]) or "") is None and ctx.nvidia_present:
            need = kb.driver_requirement(versions.cuda_from_tag(wheel[1]) or "", ctx.driver_os)
            if need and need.floor_driver:
                fix += f" (needs NVIDIA driver >= {need.floor_driver})"
    elif (alone := find_wheel(ctx, cc=cc, start=build.release, every_gpu=False)) is not None:
        others = sorted({g.cc for g in ctx.nvidia_gpus if g.cc} - {cc})
        fix = (f"no single published wheel has kernels for every GPU here (CC {cc} and "
               f"{', '.join(others)}): for this GPU {install_fix(ctx, *alone)}, in an "
               "environment of its own; or build PyTorch from source with "
               f"TORCH_CUDA_ARCH_LIST=\"{';'.join(sorted({cc, *others}))}\"")
    else:
        last = (
            f" with CUDA <= {arch.last_cuda} (the last toolkit that targets it)"
            if arch and arch.last_cuda
            else ""
        )
        fix = (
            f"no published PyTorch wheel in tuneup's tables has sm_{cc.replace('.', '')} kernels: "
            f"build PyTorch from source{last} with TORCH_CUDA_ARCH_LIST={cc}"
        )
    proven = verified and not gpu.cc_guessed
    ctx.add("TU101" if proven else "TU102", ERROR if proven else WARNING, message, fix)


def _arch_name(entry: str, prefix: str) -> str:
    if entry.startswith(("sm_", "compute_")):
        return entry
    cc = kb.cc_tuple(entry)
    return f"{prefix}{cc[0]}{cc[1]}" if cc else entry
