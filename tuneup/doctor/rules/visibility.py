"""Visibility rules: a CUDA build and an NVIDIA GPU, yet torch sees no device."""

from __future__ import annotations

from tuneup.doctor.findings import ERROR, INFO, WARNING
from tuneup.doctor.readers.facts import noted_value
from tuneup.doctor.rules.context import Context
from tuneup.machine import versions

AREA = "visibility"


UNEXPLAINED_FIX = (
    "find which of the usual causes holds: nvidia-smi fails or hangs → the driver module is not "
    "loaded or is wedged (reboot, or reload nvidia_uvm after a suspend: sudo rmmod nvidia_uvm && "
    "sudo modprobe nvidia_uvm); in a container → start it with --gpus all (NVIDIA Container "
    "Toolkit); CUDA_VISIBLE_DEVICES set to '' or -1 → unset it; on WSL → install the Windows "
    "NVIDIA driver, not a Linux one. Then re-run tuneup doctor"
)


def check(ctx: Context) -> None:
    _mig(ctx)
    torch = ctx.snap.torch
    if ctx.build.requested or ctx.build.kind not in ("cuda", None):
        return
    if not ctx.nvidia_present:
        if _hidden_by_visible_devices(ctx) == "hides every GPU":
            ctx.add("TU502", WARNING,
                    f"CUDA_VISIBLE_DEVICES={ctx.env('CUDA_VISIBLE_DEVICES')!r} hides every GPU "
                    "from torch.", "unset CUDA_VISIBLE_DEVICES, or list GPU indices or UUIDs "
                    "(nvidia-smi -L)")
            return
        _unexplained(ctx)
        return
    sees_none = torch.cuda_available is False or (
        torch.cuda_available is None and torch.device_count == 0
    )
    hidden = _hidden_by_visible_devices(ctx)
    if not sees_none:
        if hidden:
            ctx.add(
                "TU502",
                WARNING,
                f"CUDA_VISIBLE_DEVICES={ctx.env('CUDA_VISIBLE_DEVICES')!r}: {hidden}.",
                "list existing GPU indices or UUIDs (nvidia-smi -L), e.g. export CUDA_VISIBLE_DEVICES=0",
            )
        elif torch.cuda_available:
            ctx.ok(
                AREA,
                f"torch sees {torch.device_count if torch.device_count is not None else 'the'} GPU(s)",
            )
        else:
            ctx.skip(AREA, "whether torch sees the GPU (the report does not say)")
        return
    if ctx.explained("no-gpu-visible"):
        return  # the driver finding or a pasted message already explains it
    what = ", ".join(g.name for g in ctx.nvidia_gpus) or f"driver {ctx.snap.driver.version}"
    build = f"{ctx.build.label} (CUDA {ctx.build.cuda})" if ctx.build.cuda else ctx.build.label
    head = f"{build} cannot see the NVIDIA GPU ({what}) that is present"
    if hidden:
        ctx.add(
            "TU502",
            ERROR,
            f"{head}: CUDA_VISIBLE_DEVICES={ctx.env('CUDA_VISIBLE_DEVICES')!r} {hidden}.",
            "unset CUDA_VISIBLE_DEVICES, or set it to an existing index: export CUDA_VISIBLE_DEVICES=0",
        )
        return
    capabilities = ctx.env("NVIDIA_DRIVER_CAPABILITIES")
    if capabilities is not None and not {"compute", "all"} & set(
        capabilities.replace(" ", "").split(",")
    ):
        ctx.add(
            "TU503",
            ERROR,
            f"{head}: NVIDIA_DRIVER_CAPABILITIES={capabilities!r} lacks 'compute', so the container has "
            "nvidia-smi but no libcuda.",
            "start the container with -e NVIDIA_DRIVER_CAPABILITIES=compute,utility (or --gpus all)",
        )
        return
    reason = f" ({torch.init_error})" if torch.init_error else ""
    unknown = (
        ""
        if ctx.build.kind
        else "; the build is not in the report, and a CPU-only build looks the same"
    )
    ctx.add(
        "TU501",
        ERROR,
        f"{head}{reason}{unknown}.",
        "check in the failing environment: python -c 'import torch; print(torch.version.cuda)' must print a "
        "CUDA version; CUDA_VISIBLE_DEVICES must be unset or name an existing GPU (export "
        "CUDA_VISIBLE_DEVICES=0); in a container add --gpus all and -e NVIDIA_DRIVER_CAPABILITIES=compute,utility",
    )


def _hidden_by_visible_devices(ctx: Context) -> str:
    """Why CUDA_VISIBLE_DEVICES hides GPUs, or '' when it does not (or is unset/unknown)."""
    value = ctx.env("CUDA_VISIBLE_DEVICES")
    if value is None:
        return ""
    entries = [e.strip() for e in value.split(",")]
    if value.strip() in ("", "-1") or entries[0].lower() == "nodevfiles":
        return "hides every GPU"
    count = len(ctx.snap.gpus or []) or None
    if count is None:
        return ""
    for entry in entries:
        if entry.lstrip("-").isdigit():
            index = int(entry)
            if index < 0 or index >= count:
                return f"names GPU {index} but only {count} GPU(s) exist (indices 0..{count - 1})"
    return ""


def _mig(ctx: Context) -> None:
    """TU507: CUDA shows one process one MIG instance (the first of CUDA_VISIBLE_DEVICES), so a
    report listing several means one process cannot use them all (device 1 does not exist)."""
    count = int(noted_value(ctx.snap, "mig.devices") or 0)
    if count >= 2:
        ctx.add("TU507", INFO,
                f"the report lists {count} MIG instances: one CUDA process sees only one of them "
                "(torch.cuda.device_count() is 1, cuda:1 does not exist).",
                "run one process per MIG instance, each with CUDA_VISIBLE_DEVICES=MIG-<uuid> "
                "(nvidia-smi -L lists them)")


def _none_seen(ctx: Context) -> None:
    """TU506: a CUDA build that sees no GPU at all (``GPU models and configuration: No CUDA``,
    ``device_count() == 0``). On a machine without a GPU that is normal; in a container, under a
    CUDA_VISIBLE_DEVICES or with the driver unloaded it is a GPU hidden from the process, which
    the report alone cannot tell apart: a warning naming what hides one, unless the text says
    the machine has none."""
    if ctx.os_family == "darwin" or noted_value(ctx.snap, "machine.gpu") == "none":
        return
    build = ctx.build
    hiding = []
    visible, nvidia = ctx.env("CUDA_VISIBLE_DEVICES"), ctx.env("NVIDIA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        hiding.append(f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU")
    if nvidia is not None and nvidia.strip().lower() in ("", "void", "none"):
        hiding.append(f"NVIDIA_VISIBLE_DEVICES={nvidia!r} gives the container no GPU")
    causes = "; ".join(hiding) or (
        "a container started without --gpus all (or with NVIDIA_VISIBLE_DEVICES unset or void), "
        "CUDA_VISIBLE_DEVICES set to '' or -1, or the NVIDIA driver module not loaded")
    ctx.add("TU506", WARNING,
            f"{build.label} is a CUDA build but sees no GPU (GPU models and configuration: No "
            f"CUDA / no device): if this machine has an NVIDIA GPU, something hides it — {causes}.",
            "run nvidia-smi where the program runs: it fails in a container → start the container "
            "with --gpus all (NVIDIA Container Toolkit); it lists the GPU → unset "
            "CUDA_VISIBLE_DEVICES; it fails on the host → load or reinstall the driver. On a "
            "machine without an NVIDIA GPU nothing is wrong")


def _unexplained(ctx: Context) -> None:
    """A CUDA build that reports no usable GPU on a machine the input says nothing more about.

    Choosing a CUDA build (a ``+cuXYZ`` wheel, a conda CUDA build) says a GPU was meant to be
    used, so torch seeing none is an error in its own right. An unsuffixed build that is CUDA
    only because it is the default Linux wheel says nothing of intent: a warning.
    """
    torch, build = ctx.snap.torch, ctx.build
    if build.kind is None and torch.cuda_available is False and ctx.snap.gpus is None:
        ctx.add("TU504", WARNING,
                "torch reports no usable GPU (Is CUDA available: False), and the input names "
                "neither the build nor a GPU: either no GPU is visible to it or the build is "
                "CPU-only.",
                "tell them apart: python -c 'import torch; print(torch.__version__, "
                "torch.version.cuda)' (None means a CPU-only build) and nvidia-smi; then: "
                + UNEXPLAINED_FIX)
        return
    if build.kind != "cuda" or torch.cuda_available is not False:
        return
    if ctx.explained("no-gpu-visible"):
        return
    if ctx.snap.gpus == [] or ctx.snap.gpus is None and torch.device_count == 0:
        _none_seen(ctx)
        return
    if build.assumed:
        return
    conda = ctx.snap.conda_packages or {}
    chosen = (versions.local(build.version or "") or "").startswith("cu") or bool(
        {"pytorch-cuda", "cudatoolkit"} & set(conda)
    )
    reason = f" ({torch.init_error})" if torch.init_error else ""
    head = f"{build.label} (CUDA {build.cuda}) reports no usable GPU (Is CUDA available: False){reason}"
    if chosen or torch.init_error:
        ctx.add("TU504", ERROR, f"{head}, and the input names no GPU or driver that explains it.",
                UNEXPLAINED_FIX)
    else:
        ctx.add("TU504", WARNING,
                f"{head}; fine on a machine without an NVIDIA GPU (the default Linux wheel is a "
                "CUDA build), a problem on one with a GPU.",
                "on a machine without an NVIDIA GPU nothing is wrong (the CPU wheel is smaller: "
                "--index-url https://download.pytorch.org/whl/cpu); with a GPU: " + UNEXPLAINED_FIX)
