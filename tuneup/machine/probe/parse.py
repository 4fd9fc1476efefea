"""Pure text parsers shared by the live probe and the report readers (no torch, no I/O)."""

from __future__ import annotations

import re

# CPU flags that decide which kernels and dtypes run fast; everything else is noise here.
RELEVANT_CPU_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
    "asimd",
    "sve",
    "sve2",
    "bf16",
    "i8mm",  # aarch64 "Features"
)

_LIBRARY_VERSION = re.compile(r"(?:\.so\.|_|\.)(\d+(?:\.\d+)*)(?:\.dll|\.dylib)?$")


def relevant_flags(flags_text: str) -> list[str]:
    """The flags of :data:`RELEVANT_CPU_FLAGS` present in a space-separated flag list."""
    present = set(flags_text.split())
    return [flag for flag in RELEVANT_CPU_FLAGS if flag in present]


def library_version(entry: str) -> str | None:
    """Version in a shared-library name or a bare version.

    ``/usr/lib/libcudnn.so.8.9.2`` -> ``8.9.2``; ``libcudnn.so.8`` -> ``8``;
    ``cudnn64_8.dll`` -> ``8``; ``libnccl.so.2.21.5`` -> ``2.21.5``; ``9.13.1`` -> ``9.13.1``.
    """
    entry = entry.strip()
    if re.fullmatch(r"\d+(?:\.\d+)*", entry):
        return entry
    name = re.split(r"[\\/]", entry)[-1]
    if ".so" not in name and not name.endswith((".dll", ".dylib")):
        return None
    match = _LIBRARY_VERSION.search(name)
    return match.group(1) if match else None


def distinct_versions(entries: list[str]) -> list[str]:
    """Distinct :func:`library_version` values of ``entries``, in first-seen order."""
    versions: list[str] = []
    for entry in entries:
        version = library_version(entry)
        if version and version not in versions:
            versions.append(version)
    return versions


def cuda_from_int(value: int) -> str | None:
    """CUDA API level as NVML / the driver give it (``12080``) -> ``"12.8"``."""
    if value <= 0:
        return None
    return f"{value // 1000}.{(value % 1000) // 10}"


def major_minor(version: str) -> str | None:
    """``"10.1.243"`` -> ``"10.1"``; ``"12.6"`` -> ``"12.6"``; anything else -> ``None``."""
    match = re.match(r"(\d+)\.(\d+)", version.strip())
    return f"{match.group(1)}.{match.group(2)}" if match else None


def cuda_from_wheel_tag(tag: str) -> str | None:
    """Local-version tag of a CUDA wheel (``cu126``, ``cu92``, ``cu130``) -> ``"12.6"``."""
    match = re.fullmatch(r"cu(\d{2,3})", tag)
    if not match:
        return None
    digits = match.group(1)
    return f"{digits[:-1]}.{digits[-1]}"


def build_from_version(version: str) -> tuple[str | None, str | None]:
    """Build kind and its CUDA/ROCm version implied by a torch version's local tag.

    ``2.6.0+cu126`` -> ``("cuda", "12.6")``, ``2.6.0+cpu`` -> ``("cpu", None)``,
    ``2.4.1+rocm6.1`` -> ``("rocm", "6.1")``, ``2.6.0`` -> ``(None, None)``.
    """
    _, _, local = version.partition("+")
    local = local.lower()
    if not local:
        return None, None
    cuda = cuda_from_wheel_tag(local.split(".")[0])
    if cuda:
        return "cuda", cuda
    if local.startswith("cpu"):
        return "cpu", None
    if local.startswith("rocm"):
        return "rocm", local[len("rocm") :] or None
    if local.startswith("xpu"):
        return "xpu", None
    return None, None


def normalise_package(name: str) -> str:
    """PEP 503 name: lower case, runs of ``-_.`` become ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()
