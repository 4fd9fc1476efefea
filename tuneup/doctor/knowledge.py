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
    experimental: tuple[str, ...] = ()  # variants PyTorch's release matrix marks experimental

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


def read_table(name: str) -> list[dict[str, str]]:
    """The rows of one CSV table in :data:`DATA_DIR` by header; uncached (callers cache)."""
    with open(DATA_DIR / name, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def split_cell(cell: str) -> tuple[str, ...]:
    """A table cell holding a space-separated list (``"sm_80 sm_86"``) as its items."""
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
    return read_table("cuda_drivers.csv")


@cache
def _mvc_rows() -> dict[int, dict[str, str]]:
    return {int(row["major"]): row for row in read_table("cuda_mvc.csv")}


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
    words = re.sub(r"\b(fx|gtx|rtx|gts|gt|nvs)(\d)", r"\1 \2", words)  # "Quadro FX580"
    words = re.sub(r" +", " ", _NAME_NOISE.sub(" ", words)).strip()
    return _REGIONAL_SUFFIX.sub("", words)


def _compile_rows(table: str) -> list[_GpuRow]:
    return [
        _GpuRow(re.compile(rf"\b(?:{r['pattern']})\b"), r["cc"], r["source"], r.get("family"))
        for r in read_table(table)
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
    for r in read_table("architectures.csv"):
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


def targetable_sibling(cc: str, cuda: str) -> str | None:
    """The newest CC of the same major below ``cc`` that a CUDA ``cuda`` toolkit can target,
    whose SASS runs on ``cc`` (``8.6`` for an ``8.9`` GPU under CUDA 11.7), or None; never for
    integrated parts, which need their exact target."""
    gpu, have = cc_tuple(cc), versions.major_minor(cuda)
    rows = _arch_rows()
    if gpu is None or have is None or (rows.get(gpu) and rows[gpu].integrated):
        return None
    fitting = [key for key, row in rows.items()
               if key[0] == gpu[0] and key < gpu and not row.integrated
               and versions.major_minor(row.first_cuda) is not None
               and versions.major_minor(row.first_cuda) <= have
               and (not row.last_cuda or have <= versions.major_minor(row.last_cuda))]
    return f"{max(fitting)[0]}.{max(fitting)[1]}" if fitting else None


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
    return read_table("features.csv")


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
    for r in read_table("torch_releases.csv"):
        rows.append(
            Release(
                r["release"],
                r["latest"],
                r["python_min"],
                r["python_max"],
                r["pypi_default"],
                split_cell(r["variants"]),
                split_cell(r["rocm_variants"]),
                r["status"] == VERIFIED,
                r["source"],
                tuple(
                    tuple(pair.split(":", 1))  # type: ignore[misc]
                    for pair in split_cell(r.get("python_max_by_os") or "")
                ),
                split_cell(r.get("experimental") or ""),
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
    for r in read_table("torch_variants.csv"):
        table[(r["release"], r["variant"], r["platform"])] = Variant(
            r["release"],
            r["variant"],
            r["platform"],
            split_cell(r["arches"]),
            split_cell(r["ptx"]),
            r["cudnn"] or None,
            r["nccl"] or None,
            r["status"] == VERIFIED,
            r["source"],
        )
    return table


def oldest_cc_any_release_runs() -> CC | None:
    """The lowest compute capability any CUDA wheel in the tables has SASS for: a GPU below
    it has no kernels in any published PyTorch, whatever the build."""
    ccs = [cc for row in _variants().values() for entry in row.arches
           if (cc := cc_tuple(entry)) is not None]
    return min(ccs) if ccs else None


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
    return {r["os_family"]: r for r in read_table("pypi_platform_defaults.csv")}


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


def uv_command(version: str, variant_name: str) -> str:
    """The same wheel through uv, named explicitly: ``--torch-backend=auto`` picks the index
    from the driver alone (a cu128 wheel without Pascal kernels for a GTX 1080 Ti)."""
    mm = versions.major_minor(version) or (0, 0)
    if mm < (1, 11):
        return (f"uv pip install torch=={version}+{variant_name} "
                f"--find-links https://download.pytorch.org/whl/torch_stable.html")
    return f"uv pip install torch=={version} --torch-backend={variant_name}"


INSTALL_FIX = re.compile(r"(?P<pip>pip install torch==\S+ (?:--index-url|-f) \S+) "
                         r"\(uv: (?P<uv>uv pip install torch==\S+ \S+(?: \S+)?)\)")


def install_fix_text(version: str, variant_name: str) -> str:
    """What a finding's fix says: the pip command, then the uv one (:data:`INSTALL_FIX` reads
    both back for the JSON report)."""
    return f"{install_command(version, variant_name)} (uv: {uv_command(version, variant_name)})"


@cache
def _release_dates() -> dict[str, tuple[str, bool]]:
    """``torch_release_dates.csv`` by release, read once."""
    return {r["release"]: (r["date"], r["status"] == VERIFIED)
            for r in read_table("torch_release_dates.csv")}


def release_date(release: str) -> tuple[str, bool] | None:
    """(ISO date the ``X.Y.0`` release came out, verified) from ``torch_release_dates.csv``."""
    return _release_dates().get(release)
