"""NCCL rules: one libnccl for one CUDA major, and no transport silently switched off."""

from __future__ import annotations


from tuneup.doctor import messages, ngc
from tuneup.doctor.findings import ERROR, INFO, WARNING
from tuneup.doctor.rules.context import Context
from tuneup.machine import versions

AREA = "nccl"
TRANSPORT_SWITCHES = {
    "NCCL_P2P_DISABLE": "peer-to-peer GPU copies (NVLink/PCIe) go through host memory",
    "NCCL_IB_DISABLE": "InfiniBand/RoCE is off; inter-node traffic falls back to TCP sockets",
    "NCCL_SHM_DISABLE": "the shared-memory transport is off",
}


# NCCL's own pip wheels for CUDA 11 are built with the CUDA 11.0 runtime (NCCL prints
# "NCCL version 2.19.3+cuda11.0", https://github.com/vllm-project/vllm/issues/3069); NCCL calls
# can be captured in a CUDA graph only from a 11.3 runtime on (NCCL's own warning says so).
WHEEL_BUILT_WITH = {11: (11, 0)}
GRAPH_CAPTURE_FROM = (11, 3)

# Consumer Blackwell (CC 12.0: RTX 50xx, RTX PRO Blackwell): NCCL 2.25.1, the first with
# Blackwell kernels, needs more shared memory per block than these GPUs give ("ncclMaxSharedMem
# 82240 exceeds device/fn maxSharedMem 79856"), so collectives between two of them fail; the
# NCCL maintainers: "no chance to get things to work with 2.25.1", fixed in 2.26.2, confirmed on
# RTX 5090s (https://github.com/NVIDIA/nccl/issues/1637, NVIDIA/nccl-tests#287 and #291).
SM120_CC = "12.0"
SM120_MULTI_GPU_NCCL = "2.26.2"


def check(ctx: Context) -> None:
    _windows(ctx)
    _wheels(ctx)
    _wheel_fit(ctx)
    _consumer_blackwell(ctx)
    _graph_capture(ctx)
    _symbols(ctx)
    _system_error(ctx)
    _libraries(ctx)
    _switches(ctx)


def _windows(ctx: Context) -> None:
    """TU410: PyTorch's Windows wheels are built without NCCL (USE_DISTRIBUTED uses gloo there),
    so a NCCL process group cannot exist on this machine whatever the driver or CUDA build."""
    if ctx.os_family == "windows" and ctx.build.kind == "cuda" and not ctx.has("nccl-problem"):
        ctx.add("TU410", INFO,
                f"{ctx.build.label} on Windows has no NCCL: torch.distributed (DDP, Lightning's "
                "'ddp' strategies) needs backend='gloo' here.",
                "init_process_group(backend='gloo') (Lightning: strategy='ddp' with "
                "process_group_backend='gloo'), or run under WSL2/Linux for NCCL")


def _wheel_fit(ctx: Context) -> None:
    """The one NCCL wheel against the build: its CUDA major, and the release's pinned NCCL."""
    wheels, build = ctx.cuda_wheels("nccl"), ctx.build
    major = build.cuda_major
    if len(wheels) != 1 or build.kind != "cuda" or major is None:
        return
    ((wheel_major, (name, version)),) = wheels.items()
    if wheel_major != major:
        ctx.add(
            "TU405",
            ERROR,
            f"{name}=={version} is NCCL for CUDA {wheel_major}, but {build.label} is a CUDA {major} "
            f"build ({build.basis}): torch loads that libnccl and lacks symbols or crashes in "
            "collectives.",
            f"pip uninstall -y {name} && pip install nvidia-nccl-cu{major}  (or reinstall torch, "
            "which pins the right one)",
        )
        return
    row = ctx.variant_row(build.version, build.variant) if build.version and build.variant else None
    pinned = row.nccl if row is not None else None
    if pinned and (versions.release(version) or ()) < (versions.release(pinned) or ()):
        ctx.add(
            "TU406",
            WARNING,
            f"{name}=={version} is older than NCCL {pinned}, which torch {row.release} {row.name} "
            "pins: torch may call NCCL functions this library lacks.",
            f"pip install '{name}>={pinned}' (or pip install --force-reinstall torch=={build.version})",
        )


def _graph_capture(ctx: Context) -> None:
    wheels = ctx.cuda_wheels("nccl")
    major = ctx.build.cuda_major
    said = messages.says(ctx.all_messages, "nccl-graph-capture")
    built = WHEEL_BUILT_WITH.get(major) if major in wheels else None
    if not said and (built is None or built >= GRAPH_CAPTURE_FROM):
        return
    name = f"{wheels[major][0]}=={wheels[major][1]}" if major in wheels else "the loaded NCCL"
    basis = "NCCL's own warning" if said else f"{name} is built with CUDA {built[0]}.{built[1]}"
    ctx.add(
        "TU407",
        ERROR if said else WARNING,
        f"NCCL calls cannot be captured in CUDA graphs ({basis}; capture needs an NCCL built with "
        "CUDA >= 11.3): multi-GPU runs that use CUDA graphs (vLLM, torch.compile "
        "mode='reduce-overhead') fail, single-GPU runs do not.",
        "use a CUDA 12 build of torch (pip install torch --index-url "
        "https://download.pytorch.org/whl/cu121 or newer), whose nvidia-nccl-cu12 is built with "
        "CUDA 12; or run without CUDA graphs (vLLM: --enforce-eager)",
    )


def _system_error(ctx: Context) -> None:
    if not messages.says(ctx.all_messages, "nccl-system-error"):
        return
    ctx.add(
        "TU408",
        WARNING,
        "NCCL failed with 'unhandled system error': a system call failed (most often shared memory "
        "too small in a container, a network interface NCCL picked that does not route, or peer "
        "access blocked).",
        "rerun with NCCL_DEBUG=INFO to see the call; in Docker add --ipc=host (or --shm-size=8g); "
        "pin the interface with NCCL_SOCKET_IFNAME=<iface>; try NCCL_P2P_DISABLE=1 once to test",
    )


def _wheels(ctx: Context) -> None:
    wheels = ctx.cuda_wheels("nccl")
    if len(wheels) < 2:
        if wheels:
            ctx.ok(AREA, f"one NCCL wheel ({' '.join(f'{n}=={v}' for n, v in wheels.values())})")
        return
    build_major = ctx.build.cuda_major
    keep = build_major if build_major in wheels else max(wheels)
    extra = [wheels[m][0] for m in sorted(wheels) if m != keep]
    listed = ", ".join(f"{n}=={v}" for n, v in wheels.values())
    basis = (
        f"your torch is a CUDA {build_major} build"
        if build_major in wheels
        else "keeping the newest CUDA major"
    )
    ctx.add(
        "TU401",
        ERROR,
        f"NCCL wheels for {len(wheels)} CUDA majors are installed ({listed}); only one libnccl.so.2 can load "
        "and the wrong one lacks symbols torch needs.",
        f"pip uninstall -y {' '.join(extra)}  ({basis}: keep {wheels[keep][0]})",
    )


def _symbols(ctx: Context) -> None:
    match = messages.find(ctx.all_messages, "nccl-undefined-symbol")
    if match:
        ctx.add(
            "TU402",
            ERROR,
            f"torch could not find the NCCL symbol {match['symbol']}: an older or foreign libnccl.so.2 was loaded.",
            "remove other libnccl from LD_LIBRARY_PATH / LD_PRELOAD and keep only the nvidia-nccl wheel torch "
            "pins (pip show torch | grep -i nccl)",
        )


def _libraries(ctx: Context) -> None:
    found = sorted(set(ctx.snap.nccl_versions or []))
    preload = [
        name
        for name in ("LD_PRELOAD", "LD_LIBRARY_PATH")
        if "nccl" in (ctx.env(name) or "").lower()
    ]
    if len(found) > 1 or preload:
        where = (
            f"libnccl found {', '.join(found)} on the library path"
            if len(found) > 1
            else f"{' and '.join(preload)} names an NCCL library"
        )
        ctx.add(
            "TU404",
            WARNING,
            f"{where}: a second libnccl can shadow the one torch was built against.",
            f"drop the extra NCCL from {' / '.join(preload) or 'the library path'} so torch loads its own",
        )


def _switches(ctx: Context) -> None:
    for name, effect in TRANSPORT_SWITCHES.items():
        value = ctx.env(name)
        if value is not None and value.strip() not in ("", "0"):
            ctx.add(
                "TU403",
                WARNING,
                f"{name}={value}: {effect}, which costs bandwidth.",
                f"unset {name} unless it works around a known hang on this machine",
            )


def _nccl_in_use(ctx: Context) -> tuple[str, str, bool] | None:
    """(NCCL version, where it was learned, whether that is a stated fact) of this torch."""
    build = ctx.build
    if ctx.snap.torch.nccl:
        return ctx.snap.torch.nccl, "the NCCL version the input states", True
    wheel = ctx.cuda_wheels("nccl").get(build.cuda_major) if build.cuda_major else None
    container = ngc.container(build.version)
    # an NGC torch loads the container's libnccl; a pip wheel only where LD_PRELOAD names it
    preloaded = "nccl" in (ctx.env("LD_PRELOAD") or "").lower()
    if wheel is not None and (container is None or preloaded):
        return wheel[1], f"the installed {wheel[0]}=={wheel[1]}", True
    if container is not None and container.nccl:
        doubt = "" if container.verified else ", an UNVERIFIED table row"
        return container.nccl, f"NGC PyTorch container {container.tag} ships it{doubt}", False
    if build.kind == "cuda" and build.version and build.variant and not ngc.container_tag(
            build.version):
        row = ctx.variant_row(build.version, build.variant)
        if row is not None and row.nccl:
            nearest = " (the nearest release of this build)" if not build.is_published_wheel else ""
            return row.nccl, f"torch {row.release} {row.name} pins it{nearest}", False
    return None


def _consumer_blackwell(ctx: Context) -> None:
    """TU411: an NCCL older than the first that runs collectives between CC 12.0 GPUs."""
    gpus = [g for g in ctx.nvidia_gpus if g.cc == SM120_CC]
    if len(gpus) < 2 or ctx.build.kind not in ("cuda", None) or ctx.os_family == "windows":
        return
    found = _nccl_in_use(ctx)
    if found is None:
        ctx.skip(AREA, f"which NCCL runs the {len(gpus)} CC {SM120_CC} GPUs (not in the report)")
        return
    version, basis, stated = found
    if (versions.release(version) or ()) >= (versions.release(SM120_MULTI_GPU_NCCL) or ()):
        ctx.ok(AREA, f"NCCL {version} runs collectives on CC {SM120_CC} GPUs ({basis})")
        return
    said = messages.says(ctx.all_messages, "nccl-max-shared-mem")
    names = ", ".join(dict.fromkeys(g.name for g in gpus))
    ctx.add(
        "TU411",
        ERROR if said else WARNING,
        f"NCCL {version} ({basis}) cannot run collectives between the {len(gpus)} CC "
        f"{SM120_CC} GPUs ({names}): its kernels need more shared memory than these GPUs give "
        "(NCCL logs 'ncclMaxSharedMem ... exceeds device/fn maxSharedMem'), so multi-GPU "
        f"runs (DDP, tensor parallel) fail or hang while one GPU works; NCCL "
        f"{SM120_MULTI_GPU_NCCL} fixed it" + ("." if stated or said else
                                             "; NCCL_DEBUG=INFO prints the NCCL in use."),
        f"use NCCL >= {SM120_MULTI_GPU_NCCL}: a newer NGC container or torch build that ships "
        f"it, or pip install 'nvidia-nccl-cu12>={SM120_MULTI_GPU_NCCL}' (a pip torch loads that "
        "wheel's libnccl; in a container, put its lib folder first with LD_PRELOAD="
        ".../nvidia/nccl/lib/libnccl.so.2)",
    )
