"""Pick a published torch wheel that fits this machine, for the ``fix`` of a finding."""

from __future__ import annotations

from tuneup.doctor import knowledge as kb
from tuneup.doctor.rules.context import Context
from tuneup.machine import versions


def _search_order(start: kb.Release | None, same_release_only: bool) -> list[kb.Release]:
    """``start`` first, then the newest release whose table row is verified, then the rest."""
    if start is not None and same_release_only:
        return [start]
    newest = list(kb.releases())[::-1]
    others = [r for r in newest if r.verified] + [r for r in newest if not r.verified]
    return ([start] if start else []) + [release for release in others if release is not start]


def find_wheel(
    ctx: Context,
    cc: str | None = None,
    start: kb.Release | None = None,
    same_release_only: bool = False,
    every_gpu: bool = True,
) -> tuple[kb.Release, str] | None:
    """(release, variant): ``start`` (the user's pinned release) when one of its wheels fits,
    else the newest release whose wheel covers ``cc`` and every other GPU of the machine, runs
    on the driver and exists for the machine's Python; None when no table row fits. Variants
    PyTorch's release matrix calls experimental (cu132 of 2.12-2.14) only when no stable one
    fits any release."""
    platform = "windows" if ctx.os_family == "windows" else "linux"
    others = {gpu.cc for gpu in ctx.nvidia_gpus if gpu.cc} if every_gpu else set()
    ccs = {cc} | others if cc is not None else set()
    for stable in (True, False):
        for release in _search_order(start, same_release_only):
            if ctx.python and not kb.python_supported(release, ctx.python, ctx.os_family):
                continue
            names = [v for v in release.variants if (v in release.experimental) != stable]
            for name in sorted(names, key=_cuda_of, reverse=True):
                if ctx.driver_runs(versions.cuda_from_tag(name) or "") is False:
                    continue
                if ccs:
                    row = kb.variant(release.release, name, platform)
                    if row is None or not all(kb.arch_covers(row.arches, row.ptx, c) for c in ccs):
                        continue
                return release, name
    return None


def _cuda_of(variant: str) -> tuple[int, int]:
    return versions.major_minor(versions.cuda_from_tag(variant)) or (0, 0)


def install_fix(ctx: Context, release: kb.Release, variant: str) -> str:
    """The pip command for ``variant`` of ``release``, keeping the user's exact version when
    the release is the one installed."""
    build = ctx.build
    same = build.release is not None and build.release.release == release.release
    version = build.base_version if same and build.base_version else release.latest
    text = kb.install_fix_text(version, variant)
    if variant in release.experimental:
        text += (f"; {variant} is experimental in PyTorch's release matrix for {release.release}: "
                 "no stable variant fits this machine")
    return text
