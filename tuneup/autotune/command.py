"""``tuneup autotune SCRIPT [OPTIONS] [-- SCRIPT_ARGS...]``."""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import math
import os
import re
import signal
import stat
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from tuneup import __version__, terminal
from tuneup.autotune.leftovers import file_notes
from tuneup.autotune.report import Progress, print_table, to_json
from tuneup.autotune.runner import Runner
from tuneup.autotune.search import Options, Outcome, Search
from tuneup.autotune.space import GROUPS
from tuneup.errors import Interrupted, ScriptError, TuneupError, UsageError
from tuneup.files import write_new
from tuneup.settings import Measurement, Settings, default_path, save
from tuneup.settings.store import to_text

DEFAULT_BUDGET_S = 300.0
MIN_BUDGET_S = 10.0
MIN_MEMORY = 64 * 2**20  # below this a --max-memory is a typo (a missing unit), not a cap
UNITS = {"b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6,
         "mib": 2**20, "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12,
         "tib": 2**40}
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # handled like Ctrl-C


def parse_size(text: str) -> int:
    """``'8GiB'`` -> 8589934592; raises ValueError on anything else (a unit is required)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*", text)
    if not match or match.group(2).lower() not in UNITS:
        raise ValueError(text)
    return int(float(match.group(1)) * UNITS[match.group(2).lower()])


def parse_groups(only: str | None, skip: str | None) -> frozenset[str]:
    if only and skip:
        raise UsageError("use either --only or --skip, not both")
    chosen = set(GROUPS)
    for option, text in (("--only", only), ("--skip", skip)):
        if text is None:
            continue
        names = {n.strip() for n in text.split(",") if n.strip()}
        unknown = sorted(names - set(GROUPS))
        if unknown or not names:
            raise UsageError(f"{option} takes a comma list of {','.join(GROUPS)}"
                             + (f"; unknown: {','.join(unknown)}" if unknown else ""))
        chosen = names if option == "--only" else chosen - names
    return frozenset(chosen)


def parse_memory(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        size = parse_size(text)
    except ValueError:
        raise UsageError(f"--max-memory takes a size with its unit, such as 8GiB or 512MiB "
                         f"(got {text!r})") from None
    if size < MIN_MEMORY:
        raise UsageError(f"--max-memory {text} is below {MIN_MEMORY // 2**20} MiB, too little to "
                         "train in; did you mean GiB?")
    return size


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
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
@click.option("--nproc-per-node", type=int, default=1, show_default=True, metavar="N",
              help="Run every trial under torchrun with this many local ranks (a DDP script); "
                   "speed is the job's, at the slowest rank's pace. See docs/distributed.md.")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text",
              show_default=True)
def autotune(script: Path, script_args: tuple[str, ...], budget: float, output: Path | None,
             expected_steps: int, only: str | None, skip: str | None, max_memory: str | None,
             nproc_per_node: int, output_format: str) -> None:
    """Probe SCRIPT (which uses tuned_loader / tuned_loop, or tuned_trainer /
    tuned_trainer_kwargs on a Trainer) and write its fastest settings.

    \b
    tuneup autotune train.py --budget 300 -- --batch-size 256
    tuneup autotune --nproc-per-node 4 train_ddp.py -- --epochs 1
    tuneup autotune train_hf.py -- --epochs 1   (a trial a process)
    Arguments after -- go to the script. See docs/autotune.md and
    docs/integrations.md.
    """
    if not script.is_file():
        raise UsageError(f"no such script: {script}")
    if not math.isfinite(budget) or budget < MIN_BUDGET_S:
        raise UsageError(f"--budget must be at least {MIN_BUDGET_S:.0f} seconds (got {budget:g})")
    if expected_steps < 1:
        raise UsageError(f"--expected-steps must be a positive number of steps "
                         f"(got {expected_steps})")
    if nproc_per_node < 1:
        raise UsageError(f"--nproc-per-node must be at least 1 (got {nproc_per_node})")
    options = Options(groups=parse_groups(only, skip), expected_steps=expected_steps,
                      max_memory_bytes=parse_memory(max_memory))
    output = output or default_path(script)
    if not writable_dir(output.parent):
        raise UsageError(f"cannot write settings into {output.parent} (choose another --output)")
    try:
        with output_lock(output, script), stop_signals_interrupt():
            result = tune(script, list(script_args), options, budget, output, output_format,
                          nproc_per_node)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; {output} left as it was", signal.SIGINT) from None
    except Interrupted as exc:
        raise Interrupted(f"{exc}; {output} left as it was", exc.exit_code - 128) from None
    except ScriptError as exc:  # scripts reading --format json get the reason there too
        if output_format == "json":
            click.echo(json.dumps({"script": str(script), "settings": None, "error": str(exc)},
                                  indent=2))
        raise
    if output_format == "json":
        click.echo(json.dumps(result, indent=2))
    if result.get("error"):
        raise TuneupError(result["error"])


@contextlib.contextmanager
def output_lock(output: Path, script: Path) -> Iterator[None]:
    """Hold ``<output>.lock`` while tuning, so that a second autotune writing the same
    settings file refuses with one line naming the first, instead of both saying "settings
    written" and the last silently winning. The lock is ``flock``, so one a killed run left
    behind is free again; the file is opened without following a link (``O_NOFOLLOW``) and
    removed, still held, at the end (a run that opened it meanwhile sees it gone and opens
    the new one)."""
    path = Path(os.path.realpath(output.parent)) / f"{output.name}.lock"
    fd = _take_lock(path, output, script)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)


def _take_lock(path: Path, output: Path, script: Path, tries: int = 5) -> int:
    """The open, locked lock file, holding this run's description for a second run to name;
    a :class:`TuneupError` naming the holder when another run has it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(tries):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                         | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            why = "a symbolic link" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
            raise TuneupError(f"cannot lock {path} ({why}): remove it or choose another "
                              "--output") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise TuneupError(f"cannot lock {path} (not a regular file): remove it or choose "
                              "another --output")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            text = os.pread(fd, 300, 0).decode("utf-8", "replace")
            holder = "".join(c for c in text if c.isprintable()).strip() or "unknown"
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise TuneupError(f"cannot lock {path} ({exc.strerror}): choose another "
                                  "--output") from None
            raise TuneupError(f"another tuneup autotune ({holder}) is writing {output}: wait "
                              "for it to finish, or choose another --output") from None
        if _still_at(fd, path):
            started = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}, {script}, started {started}".encode(), 0)
            return fd
        os.close(fd)  # its holder removed it as this run opened it: take the new one
    raise TuneupError(f"cannot lock {path}: it keeps being replaced; choose another --output")


def _still_at(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (not removed or replaced)."""
    try:
        now = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    held = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


@contextlib.contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """SIGTERM (a scheduler's time limit) and SIGHUP (a dropped ssh session) stop the search
    the way Ctrl-C does: the runner's clean-up kills the child's tree and removes its files."""
    def stop(signum: int, frame: Any) -> None:
        raise Interrupted(f"stopped by {signal.Signals(signum).name}", signum)

    previous = {signum: signal.signal(signum, stop) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def writable_dir(folder: Path) -> bool:
    """True when ``folder`` (or the nearest existing parent that would hold it) is writable."""
    folder = folder.resolve()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder.is_dir() and os.access(folder, os.W_OK)


def tune(script: Path, script_args: list[str], options: Options, budget: float, output: Path,
         output_format: str, nproc_per_node: int = 1) -> dict[str, Any]:
    """Run the search, write the settings, show the result; returns the JSON summary (with an
    ``error`` when the settings could not be written: the result is never lost)."""
    busy = busy_note()
    started = time.monotonic()
    err = Console(stderr=True)
    with Runner(script, script_args, deadline=started + budget,
                max_memory_bytes=options.max_memory_bytes,
                nproc_per_node=nproc_per_node) as runner:
        quiet = output_format == "json" and not err.is_terminal
        progress = Progress(err, runner.time_left, quiet=quiet)
        search = Search(runner, options, on_best=progress.best, on_stage=progress.stage)
        runner.timeout = search.budget.timeout
        runner.on_trial_start = progress.trial_started
        runner.on_trial_end = progress.trial_finished
        with progress:
            outcome = search.run()
    elapsed = time.monotonic() - started
    if busy:
        outcome.notes.append(busy)
    if runner.unguarded:
        outcome.notes.append(f"the write guard was not armed in {runner.unguarded} trial "
                             "process(es) (their Python did not load tuneup's sitecustomize): "
                             "files the script wrote during those trials were not put back")
    outcome.notes.extend(file_notes(  # read after the with: the runner ended its last process
        runner.put_back, runner.not_put_back, runner.folder_snapshot, runner.recovered))
    if nproc_per_node > 1:
        outcome.notes.append(
            f"tuned under torchrun with {nproc_per_node} local ranks: samples/s are the job's "
            "at the slowest rank's pace; worker and thread counts are per rank, from its share "
            f"of the cores; run with the same --nproc-per-node")
    written, error = write_settings(settings_for(outcome, script, nproc_per_node), output)
    if output_format == "text":
        print_table(terminal.console(), outcome, written, elapsed)
    result = to_json(outcome, script, written, elapsed, budget)
    if error:
        result["error"] = error
    return result


def write_settings(settings: Settings, output: Path) -> tuple[Path | None, str | None]:
    """Save to ``output``; when that fails (full disk, read-only, another user's link), keep
    a copy under a fresh name in the temp directory and say where. Returns (where it was
    written, the error or None)."""
    try:
        save(settings, output)
        return output, None
    except OSError as exc:
        problem = f"cannot write {output} ({exc.strerror or exc})"
    try:
        copy = write_new(Path(tempfile.gettempdir()), f"{output.name}.", to_text(settings))
    except OSError:
        return None, f"{problem}; the chosen knobs are printed above, copy them by hand"
    return copy, f"{problem}; a copy is in {copy}: copy it to {output} once that can be written"


def busy_note(threshold: float = 25.0) -> str | None:
    """A warning when other processes keep the CPUs busy: timings will be noisy."""
    import psutil

    used = psutil.cpu_percent(interval=0.5)
    if used < threshold:
        return None
    return (f"the machine was busy before tuning ({used:.0f}% CPU in use by other processes): "
            "timings are noisy; tune again when it is idle")


def settings_for(outcome: Outcome, script: Path, nproc_per_node: int = 1) -> Settings:
    """The settings file's content: chosen knobs, what was measured, this machine."""
    from tuneup.settings import fingerprint

    return Settings(
        knobs=outcome.file_knobs,
        measured=Measurement(
            baseline_samples_per_s=round(outcome.baseline_samples_per_s, 2),
            # no tuned figure (so no speed-up) for the baseline kept: nothing was tuned
            tuned_samples_per_s=(None if outcome.kept_baseline
                                 else round(outcome.tuned_samples_per_s, 2)),
            effective_batch_size=outcome.facts.effective_batch,
            device=outcome.facts.device,
            confirmed=outcome.confirmed,
            local_ranks=nproc_per_node if nproc_per_node > 1 else None,
            **data_wait_at_tuning(outcome),
        ),
        fingerprint=fingerprint.current(),
        script=str(script.resolve()),
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        tuneup_version=__version__,
    )


def data_wait_at_tuning(outcome: Outcome) -> dict[str, float | None]:
    """The pick's data-wait share over its trials, and their spread: a tuned run that waits
    no longer than this is not told its settings stopped fitting (the demo waited 20 %, as
    tuned, and was told to re-tune)."""
    shares = [r.data_wait_share for r in outcome.results
              if r.ok and r.trial.knobs == outcome.knobs and r.data_wait_share is not None]
    if not shares:
        return {"data_wait_share": None, "data_wait_noise": None}
    noise = statistics.stdev(shares) if len(shares) > 1 else None
    return {"data_wait_share": round(statistics.fmean(shares), 4),
            "data_wait_noise": round(noise, 4) if noise is not None else None}
