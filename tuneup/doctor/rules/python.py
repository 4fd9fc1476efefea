"""Python rule: does the torch release publish wheels for this Python."""

from __future__ import annotations

from tuneup.doctor import knowledge as kb
from tuneup.doctor.findings import ERROR, WARNING
from tuneup.doctor.rules.context import Context
from tuneup.machine import versions

AREA = "python"


def check(ctx: Context) -> None:
    python = ctx.python
    build = ctx.build
    if python is None:
        ctx.skip(AREA, "Python version (not in the report)")
        return
    implementation = ctx.snap.platform.python_implementation
    if implementation not in (None, "CPython"):
        ctx.add(
            "TU703",
            ERROR,
            f"the interpreter is {implementation} (Python {python}); PyTorch publishes wheels for "
            "CPython only, so pip finds no torch to install (or an old placeholder).",
            f"create the environment with CPython, e.g. uv venv --python {_cpython_for(python)} "
            "(or conda create -n torch python=3.12), then install torch there",
        )
        return
    if ctx.snap.platform.python_bits == 32:
        ctx.add("TU705", ERROR,
                f"the interpreter is a 32-bit Python {python}: PyTorch has never published "
                "32-bit wheels, so pip finds no torch (or only the old 0.1.2 placeholder).",
                "install 64-bit Python (python.org's Windows installer (64-bit), or "
                f"uv venv --python {_cpython_for(python)}), then create the environment again")
        return
    py = versions.major_minor(python)
    if build.release is None:
        if build.version is None:
            _any_release(ctx, python)
        else:
            ctx.skip(AREA, f"Python {python} against {build.label} (release not in the tables)")
        return
    release = build.release
    if kb.python_supported(release, python, ctx.os_family):
        ctx.settled.add("python-unsupported")
        ctx.ok(
            AREA,
            f"Python {python} is supported by torch {release.release} "
            f"({release.python_min}-{release.python_max})",
        )
        return
    installed = not build.requested and ctx.snap.torch.installed
    top = release.python_max_on(ctx.os_family)
    newer = py > versions.major_minor(top)
    where = f" on {ctx.os_family}" if top != release.python_max else ""
    message = (
        f"{build.label} has wheels for Python {release.python_min}-{top}{where} only, "
        f"not Python {python}"
        + (" (pip finds no matching distribution)." if not installed else ".")
    )
    severity = ERROR if release.verified and not installed else WARNING
    ctx.add("TU701", severity, message, _fix(release, python, newer, ctx.os_family))


def _fix(release: kb.Release, python: str, newer: bool, os_family: str | None) -> str:
    fitting = [r for r in kb.releases() if kb.python_supported(r, python, os_family)]
    python = versions.major_minor_text(python)  # "3.10", not "3.10.1"
    bound = release.python_max_on(os_family) if newer else release.python_min
    step = f"use Python {bound} with torch {release.release}"
    if newer:
        later = [r for r in fitting if versions.major_minor(r.release) > versions.major_minor(release.release)]
        if later:
            return f"{step}, or pip install torch=={later[0].latest} (first release with Python {python} wheels)"
    else:
        earlier = [
            r for r in fitting if versions.major_minor(r.release) < versions.major_minor(release.release)
        ]
        if earlier:
            return f"{step}, or pip install torch=={earlier[-1].latest} (last release with Python {python} wheels)"
    return step


def _cpython_for(python: str) -> str:
    """The CPython minor to suggest: the same language level when torch has wheels for it."""
    fitting = [r for r in kb.releases() if kb.python_supported(r, python)]
    return versions.major_minor_text(python) if fitting else kb.releases()[-1].python_max


def _any_release(ctx: Context, python: str) -> None:
    fitting = [r for r in kb.releases() if kb.python_supported(r, python, ctx.os_family)]
    if fitting:
        ctx.ok(
            AREA, f"Python {python} has torch wheels ({fitting[0].release}-{fitting[-1].release})"
        )
        _predates_wheels(ctx, python, fitting)
        return
    newest = kb.releases()[-1]
    ctx.add(
        "TU702",
        WARNING,
        f"no PyTorch release in tuneup's tables publishes wheels for Python {python} "
        f"(newest: torch {newest.release} for {newest.python_min}-{newest.python_max}).",
        f"use Python {newest.python_max} (e.g. uv venv --python {newest.python_max}) or a nightly build",
    )


def _predates_wheels(ctx: Context, python: str, fitting: list[kb.Release]) -> None:
    """TU706: torch is missing and the interpreter's banner dates it before the first torch
    release with wheels for its Python on this OS. Then, when it was set up, no torch installed
    on it, and a torch older than that first release (what projects of its time pin) still does
    not; a warning, since a later install of a newer torch would work."""
    torch = ctx.snap.torch
    if torch.importable is not False and torch.installed is not False:
        return
    built = ctx.snap.platform.python_built
    if built is None or python != ctx.snap.platform.python_version:
        return  # no date, or a requested Python the date is not of
    first = fitting[0]
    dated = kb.release_date(first.release)
    if dated is None or built >= dated[0]:
        return
    earlier = [r for r in kb.releases()
               if versions.major_minor(r.release) < versions.major_minor(first.release)]
    mm = versions.major_minor_text(python)
    where = f" on {ctx.os_family}" if ctx.os_family else ""
    older = earlier[-1].python_max_on(ctx.os_family) if earlier else None
    ctx.add(
        "TU706",
        WARNING,
        f"torch is not importable, and this Python {python} was built on {built}, before "
        f"torch {first.release} ({dated[0]}{'' if dated[1] else ', an UNVERIFIED date'}), the "
        f"first release with Python {mm} wheels{where}: "
        f"no torch older than {first.release} installs on it (pip: 'from versions: none', or only "
        "newer versions than a project pins). If the install failed, that is the likely cause.",
        f"pip install 'torch>={first.release}' (torch {first.release}-{fitting[-1].release} have "
        f"Python {mm} wheels{where})"
        + (f", or for a project pinning an older torch create the environment with Python "
           f"{older} (uv venv --python {older})" if older else ""),
    )
