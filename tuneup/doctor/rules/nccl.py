"""NCCL rules: one libnccl for one CUDA major, and no transport silently switched off."""

from __future__ import annotations

import re

from tuneup.doctor import knowledge as kb
from tuneup.doctor.findings import ERROR, WARNING
from tuneup.doctor.rules.context import Context
from tuneup.machine import versions

AREA = "nccl"
NCCL_WHEEL = re.compile(r"nvidia-nccl-cu(\d+)$")
MISSING_SYMBOL = re.compile(r"undefined symbol: (nccl\w+)")
TRANSPORT_SWITCHES = {
    "NCCL_P2P_DISABLE": "peer-to-peer GPU copies (NVLink/PCIe) go through host memory",
    "NCCL_IB_DISABLE": "InfiniBand/RoCE is off; inter-node traffic falls back to TCP sockets",
    "NCCL_SHM_DISABLE": "the shared-memory transport is off",
}


def check(ctx: Context) -> None:
    _wheels(ctx)
    _symbols(ctx)
    _libraries(ctx)
    _switches(ctx)


def _wheels(ctx: Context) -> None:
    wheels = {}
    for name, version in (ctx.snap.pip_packages or {}).items():
        match = NCCL_WHEEL.match(name)
        if match:
            wheels[int(match.group(1))] = (name, version)
    if len(wheels) < 2:
        if wheels:
            ctx.ok(AREA, f"one NCCL wheel ({' '.join(f'{n}=={v}' for n, v in wheels.values())})")
        return
    build_major = (versions.major_minor(ctx.build.cuda) or (None,))[0]
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
    match = MISSING_SYMBOL.search(ctx.all_messages)
    if match:
        ctx.add(
            "TU402",
            ERROR,
            f"torch could not find the NCCL symbol {match.group(1)}: an older or foreign libnccl.so.2 was loaded.",
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
