"""``tuneup watch [OPTIONS] -- COMMAND...``, ``tuneup watch --pid PID``, and the daemon:
``tuneup watch --daemon``, ``tuneup watch status``, ``tuneup watch stop``."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import psutil
from rich.console import Console

from tuneup.errors import TuneupError, UsageError
from tuneup.machine.probe import probe_cpu
from tuneup.watch import control, daemon, plot
from tuneup.watch import summary as summaries
from tuneup.watch.host import Host
from tuneup.watch.job import AttachedJob, Job, StartedJob, new_feed_directory
from tuneup.watch.nvml import open_gpus
from tuneup.watch.procs import ProcessTree
from tuneup.watch.recent import Recent
from tuneup.watch.sampler import Sampler
from tuneup.watch.samples import Sample
from tuneup.watch.serve import Exporter, JobView, check_address
from tuneup.watch.stacks import StackSampler, find_py_spy
from tuneup.watch.state import StateDir
from tuneup.watch.view import LiveView, PlainView, block_height

MIN_INTERVAL_S = 0.1
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class WatchCommand(click.Command):
    """``watch`` runs or attaches to a job; a first argument ``status`` or ``stop`` asks the
    daemon instead (``tuneup watch -- status`` runs a program of that name)."""

    subcommands = {"status": control.status, "stop": control.stop}

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        if args and args[0] in self.subcommands:
            return self.subcommands[args[0]].make_context(
                f"{info_name} {args[0]}", args[1:], parent=parent, **extra)
        return super().make_context(info_name, args, parent=parent, **extra)


@click.command(cls=WatchCommand, context_settings={"help_option_names": ["-h", "--help"],
                                                   "allow_interspersed_args": False})
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.option("--pid", type=click.IntRange(min=1),
              help="Watch this running process instead of starting COMMAND.")
@click.option("--interval", type=float, default=1.0, show_default=True,
              help="Seconds between samples.")
@click.option("--summary", "summary_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the end-of-job summary here as JSON.")
@click.option("--plot", "plot_path", metavar="PATH.png|PATH.html",
              type=click.Path(dir_okay=False, path_type=Path),
              help="Draw utilisation and data wait over time here: PATH.png (needs "
                   "tuneup[plot]) or PATH.html (self-contained).")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="Lines per sample and the summary as text or JSON.")
@click.option("--serve", metavar="HOST:PORT",
              help="Serve the latest samples in Prometheus' text format at /metrics "
                   "(needs tuneup[prometheus]); a loopback address unless --serve-public.")
@click.option("--serve-public", is_flag=True,
              help="Let --serve listen on an address other machines reach: the command line "
                   "of every job watched (arguments, paths, any secret in them) is exposed "
                   "there to anyone who connects.")
@click.option("--daemon", "as_daemon", is_flag=True,
              help="Watch every training job on this machine, detached.")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
              help=f"{control.STATE_DIR_HELP} Goes with --daemon.")
@click.option("--log", "log_path", type=click.Path(dir_okay=False, path_type=Path),
              help="With --daemon: the JSON-lines log, rotated by size "
                   "[default: STATE_DIR/watch.jsonl].")
def watch(command: tuple[str, ...], pid: int | None, interval: float, summary_path: Path | None,
          plot_path: Path | None, output_format: str, serve: str | None, serve_public: bool,
          as_daemon: bool, state_dir: Path | None, log_path: Path | None) -> None:
    """Run COMMAND (or watch --pid PID) and say why it trains at the speed it does.

    \b
    tuneup watch -- python train.py --epochs 3
    tuneup watch --pid 12345 --summary watch.json --plot watch.png
    tuneup watch --daemon [--serve 127.0.0.1:9400]   every training job on this machine
    tuneup watch status [--format json]              the daemon's jobs and verdicts
    tuneup watch stop
    The job's output passes through; the watcher's lines go to stderr (stdout with --pid).
    See docs/watch.md.
    """
    if not math.isfinite(interval) or interval < MIN_INTERVAL_S:
        raise UsageError(f"--interval must be at least {MIN_INTERVAL_S} seconds (got {interval:g})")
    if serve is not None:
        check_address(serve, serve_public)
    if as_daemon:
        if command or pid is not None or summary_path is not None or plot_path is not None:
            raise UsageError("--daemon watches every training job on this machine: "
                             "give it no command, --pid, --summary or --plot")
        _start_daemon(StateDir(state_dir), interval, log_path, serve, serve_public,
                      output_format)
        return
    if state_dir is not None or log_path is not None:
        raise UsageError("--state-dir and --log go with --daemon")
    if bool(command) == (pid is not None):
        raise UsageError("give a command to run after -- or --pid PID, not both"
                         if command else "give a command to run (after --) or --pid PID")
    if summary_path is not None and not _writable_parent(summary_path):
        raise UsageError(f"cannot write the summary into {summary_path.parent}")
    if plot_path is not None:
        plot.check(plot_path)
        if not _writable_parent(plot_path):
            raise UsageError(f"cannot write the picture into {plot_path.parent}")
    stream = sys.stdout if pid is not None else sys.stderr
    with (Exporter(serve, serve_public) if serve is not None
          else contextlib.nullcontext()) as exporter, \
            (new_feed_directory() if command else contextlib.nullcontext()) as feed_directory:
        job: Job = StartedJob(command, feed_directory) if command else AttachedJob(pid)
        if exporter is not None:
            stream.write(f"tuneup watch: metrics at {exporter.url}\n")
        result, stopped_by = _watch(job, interval, stream, output_format, exporter)
    if output_format == "json":
        stream.write(json.dumps(result, indent=2) + "\n")
    else:
        summaries.print_text(Console(file=stream, highlight=False), result)
    for path, write in ((summary_path, summaries.write), (plot_path, plot.write)):
        if path is None:
            continue
        try:
            write(result, path)
        except OSError as exc:
            raise TuneupError(f"cannot write {path} ({exc.strerror or exc}); the summary is "
                              "printed above") from None
    status = result["exit_status"]
    code = status if status is not None else (128 + stopped_by if stopped_by else 0)
    click.get_current_context().exit(code)


def _writable_parent(path: Path) -> bool:
    folder = path.resolve().parent
    return folder.is_dir() and os.access(folder, os.W_OK)


def _start_daemon(state: StateDir, interval: float, log_path: Path | None, serve: str | None,
                  serve_public: bool, output_format: str) -> None:
    """Start the daemon and say where it is: its pid, its state directory, its log."""
    report = daemon.start(state, interval, log_path, serve, serve_public)
    if output_format == "json":
        click.echo(json.dumps({**report, "state_dir": str(state.path)}))
        return
    click.echo(f"tuneup watch: daemon started, pid {report['pid']}; state {state.path}; "
               f"log {report['log']}" + (f"; metrics at {report['serve']}" if report['serve']
                                         else ""))
    for note in report["notes"]:
        click.echo(f"  note: {note}")


class _Stopped(Exception):
    """A signal told an attached watcher to stop: raised from the handler, so that even a
    sample stuck in a system call ends at once."""


@contextlib.contextmanager
def _signals_passed_on(job: Job, received: list[int]) -> Iterator[None]:
    """SIGINT, SIGTERM, SIGHUP reach a started job, never end its watcher early: it keeps
    watching until the job ends, so the summary stays whole. The first one stops an
    attached watcher at once (:class:`_Stopped`), wherever it is; the job goes on. The
    signals received are appended to ``received``, in order."""

    def handler(signum: int, frame: Any) -> None:
        received.append(signum)
        job.pass_on(signum)
        if isinstance(job, AttachedJob) and len(received) == 1:
            raise _Stopped

    previous = {signum: signal.signal(signum, handler) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler_before in previous.items():
            signal.signal(signum, handler_before)


def _watch(job: Job, interval: float, stream: Any, output_format: str,
           exporter: Exporter | None) -> tuple[dict[str, Any], int | None]:
    """Sample ``job`` until it ends (or, attached, until the watcher is told to stop);
    returns the summary and the signal that stopped the watcher, if one did."""
    gpus, note = open_gpus()
    notes = [note] if note else []
    started = time.monotonic()
    try:
        tree = ProcessTree(job.pid)
    except psutil.Error as exc:  # an attached process that ended meanwhile
        raise UsageError(f"cannot watch process {job.pid}: {exc}") from None
    stacks = StackSampler(find_py_spy())
    sampler = Sampler(tree, Host(probe_cpu().usable_cores), gpus, job.feed_directory, stacks)
    samples: list[Sample] = []
    recent = Recent(job.command)
    live = output_format == "text" and stream.isatty() and os.environ.get("TERM") != "dumb"
    view = (LiveView(stream, block_height(len(gpus.handles) if gpus else 0)) if live
            else PlainView(stream, output_format == "json"))
    received: list[int] = []
    try:
        with _signals_passed_on(job, received), view:
            while not job.wait(interval):
                sampler.feed_directory = job.feed_directory
                samples.append(sampler.sample())
                verdict = recent.add(samples[-1])
                view.show(samples[-1], recent.figures, verdict)
                if exporter is not None:
                    exporter.publish([JobView(job.pid, recent.script, samples[-1],
                                              recent.figures, verdict)])
    except _Stopped:
        pass  # an attached watcher told to stop: the summary of what it saw follows
    finally:
        try:
            tail = stacks.close()  # first: it stops a py-spy process
        finally:
            if gpus is not None:
                if gpus.note:  # NVML stopped answering while the job ran
                    notes.append(gpus.note)
                gpus.close()
    if tail is not None and samples:  # the stacks of the job's last seconds join the last sample
        before = samples[-1].stacks
        samples[-1] = dataclasses.replace(samples[-1], stacks=tail + before if before else tail)
    if job.feed_directory is None:
        notes.append("no runtime feed: the job was not started by `tuneup watch -- ...`, so "
                     "the data wait is not measured")
    result = summaries.build(
        samples, sampler.runtime(), command=job.command, pid=job.pid,
        exit_status=job.exit_status(), duration_s=time.monotonic() - started,
        interval_s=interval, notes=notes, script=recent.script)
    stopped_by = received[0] if isinstance(job, AttachedJob) and received else None
    verdict = result["verdict"]
    if stacks.note and verdict is not None and verdict["kind"] == "undetermined":
        # said only when it mattered: py-spy also runs before a feed, a GPU or workers appear
        result["notes"].append(stacks.note)
    return result, stopped_by
