"""Compatibility knowledge: the CSV tables in ``tuneup/doctor/data`` and lookups over them.

Every table row carries a ``source`` (public reference) and a ``status``; rows marked
``UNVERIFIED`` are hints that rules must treat conservatively (warnings, not errors).
Tables are read once, on first use; nothing here imports torch.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from tuneup.machine import versions

DATA_DIR = Path(__file__).parent / "data"
VERIFIED = "verified"

CC = tuple[int, int]


@dataclass(frozen=True)
class DriverNeed:
    """What a CUDA runtime needs from the driver on one OS family."""

    cuda: str
    ga_driver: str | None  # the driver the toolkit shipped with
    floor_driver: str | None  # lowest driver that runs it (minor-version compatibility floor)
    minor_version_compat: bool  # True for CUDA 11+ (the floor is the major's floor)
    verified: bool
    source: str


@dataclass(frozen=True)
class Arch:
    cc: str
    name: str
    first_cuda: str | None
    last_cuda: str | None
    integrated: bool
    source: str


@dataclass(frozen=True)
class Release:
    """One PyTorch minor release (``2.1``) and what its wheels were built for."""

    release: str
    latest: str
    python_min: str
    python_max: str
    pypi_default: str
    variants: tuple[str, ...]
    rocm_variants: tuple[str, ...]
    verified: bool
    source: str
    python_max_by_os: tuple[tuple[str, str], ...] = ()  # ("windows", "3.12"): a narrower range

    def python_max_on(self, os_family: str | None) -> str:
        """The newest Python with wheels on ``os_family`` (the release's own when not narrower)."""
        return dict(self.python_max_by_os).get(os_family or "", self.python_max)


@dataclass(frozen=True)
class Variant:
    """One CUDA variant of a release (``cu121``) on one platform."""

    release: str
    name: str
    platform: str
    arches: tuple[str, ...]  # SASS targets as CCs, "8.6"
    ptx: tuple[str, ...]  # PTX targets as CCs
    cudnn: str | None
    nccl: str | None
    verified: bool
    source: str

    @property
    def cuda(self) -> str:
        return versions.cuda_from_tag(self.name) or ""


def _read(name: str) -> list[dict[str, str]]:
    with open(DATA_DIR / name, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _split(cell: str) -> tuple[str, ...]:
    return tuple(cell.split())


# ---------------------------------------------------------------- version helpers










def cc_tuple(text: str) -> CC | None:
    """``"8.6"``, ``"sm_86"``, ``"compute_120"``, ``"sm_90a"`` → (major, minor)."""
    text = text.strip().lower()
    match = re.fullmatch(r"(?:sm_|compute_)(\d+?)(\d)[af]?", text)
    if match:
        return int(match.group(1)), int(match.group(2))
    mm = re.fullmatch(r"(\d+)\.(\d+)", text)
    return (int(mm.group(1)), int(mm.group(2))) if mm else None


def mm_text(cc: CC) -> str:
    """(8, 6) → "8.6" (compute capabilities and CUDA or Python versions alike)."""
    return f"{cc[0]}.{cc[1]}"


# ---------------------------------------------------------------- driver ↔ CUDA


@cache
def _driver_rows() -> list[dict[str, str]]:
    return _read("cuda_drivers.csv")


@cache
def _mvc_rows() -> dict[int, dict[str, str]]:
    return {int(row["major"]): row for row in _read("cuda_mvc.csv")}


def _driver_column(os_family: str | None) -> str:
    return "windows_driver" if os_family == "windows" else "linux_driver"


def driver_requirement(cuda: str, os_family: str | None = None) -> DriverNeed | None:
    """Minimum driver for a CUDA runtime, honouring minor-version compatibility (CUDA 11+)."""
    mm = versions.major_minor(cuda)
    if mm is None:
        return None
    row = next((r for r in _driver_rows() if versions.major_minor(r["cuda"]) == mm), None)
    ga = (row or {}).get(_driver_column(os_family)) or None
    mvc = _mvc_rows().get(mm[0])
    if mvc is not None:
        floor_column = "windows_floor" if os_family == "windows" else "linux_floor"
        return DriverNeed(
            cuda=mm_text(mm),
            ga_driver=ga,
            floor_driver=mvc[floor_column] or None,
            minor_version_compat=True,
            verified=mvc["status"] == VERIFIED,
            source=mvc["source"],
        )
    if row is None:
        return None
    return DriverNeed(mm_text(mm), ga, ga, False, row["status"] == VERIFIED, row["source"])


def max_cuda_for_driver(driver: str, os_family: str | None = None) -> str | None:
    """Highest CUDA toolkit whose own driver is at most ``driver`` (verified rows only)."""
    have = versions.release(driver)
    if have is None:
        return None
    best = None
    for row in _driver_rows():
        need = versions.release(row[_driver_column(os_family)])
        if row["status"] == VERIFIED and need is not None and need <= have:
            best = row["cuda"]
    return best


def driver_branch(driver: str) -> str | None:
    parts = versions.release(driver)
    return f"R{parts[0]}" if parts else None


# ---------------------------------------------------------------- GPUs and architectures


@dataclass(frozen=True)
class GpuMatch:
    """A product name's compute capability and whether only its series was recognised."""

    cc: str
    source: str
    fallback: bool  # the exact model is not in gpus.csv; the series row of gpu_families.csv gave cc
    family: str | None  # that series, e.g. "GeForce RTX 30 series (Ampere)"


@dataclass(frozen=True)
class _GpuRow:
    pattern: re.Pattern[str]
    cc: str
    source: str
    family: str | None


# Another vendor's name can carry an NVIDIA-like model number ("Radeon 840M", "Arc A770").
_OTHER_VENDOR = re.compile(
    r"\b(?:amd|ati|radeon|instinct|intel|apple|matrox|qualcomm|adreno|mali|aspeed)\b"
)
# Words that vary within one chip: brand, board memory and form factor, laptop variants.
_NAME_NOISE = re.compile(
    r"\b(?:nvidia|geforce|laptop gpu|with max q design|max q|mobile|pcie|sxm\d?|hbm\d?e?|\d+ ?gb)\b"
)
_REGIONAL_SUFFIX = re.compile(r" d(?: v\d)?$")  # RTX 4090 D, RTX 5090 D v2: same chip


def normalise_gpu_name(name: str) -> str:
    """The words the GPU tables match on, so their patterns need not spell out every variant.

    ``"NVIDIA GeForce RTX 3060 Laptop GPU"`` → ``"rtx 3060"``,
    ``"NVIDIA A100-SXM4-80GB"`` → ``"a100"``.
    """
    words = re.sub(r"[^a-z0-9]+", " ", name.lower())
    words = re.sub(r" +", " ", _NAME_NOISE.sub(" ", words)).strip()
    return _REGIONAL_SUFFIX.sub("", words)


def _compile_rows(table: str) -> list[_GpuRow]:
    return [
        _GpuRow(re.compile(rf"\b(?:{r['pattern']})\b"), r["cc"], r["source"], r.get("family"))
        for r in _read(table)
    ]


@cache
def _gpu_patterns() -> list[_GpuRow]:
    return _compile_rows("gpus.csv")


@cache
def _family_patterns() -> list[_GpuRow]:
    return _compile_rows("gpu_families.csv")


def _longest_match(rows: list[_GpuRow], name: str) -> _GpuRow | None:
    """The row whose match covers most of the name (``gtx titan x`` beats ``titan x``)."""
    best, best_length = None, 0
    for row in rows:
        for match in row.pattern.finditer(name):
            if match.end() - match.start() > best_length:
                best, best_length = row, match.end() - match.start()
    return best


def gpu_lookup(gpu_name: str | None) -> GpuMatch | None:
    """Compute capability of an NVIDIA product name: the exact model, else its series."""
    name = normalise_gpu_name(gpu_name or "")
    if not name or _OTHER_VENDOR.search(name):
        return None
    exact = _longest_match(_gpu_patterns(), name)
    if exact is not None:
        return GpuMatch(exact.cc, exact.source, False, None)
    series = _longest_match(_family_patterns(), name)
    if series is None:
        return None
    return GpuMatch(series.cc, series.source, True, series.family)


def compute_capability(gpu_name: str | None) -> str | None:
    """Compute capability of a product name (see :func:`gpu_lookup`)."""
    match = gpu_lookup(gpu_name)
    return match.cc if match else None


@cache
def _arch_rows() -> dict[CC, Arch]:
    table = {}
    for r in _read("architectures.csv"):
        cc = cc_tuple(r["cc"])
        if cc is not None:
            table[cc] = Arch(
                r["cc"],
                r["architecture"],
                r["first_cuda"] or None,
                r["last_cuda"] or None,
                r["integrated"] == "yes",
                r["source"],
            )
    return table


def architecture(cc: str) -> Arch | None:
    key = cc_tuple(cc)
    return _arch_rows().get(key) if key else None


def arch_covers(
    sass: list[str] | tuple[str, ...], ptx: list[str] | tuple[str, ...], cc: str
) -> bool:
    """Whether a build with these SASS and PTX targets has kernels for a GPU of ``cc``.

    SASS runs on the same major with an equal or higher minor (``sm_86`` covers 8.9), except
    on integrated/Jetson parts, which need their exact target; ``a`` targets need the exact CC.
    PTX counts for a newer minor of its own major (``compute_120`` on 12.1). PTX of an older
    major (``compute_37`` on a Blackwell GPU) is not counted, as PyTorch's own check does not:
    the CUDA libraries of such a build lack the architecture and JIT of the whole library stalls.
    """
    gpu = cc_tuple(cc)
    if gpu is None:
        return False
    arch = _arch_rows().get(gpu)
    integrated = arch.integrated if arch else False
    for entry in sass:
        target = cc_tuple(entry)
        if target is None:
            continue
        exact = integrated or entry.strip().lower().endswith("a")
        if target == gpu or (not exact and target[0] == gpu[0] and target[1] <= gpu[1]):
            return True
    return any((t := cc_tuple(entry)) is not None and t[0] == gpu[0] and t <= gpu for entry in ptx)


@cache
def _features() -> list[dict[str, str]]:
    return _read("features.csv")


def hardware_features(cc: str) -> dict[str, bool]:
    """``{"bf16": True, "tf32": True, "fp8": False}`` for a GPU of this compute capability."""
    gpu = cc_tuple(cc)
    result = {}
    for row in _features():
        floor = cc_tuple(row["min_cc"])
        extra = cc_tuple(row["extra_cc"]) if row["extra_cc"] else None
        result[row["feature"]] = gpu is not None and (gpu >= floor or gpu == extra)
    return result


# ---------------------------------------------------------------- PyTorch releases


@cache
def releases() -> tuple[Release, ...]:
    rows = []
    for r in _read("torch_releases.csv"):
        rows.append(
            Release(
                r["release"],
                r["latest"],
                r["python_min"],
                r["python_max"],
                r["pypi_default"],
                _split(r["variants"]),
                _split(r["rocm_variants"]),
                r["status"] == VERIFIED,
                r["source"],
                tuple(
                    tuple(pair.split(":", 1))  # type: ignore[misc]
                    for pair in _split(r.get("python_max_by_os") or "")
                ),
            )
        )
    return tuple(sorted(rows, key=lambda rel: versions.major_minor(rel.release) or (0, 0)))


def torch_release(version: str | None) -> Release | None:
    """The table row for a torch version string (``2.6.0+cu126`` → release ``2.6``)."""
    mm = versions.major_minor(version)
    return next((rel for rel in releases() if versions.major_minor(rel.release) == mm), None)


@cache
def _variants() -> dict[tuple[str, str, str], Variant]:
    table = {}
    for r in _read("torch_variants.csv"):
        table[(r["release"], r["variant"], r["platform"])] = Variant(
            r["release"],
            r["variant"],
            r["platform"],
            _split(r["arches"]),
            _split(r["ptx"]),
            r["cudnn"] or None,
            r["nccl"] or None,
            r["status"] == VERIFIED,
            r["source"],
        )
    return table


def variant(release: str, name: str, platform: str = "linux") -> Variant | None:
    """A variant's arch list on ``platform``; falls back to the Linux row marked unverified."""
    table = _variants()
    found = table.get((release, name, platform))
    if found is not None or platform == "linux":
        return found
    linux = table.get((release, name, "linux"))
    if linux is None:
        return None
    return Variant(
        linux.release,
        linux.name,
        platform,
        linux.arches,
        (),
        linux.cudnn,
        linux.nccl,
        False,
        f"Linux list used for {platform} (no {platform} row): {linux.source}",
    )


@cache
def _platform_defaults() -> dict[str, dict[str, str]]:
    return {r["os_family"]: r for r in _read("pypi_platform_defaults.csv")}


def default_variant(release: Release, os_family: str | None) -> tuple[str, bool]:
    """The variant plain ``pip install torch==X`` gives on this OS: (name, verified)."""
    row = _platform_defaults().get(os_family or "linux", _platform_defaults()["linux"])
    if row["variant"] == "release-default":
        return release.pypi_default, release.verified and row["status"] == VERIFIED
    return row["variant"], row["status"] == VERIFIED


def python_supported(release: Release, python: str, os_family: str | None = None) -> bool:
    py = versions.major_minor(python)
    return py is not None and versions.major_minor(release.python_min) <= py <= versions.major_minor(
        release.python_max_on(os_family)
    )


def install_command(version: str, variant_name: str) -> str:
    """The pip command that installs ``torch==version`` from one download.pytorch.org index."""
    mm = versions.major_minor(version) or (0, 0)
    if mm < (1, 11):  # older wheels are published on the flat torch_stable page only
        return (
            f"pip install torch=={version}+{variant_name} "
            f"-f https://download.pytorch.org/whl/torch_stable.html"
        )
    return (
        f"pip install torch=={version} --index-url https://download.pytorch.org/whl/{variant_name}"
    )


# ---------------------------------------------------------------- AMD GPUs and ROCm wheels

# A gfx target as LLVM names it: gfx803, gfx900, gfx90a, gfx942, gfx1030, gfx1151, gfx1201.
GFX_TARGET = re.compile(r"gfx(?:[6-9]\d[0-9a-f]|1[0-2]\d[0-9a-f])")

# RDNA consumer targets whose family sibling's kernels run under HSA_OVERRIDE_GFX_VERSION:
# target -> (the sibling the wheels ship, the override value that selects it).
RDNA_SIBLINGS = {
    "gfx1031": ("gfx1030", "10.3.0"),
    "gfx1032": ("gfx1030", "10.3.0"),
    "gfx1101": ("gfx1100", "11.0.0"),
    "gfx1102": ("gfx1100", "11.0.0"),
}


@dataclass(frozen=True)
class RocmTargets:
    """The gfx targets one ROCm wheel line (``rocm6.2.4``) of PyTorch ships kernels for."""

    variant: str  # "rocm6.2.4"
    releases: tuple[str, ...]  # torch minor releases the list is known for ("2.6",)
    targets: tuple[str, ...]  # shipped by every matching row
    possible: tuple[str, ...]  # shipped by some matching row (== targets for one row)
    verified: bool  # the row is verified and is the one of the asked release
    source: str

    @property
    def rocm(self) -> str:
        return self.variant[len("rocm") :]

    @property
    def index_url(self) -> str:
        return f"https://download.pytorch.org/whl/{self.variant}"

    def ships(self, gfx: str) -> bool | None:
        """True: kernels for ``gfx`` are in; False: they are not; None: depends on the release."""
        gfx = gfx.lower()
        if gfx in self.targets:
            return True
        return None if gfx in self.possible else False


def _rocm_variant_name(text: str | None) -> str | None:
    """``"rocm6.2.4"``, ``"+rocm6.2.4"``, ``"6.2.4"`` -> ``"rocm6.2.4"``."""
    match = re.search(r"(?:rocm)?(\d+(?:\.\d+)+)", (text or "").strip().lower())
    return f"rocm{match.group(1)}" if match else None


@cache
def _rocm_rows() -> tuple[RocmTargets, ...]:
    rows = []
    for r in _read("rocm_targets.csv"):
        targets = tuple(t.lower() for t in _split(r["targets"]))
        rows.append(
            RocmTargets(
                r["variant"].strip().lower(),
                _split(r["torch"]),
                targets,
                targets,
                r["status"] == VERIFIED,
                r["source"],
            )
        )
    return tuple(rows)


def rocm_lines() -> tuple[RocmTargets, ...]:
    """Every (ROCm wheel line, torch releases) row of ``rocm_targets.csv``."""
    return _rocm_rows()


def rocm_targets(variant: str | None, release: str | None = None) -> RocmTargets | None:
    """The gfx targets of a ROCm wheel line, for torch ``release`` (``"2.6"``) when given.

    The row of that release is returned as it is. Without a release, or for a release no row
    names, the line's rows are merged: ``targets`` is what all of them ship, ``possible`` what
    any ships, and the result is never verified (which wheel it is, is not known).
    """
    name = _rocm_variant_name(variant)
    rows = [row for row in _rocm_rows() if row.variant == name]
    if not rows:
        return None
    wanted = versions.major_minor(release) if release else None
    if wanted is not None:
        for row in rows:
            if any(versions.major_minor(rel) == wanted for rel in row.releases):
                return row
    common = [t for t in rows[0].targets if all(t in row.targets for row in rows)]
    union: list[str] = []
    for row in rows:
        union.extend(t for t in row.targets if t not in union)
    releases = tuple(rel for row in rows for rel in row.releases)
    source = "; ".join(dict.fromkeys(row.source for row in rows))
    return RocmTargets(rows[0].variant, releases, tuple(common), tuple(union), False, source)


def gfx_from_override(value: str | None) -> str | None:
    """``HSA_OVERRIDE_GFX_VERSION`` (major.minor.stepping) as a gfx target:
    ``"10.3.0"`` -> ``"gfx1030"``, ``"9.0.10"`` -> ``"gfx90a"``."""
    match = re.fullmatch(r"\s*(\d+)\.(\d+)\.(\d+)\s*", value or "")
    if not match:
        return None
    major, minor, stepping = (int(part) for part in match.groups())
    if minor > 15 or stepping > 15:
        return None
    gfx = f"gfx{major}{minor:x}{stepping:x}"
    return gfx if GFX_TARGET.fullmatch(gfx) else None


@dataclass(frozen=True)
class AmdGpu:
    """An AMD product name's gfx target, from ``amd_gpus.csv``."""

    gfx: str
    verified: bool
    source: str


@dataclass(frozen=True)
class _AmdRow:
    pattern: re.Pattern[str]
    gfx: str
    verified: bool
    source: str


_AMD_NAME_NOISE = re.compile(r"\b(?:amd|ati|tm|r|\d+ ?gb)\b")


def normalise_amd_name(name: str) -> str:
    """``"AMD Radeon(TM) RX 7900 XTX 24GB"`` -> ``"radeon rx 7900 xtx"``."""
    words = re.sub(r"[^a-z0-9]+", " ", name.lower())
    return re.sub(r" +", " ", _AMD_NAME_NOISE.sub(" ", words)).strip()


@cache
def _amd_patterns() -> tuple[_AmdRow, ...]:
    return tuple(
        _AmdRow(
            re.compile(rf"\b(?:{r['pattern']})\b"),
            r["gfx"].strip().lower(),
            r["status"] == VERIFIED,
            r["source"],
        )
        for r in _read("amd_gpus.csv")
    )


def amd_gpu_lookup(name: str | None) -> AmdGpu | None:
    """The gfx target of an AMD product name (longest matching pattern wins), or None."""
    text = normalise_amd_name(name or "")
    if not text:
        return None
    best, best_length = None, 0
    for row in _amd_patterns():
        for match in row.pattern.finditer(text):
            if match.end() - match.start() > best_length:
                best, best_length = row, match.end() - match.start()
    return AmdGpu(best.gfx, best.verified, best.source) if best else None


def amd_gfx(name: str | None) -> str | None:
    """The gfx target of an AMD product name (see :func:`amd_gpu_lookup`)."""
    found = amd_gpu_lookup(name)
    return found.gfx if found else None
