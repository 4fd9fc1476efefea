"""cuDNN rules: the cuDNN loaded at run time against the one torch was compiled with."""

from __future__ import annotations

import os
import re

from tuneup.doctor import knowledge as kb
from tuneup.doctor.findings import ERROR, INFO, WARNING
from tuneup.doctor.rules.context import Context
from tuneup.machine import versions

AREA = "cudnn"
INCOMPATIBILITY = re.compile(
    r"compiled\s+against\s+\((\d+),\s*(\d+),\s*(\d+)\)\s+but\s+(?:found runtime version|linked against)\s+"
    r"\((\d+),\s*(\d+),\s*(\d+)\)"
)
BARE_VERSION = re.compile(r"\d+(?:\.\d+){1,3}")
PIP_CUDNN_FROM = (2, 1)  # Linux CUDA wheels of torch >= 2.1 load cuDNN from an nvidia-cudnn wheel
SM75_CUDNN = (9, 11)  # cuDNN 9.11.0 dropped GPUs below compute capability 7.5
TORCH_RUNTIME = "torch.backends.cudnn.version()"
ONE_CUDNN = ("keep one cuDNN: remove the system cuDNN from the loader path (LD_LIBRARY_PATH, "
             "or /etc/ld.so.conf.d + sudo ldconfig), or pin the pip wheel to the system's "
             "version")
WHICH_LOADS = ("LD_DEBUG=libs python -c 'import torch; torch.backends.cudnn.version()' 2>&1 "
               "| grep libcudnn")


def check(ctx: Context) -> None:
    compiled = _compiled(ctx)
    runtime = _runtime(ctx)
    _old_gpus(ctx, compiled, runtime)
    if compiled is None or runtime is None:
        if runtime is None and compiled is not None and _ld_path_cudnn(ctx):
            _shadow_risk(ctx, compiled[0])
        elif runtime is None and compiled is not None:
            _two_builds(ctx, *compiled)
        elif compiled is None and runtime is not None:
            ctx.skip(AREA, f"cuDNN {runtime[0]} against torch's compiled cuDNN (unknown)")
        return
    (want, want_from), (got, got_from) = compiled, runtime
    if _compatible(want, got):
        loaded = (got, got_from) if got_from == TORCH_RUNTIME else None
        if not _two_builds(ctx, want, want_from, loaded):
            ctx.ok(AREA, f"runtime cuDNN {got} matches compiled cuDNN {want}")
        return
    message = (
        f"cuDNN {got} ({got_from}) is loaded, but torch was compiled against cuDNN {want} "
        f"({want_from}): {'different major' if _major(want) != _major(got) else 'older minor'}."
    )
    ctx.add("TU301", ERROR, message, _fix(ctx, want))


def _compiled(ctx: Context) -> tuple[str, str] | None:
    match = INCOMPATIBILITY.search(ctx.all_messages)
    if match:
        return ".".join(match.groups()[:3]), "torch's error message"
    torch = ctx.snap.torch
    if torch.cudnn_compiled:
        return torch.cudnn_compiled, "torch.backends.cudnn"
    wheel = _cudnn_wheel(ctx)
    if wheel is not None:
        return wheel[1], f"pip {wheel[0]}"
    build = ctx.build
    if build.kind == "cuda" and build.variant and (build.is_published_wheel or build.is_dev):
        row = ctx.variant_row(build.version, build.variant)
        if row is not None and row.cudnn:
            nearest = " (the nearest release of this nightly)" if build.is_dev else ""
            return row.cudnn, f"bundled with the {row.release} {row.name} wheel{nearest}"
    return None


def _cudnn_wheel(ctx: Context) -> tuple[str, str] | None:
    """(name, version) of the nvidia-cudnn wheel torch loads: the one for its CUDA major."""
    wheels, major = ctx.cuda_wheels("cudnn"), ctx.build.cuda_major
    if major in wheels:
        return wheels[major]
    if len(wheels) == 1 or (major is None and wheels):  # the only one, or no build to match
        return wheels[max(wheels)]
    return None


def _runtime(ctx: Context) -> tuple[str, str] | None:
    """The cuDNN actually loaded, only from evidence that it is loaded (not a mere listing)."""
    match = INCOMPATIBILITY.search(ctx.all_messages)
    if match:
        return ".".join(match.groups()[3:]), "torch's error message"
    if ctx.snap.torch.cudnn_runtime:
        return ctx.snap.torch.cudnn_runtime, TORCH_RUNTIME
    for entry in ctx.snap.cudnn_libraries or []:
        if BARE_VERSION.fullmatch(entry.strip()):
            return entry.strip(), "the report's cuDNN version"
    for path in ctx.snap.cudnn_libraries or []:
        directory = os.path.dirname(path)
        version = versions.library_version(path)
        if directory and version and "." in version and directory in _ld_dirs(ctx):
            return version, f"{path}, on LD_LIBRARY_PATH"
    return None


def _ld_dirs(ctx: Context) -> list[str]:
    return [d.rstrip("/") for d in (ctx.env("LD_LIBRARY_PATH") or "").split(":") if d]


def _ld_path_cudnn(ctx: Context) -> list[str]:
    return [d for d in _ld_dirs(ctx) if "cudnn" in d.lower()]


def _major(version: str) -> int:
    return (versions.release(version) or (0,))[0]


def _compatible(compiled: str, runtime: str) -> bool:
    """PyTorch's own rule: same major; for cuDNN >= 7 the runtime minor may be newer."""
    want, got = versions.major_minor(compiled), versions.major_minor(runtime)
    if want is None or got is None:
        return True
    if want[0] != got[0]:
        return False
    return got[1] >= want[1] if want[0] >= 7 else got[1] == want[1]


def _fix(ctx: Context, want: str) -> str:
    dirs = _ld_path_cudnn(ctx) or [d for d in _ld_dirs(ctx) if "cuda" in d.lower()]
    if dirs:
        return (
            f"remove {', '.join(dirs)} from LD_LIBRARY_PATH so torch loads the cuDNN it bundles "
            f"(or install cuDNN {want} there)"
        )
    return (
        f"make torch load the cuDNN it ships with: drop any directory holding another libcudnn from "
        f"LD_LIBRARY_PATH (check with: env | grep LD_LIBRARY_PATH), or install cuDNN {want}"
    )


def _shadow_risk(ctx: Context, want: str) -> None:
    dirs = _ld_path_cudnn(ctx)
    ctx.add(
        "TU302",
        WARNING,
        f"LD_LIBRARY_PATH holds a cuDNN directory ({', '.join(dirs)}); it can shadow the cuDNN {want} "
        "torch was built with.",
        f"unset the cuDNN entries: export LD_LIBRARY_PATH=<the same list without {dirs[0]}>",
    )


def _old_gpus(
    ctx: Context, compiled: tuple[str, str] | None, runtime: tuple[str, str] | None
) -> None:
    version = (runtime or compiled or (None, None))[0]
    mm = versions.major_minor(version)
    if mm is None or mm < SM75_CUDNN:
        return
    for gpu in ctx.nvidia_gpus:
        cc = kb.cc_tuple(gpu.cc or "")
        if cc is not None and cc < (7, 5):
            ctx.add(
                "TU303",
                WARNING,
                f"cuDNN {version} no longer supports {gpu.name} (CC {gpu.cc}); cuDNN 9.11+ needs CC >= 7.5.",
                "install a torch variant that ships cuDNN 9.10 (the cu126 builds), e.g. "
                "pip install torch --index-url https://download.pytorch.org/whl/cu126",
            )


def _two_builds(ctx: Context, wheel: str, wheel_from: str,
                loaded: tuple[str, str] | None = None) -> bool:
    """A system cuDNN of the same major at another version beside the pip cuDNN torch loads:
    two builds, one process. Returns whether it warned.

    torch reaches its wheel's cuDNN through RUNPATH, but cuDNN 9 dlopens its engine
    sub-libraries by bare soname, so one missing from the wheel (or a preloaded one) comes from
    the system copy: two cuDNN versions in one process, which fails in odd places. A warning
    only when the system copy's version is known to differ (from its name, its own
    ``cudnnGetVersion``, its real file or header: :mod:`tuneup.machine.probe.cudnn`); the
    same version is a passed check, an unread one a note.
    """
    if not _loads_pip_cudnn(ctx, wheel_from):
        return False
    ours, ours_from = loaded or (wheel, wheel_from)
    stated = [(entry, _stated_version(ctx, entry)) for entry in ctx.snap.cudnn_libraries or []
              if entry.strip()]
    same_major = [(entry, v) for entry, v in stated if v and _major(v) == _major(ours)]
    differing = [(entry, v) for entry, v in same_major
                 if _full(v) and not _same_build(v, ours)]
    unread = [entry for entry, v in same_major if not _full(v)]
    if differing:
        ctx.add(
            "TU304",
            WARNING,
            f"two cuDNN {_major(ours)} builds: torch loads cuDNN {ours} ({ours_from}), and the "
            f"system has cuDNN {', '.join(dict.fromkeys(v for _, v in differing))} "
            f"({_listed([entry for entry, _ in differing])}); a sub-library found by soname "
            "can come from the other one, mixing two cuDNN versions in one process.",
            f"{ONE_CUDNN}; check with {WHICH_LOADS}",
        )
        return True
    if unread:
        ctx.add(
            "TU304",
            INFO,
            f"a system cuDNN {_major(ours)} ({_listed(unread)}) is on the loader path beside "
            f"the cuDNN {ours} torch loads ({ours_from}); its full version could not be read, "
            "so whether two cuDNN versions can meet in one process is unknown.",
            f"read it: python -c \"import ctypes; print(ctypes.CDLL('{unread[0]}')"
            f".cudnnGetVersion())\"; if it is not {ours}: {ONE_CUDNN}",
        )
    elif same_major:
        ctx.ok(AREA, f"the system cuDNN {same_major[0][1]} ({_listed([e for e, _ in same_major])})"
                     f" is the version torch loads")
    return False


def _stated_version(ctx: Context, entry: str) -> str | None:
    """The version a system cuDNN entry states: as the library itself said (probe), else
    its name's."""
    for read in ctx.snap.cudnn_library_versions or []:
        if read.path == entry and read.version:
            return read.version
    return versions.library_version(entry)


def _full(version: str) -> bool:
    """At least major.minor: a soname's major alone does not tell two builds apart."""
    return len(versions.release(version) or ()) >= 2


def _listed(entries: list[str]) -> str:
    return ", ".join(entries[:2]) + (" ..." if len(entries) > 2 else "")


def _loads_pip_cudnn(ctx: Context, compiled_from: str) -> bool:
    """Whether torch takes cuDNN from an nvidia-cudnn pip wheel (listed, or implied)."""
    if compiled_from.startswith("pip "):
        return True
    build = ctx.build
    if build.kind != "cuda" or ctx.os_family not in ("linux", None):
        return False
    if "pytorch" in (ctx.snap.conda_packages or {}) or build.release is None:
        return False
    return (versions.major_minor(build.release.release) or (0, 0)) >= PIP_CUDNN_FROM


def _same_build(system: str, wheel: str) -> bool:
    """Versions that are one build: equal as far as both are written, beyond the major alone."""
    a, b = versions.release(system) or (), versions.release(wheel) or ()
    n = min(len(a), len(b))
    return n >= 2 and a[:n] == b[:n]
