"""``tuneup doctor``: read the machine (or a report), run the rules, print the diagnosis.

Exit status: 0 no error finding, 1 at least one error finding, 2 bad usage or unreadable input.
Everything heavy is imported inside the command so ``--from`` never imports torch.
"""

from __future__ import annotations

import re
import sys

import click

from tuneup.errors import EXIT_FAILED, EXIT_OK

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
def doctor(
    source: str | None, output_format: str, torch_version: str | None, python_version: str | None
) -> None:
    """Check driver, CUDA, cuDNN, NCCL, the PyTorch build and the GPU against each other.

    \b
    tuneup doctor                      this machine
    tuneup doctor --from report.txt    a collect_env report (or tuneup JSON)
    pbpaste | tuneup doctor --from -   a report from standard input
    tuneup doctor --from r.txt --torch 2.7.1   would torch 2.7.1 fit that machine?
    """
    snapshot = _read(source)
    from tuneup.doctor.rules import diagnose

    diagnosis = diagnose(snapshot, requested_torch=torch_version, requested_python=python_version)
    if output_format == "json":
        from tuneup.doctor.report import write_json

        write_json(snapshot, diagnosis, sys.stdout)
    else:
        from tuneup.doctor.report import write_text

        write_text(snapshot, diagnosis)
    click.get_current_context().exit(EXIT_FAILED if diagnosis.errors else EXIT_OK)


def _read(source: str | None):  # -> Snapshot
    """The live machine, or the report at ``source`` (a ReportError, exit 2, when unreadable)."""
    if source is None:
        from tuneup.machine.probe import snapshot

        return snapshot()
    from tuneup.doctor.readers import read_path

    return read_path(source)
