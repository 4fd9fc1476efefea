"""Pick a published torch wheel that fits this machine, for the ``fix`` of a finding."""

from __future__ import annotations

from tuneup.doctor import knowledge as kb
from tuneup.doctor.rules.context import Context
from tuneup.machine import versions


def _search_order(start: kb.Release | None, same_release_only: bool) -> list[kb.Release]:
    everything = list(kb.releases())
    if start is None:
        return everything[::-1]
    if same_release_only:
        return [start]
    index = everything.index(start)
    return [start] + everything[index + 1 :] + everything[:index][::-1]


def find_wheel(
    ctx: Context,
    cc: str | None = None,
    start: kb.Release | None = None,
    same_release_only: bool = False,
) -> tuple[kb.Release, str] | None:
    """(release, variant) nearest to ``start`` whose wheel covers ``cc``, runs on the driver
    and exists for the machine's Python; None when no table row fits."""
    platform = "windows" if ctx.os_family == "windows" else "linux"
    for release in _search_order(start, same_release_only):
        if ctx.python and not kb.python_supported(release, ctx.python, ctx.os_family):
            continue
        newest_first = sorted(
            release.variants, key=lambda v: versions.major_minor(versions.cuda_from_tag(v)), reverse=True
        )
        for name in newest_first:
            if ctx.driver_runs(versions.cuda_from_tag(name) or "") is False:
                continue
            if cc is not None:
                row = kb.variant(release.release, name, platform)
                if row is None or not kb.arch_covers(row.arches, row.ptx, cc):
                    continue
            return release, name
    return None


def install_fix(ctx: Context, release: kb.Release, variant: str) -> str:
    """The pip command for ``variant`` of ``release``, keeping the user's exact version when
    the release is the one installed."""
    build = ctx.build
    same = build.release is not None and build.release.release == release.release
    version = build.base_version if same and build.base_version else release.latest
    return kb.install_command(version, variant)
