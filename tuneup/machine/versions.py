"""The only version code: a regex *finds* a version inside free text (a library file name,
a driver line, a wheel tag), ``packaging`` *parses* and compares it.

Torch versions (``2.6.0+cu126``, ``2.8.0.dev20250301+cu128``, ``2.3.0a0+6ddf5cf.nv24.04``)
are PEP 440; a driver (``570.124.04``), CUDA (``12.8``) or cuDNN (``9.1.0``) version is a
plain release number. Everything here takes ``None`` or odd text and returns ``None``.
"""

from __future__ import annotations

import re

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

_NUMBER = re.compile(r"\d+(?:\.\d+)*")
_LIBRARY_VERSION = re.compile(r"(?:\.so\.|_|\.)(\d+(?:\.\d+)*)(?:\.dll|\.dylib)?$")
_CUDA_TAG = re.compile(r"cu(\d{2,3})")
_KNOWN_LOCAL = re.compile(r"cu\d+|cpu|rocm[\d.]+")


def parse(text: str | None) -> Version | None:
    """``text`` as a PEP 440 version (the whole of it), or None when it is not one."""
    if not text:
        return None
    try:
        return Version(str(text).strip().split()[0])
    except (InvalidVersion, IndexError):
        return None


def release(text: str | None) -> tuple[int, ...] | None:
    """The release numbers of a version, or of the first dotted number in any text:
    ``"570.124.04"`` -> ``(570, 124, 4)``, ``"2.6.0+cu126"`` -> ``(2, 6, 0)``."""
    version = parse(text)
    if version is not None:
        return version.release
    match = _NUMBER.search(str(text or ""))
    return tuple(int(part) for part in match.group(0).split(".")) if match else None


def major_minor(text: str | None) -> tuple[int, int] | None:
    """``"10.1.243"`` -> ``(10, 1)``; ``"12"`` -> ``(12, 0)``."""
    parts = release(text)
    if not parts:
        return None
    return parts[0], (parts[1] if len(parts) > 1 else 0)


def major_minor_text(text: str | None) -> str | None:
    """``"10.1.243"`` -> ``"10.1"`` (the form CUDA versions are written in)."""
    pair = major_minor(text)
    return f"{pair[0]}.{pair[1]}" if pair else None


def base(text: str | None) -> str | None:
    """The public release of a version: ``"2.8.0.dev20250301+cu128"`` -> ``"2.8.0"``."""
    parts = release(text)
    return ".".join(str(p) for p in parts[:3]) if parts else None


def local(text: str | None) -> str:
    """The local label, lower case: ``"2.6.0+cu126"`` -> ``"cu126"`` (``""`` without one)."""
    version = parse(text)
    if version is not None:
        return (version.local or "").lower()
    if not text or "+" not in text:
        return ""
    return text.split("+", 1)[1].split()[0].lower()


def is_dev(text: str | None) -> bool:
    """A nightly or source build: ``dev`` or ``git`` in the version."""
    return bool(text and re.search(r"dev|git", text))


def is_custom_build(text: str) -> bool:
    """Nightly, pre-release, source or vendor (e.g. NGC ``2.3.0a0+6ddf5cf.nv24.04``) builds,
    whose arch lists and defaults the published wheel tables do not describe."""
    label = local(text)
    vendor = bool(label) and not _KNOWN_LOCAL.fullmatch(label)
    return vendor or bool(re.search(r"dev|git|a\d|b\d|rc\d", text.split("+")[0]))


def cuda_from_tag(tag: str) -> str | None:
    """A CUDA wheel tag -> its CUDA version: ``cu126`` -> ``"12.6"``, ``cu92`` -> ``"9.2"``."""
    match = _CUDA_TAG.fullmatch(tag)
    if not match:
        return None
    digits = match.group(1)
    return f"{int(digits[:-1])}.{digits[-1]}"


def cuda_tag(cuda: str | None) -> str | None:
    """``"12.1"`` -> ``"cu121"``."""
    pair = major_minor(cuda)
    return f"cu{pair[0]}{pair[1]}" if pair else None


def cuda_from_int(value: int) -> str | None:
    """CUDA API level as NVML / the driver give it (``12080``) -> ``"12.8"``."""
    if value <= 0:
        return None
    return f"{value // 1000}.{(value % 1000) // 10}"


def cudnn_from_int(value: int) -> str | None:
    """``cudnnGetVersion()`` -> text: cuDNN 9 ``91900`` -> ``"9.19.0"`` (major * 10000),
    cuDNN 8 and older ``8902`` -> ``"8.9.2"`` (major * 1000)."""
    if value < 1000:
        return None
    major, rest = (value // 10000, value % 10000) if value >= 10000 else (value // 1000,
                                                                           value % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def build_from_version(version: str) -> tuple[str | None, str | None]:
    """Build kind and its CUDA/ROCm version implied by a torch version's local label.

    ``2.6.0+cu126`` -> ``("cuda", "12.6")``, ``2.6.0+cpu`` -> ``("cpu", None)``,
    ``2.4.1+rocm6.1`` -> ``("rocm", "6.1")``, ``2.6.0`` -> ``(None, None)``.
    """
    label = local(version)
    if not label:
        return None, None
    cuda = cuda_from_tag(label.split(".")[0])
    if cuda:
        return "cuda", cuda
    if label.startswith("cpu"):
        return "cpu", None
    if label.startswith("rocm"):
        return "rocm", label[len("rocm"):] or None
    if label.startswith("xpu"):
        return "xpu", None
    return None, None


def library_version(entry: str) -> str | None:
    """Version in a shared-library name or a bare version.

    ``/usr/lib/libcudnn.so.8.9.2`` -> ``8.9.2``; ``libcudnn.so.8`` -> ``8``;
    ``cudnn64_8.dll`` -> ``8``; ``libnccl.so.2.21.5`` -> ``2.21.5``; ``9.13.1`` -> ``9.13.1``.
    """
    entry = entry.strip()
    if _NUMBER.fullmatch(entry):
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


def package_name(name: str) -> str:
    """PEP 503 normalised name: ``Nvidia_CUDNN.cu12`` -> ``nvidia-cudnn-cu12``."""
    return canonicalize_name(name)
