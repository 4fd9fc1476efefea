"""``tuneup watch status`` and ``tuneup watch stop``: talking to the daemon through its state
directory (the daemon reads no commands: status is its status file, stop a SIGTERM)."""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import psutil
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tuneup import terminal
from tuneup.errors import TuneupError
from tuneup.machine.snapshot import printable
from tuneup.watch.state import StateDir

STOP_TIMEOUT_S = 30.0
STATE_DIR_HELP = "The daemon's state directory [default: $XDG_STATE_HOME/tuneup/watch]."
SETTINGS = {"help_option_names": ["-h", "--help"]}
PIPED_WIDTH = 200


def _not_running(state: StateDir) -> str:
    stale = state.read_pid()
    return (f"no daemon runs with {state.path}"
            + (f" (its pid file names pid {stale}, which is gone)" if stale else "")
            + ": start one with `tuneup watch --daemon`")


@click.command(context_settings=SETTINGS)
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
              help=STATE_DIR_HELP)
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text",
              show_default=True)
def status(state_dir: Path | None, output_format: str) -> None:
    """The jobs the daemon sees, each with its verdict and since when it holds.

    Exits 1 when no daemon runs (with --format json, after printing {"running": false}),
    or when one runs but its status cannot be read (JSON: "running": true, "status": null).
    """
    state = StateDir(state_dir)
    pid = state.running_pid()
    data = state.read_status() if pid is not None else None
    if pid is not None and (data is None or data.get("pid") != pid):
        if output_format == "json":  # it runs: never say otherwise
            click.echo(json.dumps({"running": True, "pid": pid, "state_dir": str(state.path),
                                   "status": None}))
            click.get_current_context().exit(1)
        raise TuneupError(f"the daemon (pid {pid}) runs, but its status {state.status_file} "
                          "cannot be read (missing, too large or not yet written); its log "
                          f"is {_log(state)}; `tuneup watch stop` ends it")
    if data is None:
        if output_format == "json":
            click.echo(json.dumps({"running": False, "state_dir": str(state.path)}))
            click.get_current_context().exit(1)
        raise TuneupError(_not_running(state))
    if output_format == "json":
        click.echo(json.dumps({"running": True, **data}, indent=2))
        return
    console = terminal.console(highlight=False)  # a closed pipe: exit 141, one line
    if not console.is_terminal:  # piped: whole rows for grep and scripts, not a table cut to 80
        console.width = max(console.width, PIPED_WIDTH)
    print_status(console, data)


def _when(stamp: str | None) -> str:
    """``12:03:04`` from an ISO time (with the date when not today)."""
    if not stamp:
        return "-"
    when = datetime.fromisoformat(stamp)
    today = when.date() == datetime.now().astimezone().date()
    return f"{when:%H:%M:%S}" if today else f"{when:%Y-%m-%d %H:%M}"


def _ago(stamp: str) -> str:
    """``12:03:04 (5 min ago)`` from an ISO time."""
    seconds = max(0.0, (datetime.now().astimezone()
                        - datetime.fromisoformat(stamp)).total_seconds())
    span = (f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"
            if seconds < 5400 else f"{seconds / 3600:.1f} h")
    return f"{_when(stamp)} ({span} ago)"


def _job(command: list[str]) -> str:
    """The command, short and printable: ``python train.py --lr 3`` (no paths to the
    interpreter or the script: the JSON form has them)."""
    words = [Path(word).name if index == 0 or word.endswith(".py") else word
             for index, word in enumerate(command)] or ["?"]
    text = printable(" ".join(words), one_line=True)
    return text if len(text) <= 48 else text[:47] + "…"


def print_status(console: Console, data: dict[str, Any]) -> None:
    """The daemon; one row per job (its verdict and since when), then why, job by job."""
    console.print(f"tuneup watch daemon: pid {data['pid']}, since {_ago(data['started_at'])}, "
                  f"every {data['interval_s']:g} s; state {data['state_dir']}; log {data['log']}"
                  + (f"; metrics {data['serve']}" if data.get("serve") else ""), markup=False)
    for note in data.get("notes", []):
        console.print(Text(f"note: {printable(note, one_line=True)}", style="dim"))
    jobs = data.get("jobs", [])
    if not jobs:
        console.print("no training job seen yet")
        return
    table = Table(box=None, pad_edge=False)
    for column in ("pid", "job", "found by", "seen since", "verdict", "since"):
        table.add_column(column, no_wrap=column != "job")
    for job in jobs:
        verdict = job.get("verdict")
        kind = verdict["kind"] if verdict else "sampling"
        if verdict and verdict["evidence"].get("basis"):  # a guess: say so, as the view does
            kind += f" ({verdict['evidence']['basis']})"
        if job["state"] == "ended":
            kind += f", ended {_when(job['ended_at'])}"
        table.add_row(str(job["pid"]), Text(_job(job["command"])), job["found_by"],
                      _when(job["first_seen"]), Text(kind, style="bold"),
                      _when(job.get("verdict_since")))
    console.print(table)
    if data.get("jobs_not_listed"):
        console.print(Text(f"… and {data['jobs_not_listed']} more jobs (not listed)", style="dim"))
    for job in jobs:
        if job.get("verdict"):
            console.print(Text(f"{job['pid']}: "
                               f"{printable(job['verdict']['reason'], one_line=True)}"))


@click.command(context_settings=SETTINGS)
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
              help=STATE_DIR_HELP)
@click.option("--timeout", type=float, default=STOP_TIMEOUT_S, show_default=True,
              help="Seconds to wait for the daemon to end.")
def stop(state_dir: Path | None, timeout: float) -> None:
    """Stop the daemon (SIGTERM) and wait until it has closed its log and ended."""
    state = StateDir(state_dir)
    pid = state.running_pid()
    if pid is None:
        click.echo(f"tuneup watch: {_not_running(state)}")
        return
    try:
        process = psutil.Process(pid)
        os.kill(pid, signal.SIGTERM)
        gone = _wait_gone(process, timeout)
    except (psutil.NoSuchProcess, ProcessLookupError):
        gone = True
    if not gone:
        raise TuneupError(f"the daemon (pid {pid}) did not end within {timeout:g} s; "
                          f"`kill -KILL {pid}` ends it (its lock goes with it)")
    click.echo(f"tuneup watch: stopped the daemon (pid {pid}); its log is {_log(state)}")


def _wait_gone(process: psutil.Process, timeout: float) -> bool:
    """True once ``process`` has ended (a zombie nobody reaped yet counts as ended)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def _log(state: StateDir) -> str:
    data = state.read_status()
    return str(data.get("log")) if data else str(state.log_file)

