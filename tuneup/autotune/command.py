"""``tuneup autotune SCRIPT [OPTIONS] [-- SCRIPT_ARGS...]``."""

from __future__ import annotations

import datetime
import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console

from tuneup import __version__
from tuneup.autotune.report import Progress, print_table, to_json
from tuneup.autotune.runner import Runner, ScriptError
from tuneup.autotune.search import Options, Outcome, Search, SearchError
from tuneup.autotune.space import GROUPS
from tuneup.settings import Measurement, Settings, default_path, save

DEFAULT_BUDGET_S = 300.0
MIN_BUDGET_S = 10.0
UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6,
         "mib": 2**20, "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12,
         "tib": 2**40}


class OneLineErrors(click.Command):
    """Usage errors as one line on stderr (exit 2), without the usage block."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            message = exc.format_message()
            if "No such option" in message:
                message += " (pass the script's own arguments after --)"
            fail(ctx, message)


def fail(ctx: click.Context, message: str) -> NoReturn:
    click.echo(f"tuneup autotune: {message}", err=True)
    ctx.exit(2)
    raise AssertionError("unreachable")


def parse_size(text: str) -> int:
    """``'8GiB'`` -> 8589934592; raises ValueError on anything else."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in UNITS:
        raise ValueError(text)
    size = int(float(match.group(1)) * UNITS[match.group(2).lower()])
    if size <= 0:
        raise ValueError(text)
    return size


def parse_groups(ctx: click.Context, only: str | None, skip: str | None) -> frozenset[str]:
    if only and skip:
        fail(ctx, "use either --only or --skip, not both")
    chosen = set(GROUPS)
    for option, text in (("--only", only), ("--skip", skip)):
        if text is None:
            continue
        names = {n.strip() for n in text.split(",") if n.strip()}
        unknown = sorted(names - set(GROUPS))
        if unknown or not names:
            fail(ctx, f"{option} takes a comma list of {','.join(GROUPS)}"
                      + (f"; unknown: {','.join(unknown)}" if unknown else ""))
        chosen = names if option == "--only" else chosen - names
    return frozenset(chosen)


@click.command(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("script", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--budget", type=float, default=DEFAULT_BUDGET_S, show_default=True,
              help="Wall-time budget for the whole search, in seconds.")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Settings file to write (default: SCRIPT's stem + .tuneup.json beside it).")
@click.option("--expected-steps", type=int, default=5000, show_default=True,
              help="Optimizer steps of the real run; compile must repay its compile time.")
@click.option("--only", help=f"Tune only these groups: {','.join(GROUPS)}.")
@click.option("--skip", help="Tune all groups but these.")
@click.option("--max-memory", help="Memory cap for the trials, e.g. 8GiB (host RSS; GPU peak).")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text",
              show_default=True)
@click.pass_context
def autotune(ctx: click.Context, script: Path, script_args: tuple[str, ...], budget: float,
             output: Path | None, expected_steps: int, only: str | None, skip: str | None,
             max_memory: str | None, output_format: str) -> None:
    """Probe SCRIPT (which uses tuned_loader / tuned_loop) and write its fastest settings.

    \b
    tuneup autotune train.py --budget 300 -- --batch-size 256
    Arguments after -- go to the script. See docs/autotune.md.
    """
    if not script.is_file():
        fail(ctx, f"no such script: {script}")
    if not math.isfinite(budget) or budget < MIN_BUDGET_S:
        fail(ctx, f"--budget must be at least {MIN_BUDGET_S:.0f} seconds (got {budget:g})")
    if expected_steps < 1:
        fail(ctx, f"--expected-steps must be a positive number of steps (got {expected_steps})")
    memory = None
    if max_memory is not None:
        try:
            memory = parse_size(max_memory)
        except ValueError:
            fail(ctx, f"--max-memory takes a size such as 8GiB or 512MiB (got {max_memory!r})")
    options = Options(groups=parse_groups(ctx, only, skip), expected_steps=expected_steps,
                      max_memory_bytes=memory)
    output = output or default_path(script)
    if not writable_dir(output.parent):
        fail(ctx, f"cannot write settings into {output.parent} (choose another --output)")
    try:
        result = tune(script, list(script_args), options, budget, output, output_format)
    except KeyboardInterrupt:
        click.echo(f"tuneup autotune: interrupted; {output} left as it was", err=True)
        ctx.exit(130)
    except (ScriptError, SearchError) as exc:
        click.echo(f"tuneup autotune: {exc}", err=True)
        ctx.exit(1)
    except OSError as exc:
        click.echo(f"tuneup autotune: cannot write {output}: {exc.strerror or exc}", err=True)
        ctx.exit(1)
    if output_format == "json":
        click.echo(json.dumps(result, indent=2))


def writable_dir(folder: Path) -> bool:
    """True when ``folder`` (or the nearest existing parent that would hold it) is writable."""
    folder = folder.resolve()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder.is_dir() and os.access(folder, os.W_OK)


def tune(script: Path, script_args: list[str], options: Options, budget: float, output: Path,
         output_format: str) -> dict[str, Any]:
    """Run the search, write the settings, show the result; returns the JSON summary."""
    busy = busy_note()
    started = time.monotonic()
    err = Console(stderr=True)
    with Runner(script, script_args, deadline=started + budget,
                max_memory_bytes=options.max_memory_bytes) as runner:
        quiet = output_format == "json" and not err.is_terminal
        progress = Progress(err, runner.time_left, quiet=quiet)
        search = Search(runner, options, on_best=progress.best, on_stage=progress.stage)
        runner.timeout = search.timeout
        runner.on_trial_start = progress.trial_started
        runner.on_trial_end = progress.trial_finished
        with progress:
            outcome = search.run()
    elapsed = time.monotonic() - started
    if busy:
        outcome.notes.append(busy)
    save(settings_for(outcome, script), output)
    if output_format == "text":
        print_table(Console(), outcome, output, elapsed)
    return to_json(outcome, script, output, elapsed, budget)


def busy_note(threshold: float = 25.0) -> str | None:
    """A warning when other processes keep the CPUs busy: timings will be noisy."""
    import psutil

    used = psutil.cpu_percent(interval=0.5)
    if used < threshold:
        return None
    return (f"the machine was busy before tuning ({used:.0f}% CPU in use by other processes): "
            "timings are noisy; tune again when it is idle")


def settings_for(outcome: Outcome, script: Path) -> Settings:
    """The settings file's content: chosen knobs, what was measured, this machine."""
    from tuneup.settings import fingerprint

    return Settings(
        knobs=outcome.knobs,
        measured=Measurement(
            baseline_samples_per_s=round(outcome.baseline_samples_per_s, 2),
            tuned_samples_per_s=round(outcome.tuned_samples_per_s, 2),
            effective_batch_size=outcome.hardware.effective_batch,
            device=outcome.hardware.device,
        ),
        fingerprint=fingerprint.current(),
        script=str(script.resolve()),
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        tuneup_version=__version__,
    )
