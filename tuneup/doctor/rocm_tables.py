"""AMD GPUs and the ROCm wheels of PyTorch: which gfx target a card is, which targets each
wheel line ships. Read from ``data/amd_gpus.csv`` and ``data/rocm_targets.csv`` (one source
per row), as :mod:`tuneup.doctor.knowledge` reads the NVIDIA tables."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from tuneup.doctor.knowledge import VERIFIED, read_table, split_cell
from tuneup.machine import versions

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
    for r in read_table("rocm_targets.csv"):
        targets = tuple(t.lower() for t in split_cell(r["targets"]))
        rows.append(
            RocmTargets(
                r["variant"].strip().lower(),
                split_cell(r["torch"]),
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
    return merged(rows)


def of_rocm(rocm: str) -> RocmTargets | None:
    """Every wheel line of ROCm ``rocm`` (``"6.2"`` covers rocm6.2 and rocm6.2.4) merged, for
    a build that states its HIP version but not its torch release."""
    wanted = versions.major_minor(rocm)
    rows = [row for row in _rocm_rows() if versions.major_minor(row.rocm) == wanted]
    return merged(rows) if rows else None


def merged(rows: list[RocmTargets]) -> RocmTargets:
    """One line from several: ``targets`` what all ship, ``possible`` what any ships; never
    verified (which wheel it is, is not known)."""
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
    """``"AMD Radeon(TM) RX 7900 XTX 24GB"`` -> ``"radeon rx 7900 xtx"``; ``"Radeon 5700XT"``
    -> ``"radeon rx 5700 xt"`` (people drop the RX and the space)."""
    words = re.sub(r"[^a-z0-9]+", " ", name.lower())
    words = re.sub(r"(\d)(xtx|xt|gre)\b", r"\1 \2", words)  # "5700xt"
    words = re.sub(r"\bradeon (\d{4} (?:xtx|xt|gre))\b", r"radeon rx \1", words)  # "Radeon 5700 XT"
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
        for r in read_table("amd_gpus.csv")
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
