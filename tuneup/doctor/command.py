"""``tuneup doctor``: read the machine (or a report), run the rules, print the diagnosis.

Exit status: 0 no error finding, 1 at least one error finding, 2 bad usage or unreadable input.
Everything heavy is imported inside the command so ``--from`` never imports torch.
"""

from __future__ import annotations

import re
import sys

import click

from tuneup.errors import EXIT_FAILED, EXIT_OK, UsageError

VERSION_PATTERN = re.compile(r"\d+\.\d+(\.\d+)?([.+\w]*)")


def _version_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not VERSION_PATTERN.fullmatch(value.strip()):
        raise click.BadParameter(f"{value!r} is not a version like 2.7.1 or 3.12", ctx, param)
    return value.strip() if value else None


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--from",
    "source",
    metavar="FILE",
    help="Diagnose a `python -m torch.utils.collect_env` report or tuneup JSON ('-' = stdin) "
    "instead of this machine.",
)
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Terminal report or one JSON object.",
)
@click.option(
    "--torch",
    "torch_version",
    metavar="VERSION",
    callback=_version_option,
    help="Judge this torch release (e.g. one you plan to install, 1.10.1 or 2.7.1+cu128) "
    "instead of the installed one.",
)
@click.option(
    "--python",
    "python_version",
    metavar="VERSION",
    callback=_version_option,
    help="Judge this Python version instead of the one in the report / environment.",
)
@click.option(
    "--distributed",
    is_flag=True,
    help="Also start local ranks (NCCL on GPUs, else gloo), time all_reduce and all_gather "
    "from 1 KiB to 64 MiB and check what slows or hangs them.",
)
@click.option(
    "--nproc",
    type=click.IntRange(min=2),
    metavar="N",
    help="Ranks for --distributed (default: one per GPU, or 2 on the CPU).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="For --distributed: how long the ranks may take to rendezvous, and then to finish.",
)
def doctor(
    source: str | None,
    output_format: str,
    torch_version: str | None,
    python_version: str | None,
    distributed: bool,
    nproc: int | None,
    timeout: float,
) -> None:
    """Check driver, CUDA, cuDNN, NCCL, the PyTorch build and the GPU against each other.

    \b
    tuneup doctor                      this machine
    tuneup doctor --from report.txt    a collect_env report (or tuneup JSON)
    pbpaste | tuneup doctor --from -   a report from standard input
    tuneup doctor --from r.txt --torch 2.7.1   would torch 2.7.1 fit that machine?
    tuneup doctor --distributed --nproc 4      collective bandwidth between 4 local ranks
    """
    if distributed and source is not None:
        raise UsageError("--distributed measures this machine; it cannot be used with --from")
    if not distributed:
        _refuse_without_distributed(click.get_current_context(), ("nproc", "timeout"))
    snapshot = _read(source)
    from tuneup.doctor.rules import diagnose

    diagnosis = diagnose(snapshot, requested_torch=torch_version, requested_python=python_version)
    measured = None
    if distributed:
        from tuneup.doctor import distributed as collectives

        measured = collectives.check(snapshot, diagnosis, nproc, timeout)
    if output_format == "json":
        from tuneup.doctor.report import write_json

        if measured is None:
            write_json(snapshot, diagnosis, sys.stdout)
        else:
            collectives.write_json(snapshot, diagnosis, measured, sys.stdout)
    else:
        from tuneup.doctor.report import write_text

        write_text(snapshot, diagnosis)
        if measured is not None:
            collectives.write_table(measured)
    click.get_current_context().exit(EXIT_FAILED if diagnosis.errors else EXIT_OK)


def _refuse_without_distributed(ctx: click.Context, names: tuple[str, ...]) -> None:
    for name in names:
        if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT:
            raise UsageError(f"--{name} is an option of --distributed")


def _read(source: str | None):  # -> Snapshot
    """The live machine, or the report at ``source`` (a ReportError, exit 2, when unreadable)."""
    if source is None:
        from tuneup.machine.probe import snapshot

        return snapshot()
    from tuneup.doctor.readers import read_path

    return read_path(source)
