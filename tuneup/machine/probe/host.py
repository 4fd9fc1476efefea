"""Python, OS, container/WSL, environment variables, installed packages, shared libraries."""

from __future__ import annotations

import glob
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from tuneup.machine.snapshot import Platform
from tuneup.machine import versions

ENV_NAMES = (
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDA_MODULE_LOADING",
    "CUDA_LAUNCH_BLOCKING",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
)
ENV_PREFIXES = ("NCCL_", "PYTORCH_")
PACKAGE_PREFIXES = ("torch", "nvidia-", "triton", "pytorch-triton")
CONTAINER_CGROUP_MARKERS = ("docker", "kubepods", "containerd", "lxc", "libpod", "podman")


def select_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that steer GPU visibility, library loading, NCCL and the allocator."""
    return {
        name: value
        for name, value in sorted(environ.items())
        if name in ENV_NAMES or name.startswith(ENV_PREFIXES)
    }


def is_wsl(proc_version: str) -> bool:
    """WSL kernels say so in ``/proc/version`` ("...-microsoft-standard-WSL2")."""
    return "microsoft" in proc_version.lower()


def in_container(markers: Iterable[str], proc1_cgroup: str) -> bool:
    """True if a container marker file exists or PID 1's cgroup names a container runtime."""
    if any(Path(marker).exists() for marker in markers):
        return True
    return any(word in proc1_cgroup for word in CONTAINER_CGROUP_MARKERS)


def os_pretty_name(os_release: str) -> str | None:
    """``PRETTY_NAME`` of ``/etc/os-release`` text."""
    match = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', os_release, re.MULTILINE)
    return match.group(1) if match else None


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_BUILD_DATE = re.compile(rf"\b({'|'.join(_MONTHS)})\s+(\d{{1,2}})\s+(\d{{4}})\b")


def build_day(stamp: str) -> str | None:
    """A C compiler's ``__DATE__`` ("Oct  7 2024", as ``sys.version`` and
    ``platform.python_build()`` carry the interpreter's build) as an ISO day
    ("2024-10-07"); None where ``stamp`` holds none."""
    match = _BUILD_DATE.search(stamp)
    if match is None:
        return None
    month = _MONTHS.index(match.group(1)) + 1
    return f"{match.group(3)}-{month:02d}-{int(match.group(2)):02d}"


def probe_platform() -> Platform:
    """Python, OS and where this process runs."""
    family = {"linux": "linux", "win32": "windows", "cygwin": "windows", "darwin": "darwin"}
    os_family = family.get(sys.platform, sys.platform)
    name = os_pretty_name(_read("/etc/os-release")) if os_family == "linux" else None
    if name is None:
        name = f"{platform.system()} {platform.release()}".strip() or None
    libc = "-".join(part for part in platform.libc_ver() if part) or None
    return Platform(
        python_version=platform.python_version(),
        python_implementation=platform.python_implementation(),
        python_bits=64 if sys.maxsize > 2**32 else 32,
        python_built=build_day(platform.python_build()[1]),
        os=f"{name} ({platform.machine()})" if name else None,
        os_family=os_family,
        kernel=platform.release() or None,
        is_wsl=is_wsl(_read("/proc/version")) if os_family == "linux" else False,
        in_container=in_container(("/.dockerenv", "/run/.containerenv"), _read("/proc/1/cgroup"))
        if os_family == "linux"
        else None,
        libc=libc,
    )


def installed_packages(notes: list[str]) -> dict[str, str]:
    """torch, triton and nvidia-* distributions visible to this interpreter (no pip call)."""
    from importlib import metadata

    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = versions.package_name(dist.metadata.get("Name") or "")
        if not name.startswith(PACKAGE_PREFIXES) and name != "numpy":
            continue
        if name in found and found[name] != dist.version:
            notes.append(f"two versions of {name} are installed: {found[name]} and {dist.version}")
            continue
        found[name] = dist.version
    return dict(sorted(found.items()))


def parse_ldconfig(text: str, stem: str) -> list[str]:
    """Paths of ``stem.so*`` libraries in ``ldconfig -p`` output."""
    paths = []
    for line in text.splitlines():
        name, arrow, path = line.strip().partition(" => ")
        if arrow and name.startswith(f"{stem}.so"):
            paths.append(path.strip())
    return paths


def _ldconfig_output(notes: list[str]) -> str:
    for command in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        try:
            result = subprocess.run(
                [command, "-p"], capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.SubprocessError):
            continue
        return result.stdout
    notes.append("ldconfig not found: system libraries outside LD_LIBRARY_PATH not listed")
    return ""


def shared_libraries(
    stems: Iterable[str], library_path: str, notes: list[str]
) -> dict[str, list[str]]:
    """Per library stem (``libcudnn``), the copies on LD_LIBRARY_PATH then in the ldconfig cache."""
    ldconfig = _ldconfig_output(notes)
    found: dict[str, list[str]] = {}
    for stem in stems:
        paths: list[str] = []
        for directory in filter(None, library_path.split(os.pathsep)):
            paths.extend(sorted(glob.glob(os.path.join(directory, f"{stem}.so*"))))
        paths.extend(parse_ldconfig(ldconfig, stem))
        found[stem] = list(dict.fromkeys(paths))
    return found


def parse_nvcc_version(text: str) -> str | None:
    """``nvcc --version`` output -> full toolkit version ("12.1.105")."""
    match = re.search(r"release [\d.]+, V(\d+(?:\.\d+)+)", text)
    return match.group(1) if match else None


def nvcc_version() -> str | None:
    """CUDA toolkit on PATH (what collect_env calls "CUDA runtime version")."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    try:
        result = subprocess.run(
            [nvcc, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_nvcc_version(result.stdout)
