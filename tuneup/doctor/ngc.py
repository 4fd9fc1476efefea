"""NVIDIA's NGC PyTorch containers: a torch version ending in ``.nvYY.MM``
(``2.7.0a0+ecf3bae40a.nv25.02``) names the container it was built for, and that container's
release notes list the CUDA, cuDNN and NCCL it ships, none of which the version string says.
Read from ``data/ngc_pytorch.csv`` (one source per row), as :mod:`tuneup.doctor.knowledge`
reads the wheel tables. Only the NCCL is used (TU411): JetPack wheels carry the same tag but are
built with the Jetson's CUDA, so the tag alone does not give a build's CUDA."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from tuneup.doctor.knowledge import VERIFIED, read_table

# ".nv25.02" as NGC prints it, ".nv25.2" as pip normalises it; JetPack wheels use the same tag.
_TAG = re.compile(r"\.nv(\d{2})\.(\d{1,2})$", re.IGNORECASE)


@dataclass(frozen=True)
class Container:
    """One NGC PyTorch container release (``25.02``) and the libraries it ships."""

    tag: str  # "25.02"
    torch: str  # "2.7.0a0+ecf3bae40a"
    cuda: str | None  # "12.8.0"
    cudnn: str | None
    nccl: str | None
    verified: bool
    source: str


def container_tag(version: str | None) -> str | None:
    """``"2.7.0a0+ecf3bae40a.nv25.02"`` or ``"….nv25.2"`` -> ``"25.02"``; None for other builds."""
    match = _TAG.search((version or "").strip())
    return f"{match.group(1)}.{int(match.group(2)):02d}" if match else None


@cache
def containers() -> tuple[Container, ...]:
    """Every row of ``data/ngc_pytorch.csv``, read once."""
    return tuple(
        Container(r["container"], r["torch"], r["cuda"] or None, r["cudnn"] or None,
                  r["nccl"] or None, r["status"] == VERIFIED, r["source"])
        for r in read_table("ngc_pytorch.csv")
    )


def container(version: str | None) -> Container | None:
    """The table row of the NGC container a torch version was built for, or None."""
    tag = container_tag(version)
    return next((row for row in containers() if row.tag == tag), None) if tag else None
