"""``tuneup watch --daemon``: one detached watcher for every training job on the machine.

:func:`start` launches ``python -m tuneup.watch.daemon``, which forks once more (the
classic double fork: the daemon is no session leader, so it never gets a controlling
terminal, and the launcher is reaped at once) and answers on a pipe once it holds the
state directory's lock and runs, or with the one-line error it stopped with.

:class:`Daemon` finds the jobs (:mod:`tuneup.watch.discover`), samples each every interval,
keeps a verdict per job over the last 10 s with the time it began, logs JSON lines (rotated
by size) and replaces ``status.json`` every tick. SIGTERM or SIGINT lets the tick in
progress finish, then the daemon logs a last line, closes the log and removes its pid file:
the log is never cut in the middle of a line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import logging.handlers
import os
import select
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

from tuneup.errors import TuneupError, UsageError
from tuneup.machine.probe import probe_cpu
from tuneup.watch.discover import Finder, Found, gpu_pids
from tuneup.watch.host import Host
from tuneup.watch.nvml import GpuReader, open_gpus
from tuneup.watch.procs import ProcessTree
from tuneup.watch.recent import Recent
from tuneup.watch.safe_files import open_append, read_regular
from tuneup.watch.sampler import Sampler
from tuneup.watch.samples import HostSample
from tuneup.watch.serve import Exporter, JobView
from tuneup.watch.state import DAEMON_MODULE, StateDir, check_log

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
LOG_MAX_BYTES = 10 << 20  # a job's samples fill this in about two hours
LOG_BACKUPS = 5
KEEP_ENDED = 20  # ended jobs the status still lists
MAX_LISTED = 256  # jobs in the status: with bounded command lines, well under its read limit
START_TIMEOUT_S = 60.0
MAX_READY_BYTES = 1 << 16
FAILURE_WINDOW_S = 60.0  # a log that cannot be written is said once a minute on stderr
MAX_STDERR_BYTES = 1 << 20  # daemon.stderr is emptied past this


def now() -> str:
    """Local time with its offset: readable in the status, parseable by scripts."""
    return datetime.now().astimezone().isoformat(timespec="seconds")


def start(state: StateDir, interval: float, log: Path | None, serve: str | None,
          serve_public: bool = False) -> dict[str, Any]:
    """Start the daemon detached; returns what it reported once running (``pid``, ``log``,
    ``serve``, ``notes``), or raises the error it stopped with."""
    state.create()
    read_fd, write_fd = os.pipe()
    command = [sys.executable, "-m", DAEMON_MODULE, "--state-dir", str(state.path),
               "--interval", repr(interval), "--ready-fd", str(write_fd)]
    command += ["--log", str(log.expanduser().absolute())] if log is not None else []
    command += ["--serve", serve] if serve is not None else []
    command += ["--serve-public"] if serve_public else []
    try:
        with os.fdopen(state.open_stderr(), "ab") as stderr:
            launcher = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=stderr,
                                        pass_fds=(write_fd,), start_new_session=True, cwd="/")
    except OSError as exc:
        os.close(read_fd)
        raise UsageError(f"cannot write into the state directory {state.path} "
                         f"({exc.strerror or exc})") from None
    finally:
        os.close(write_fd)
    launcher.wait()  # the first fork returns at once; the daemon is its child
    with os.fdopen(read_fd, "rb") as ready:
        answered, _, _ = select.select([ready], [], [], START_TIMEOUT_S)
        line = ready.readline(MAX_READY_BYTES) if answered else b""
    try:
        report = json.loads(line)
    except ValueError:
        raise TuneupError(f"the daemon did not start{_last_line(state.stderr_file)}; see "
                          f"{state.stderr_file}") from None
    if "error" in report:
        error = TuneupError(report["error"])
        error.exit_code = int(report.get("exit_code", 1))
        raise error
    return report


def _last_line(path: Path) -> str:
    raw = read_regular(path, MAX_READY_BYTES, tail=True)
    lines = raw.decode("utf-8", errors="replace").strip().splitlines() if raw else []
    return f" ({lines[-1].strip()})" if lines else ""


class _TickHost:
    """The machine's figures, read once per tick and handed to every job's sampler: the
    CPU shares :class:`Host` gives are since its previous reading, so one reading a tick."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.current = host.sample()

    def tick(self) -> None:
        self.current = self.host.sample()

    def sample(self) -> HostSample:
        return self.current


class Watched:
    """One job the daemon found: its sampler, its live verdict and since when it holds."""

    def __init__(self, found: Found, host: _TickHost, gpus: GpuReader | None) -> None:
        self.found = found
        self.tree = ProcessTree(found.pid)  # raises psutil.Error when the job is gone
        # the tick's shared host reading stands in for a Host of the job's own
        self.sampler = Sampler(self.tree, host, gpus,  # type: ignore[arg-type]
                               found.feed_directory)
        self.recent = Recent(found.command)
        self.first_seen = now()
        self.verdict_since: str | None = None
        self.ended_at: str | None = None
        self.samples = 0

    def ended(self) -> bool:
        """Gone, a zombie its parent has not reaped yet, or its pid taken by another."""
        root = self.tree.root
        try:
            return not root.is_running() or root.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            return True

    def status(self) -> dict[str, Any]:
        verdict = self.recent.verdict
        return {"pid": self.found.pid, "command": list(self.found.command),
                "user": self.found.user, "found_by": self.found.found_by,
                "feed": self.found.feed_directory is not None,
                "state": "ended" if self.ended_at else "running",
                "first_seen": self.first_seen, "ended_at": self.ended_at,
                "samples": self.samples,
                "verdict": verdict.to_dict() if verdict is not None else None,
                "verdict_since": self.verdict_since}


class _LogFile(logging.handlers.RotatingFileHandler):
    """Rotated by size, and opened without following a link planted at its name. A record
    that cannot be written (a full disk) costs one line on stderr per
    :data:`FAILURE_WINDOW_S`, with the count lost, never a traceback per record."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lost = 0
        self.said_at = -FAILURE_WINDOW_S

    def _open(self) -> Any:
        return open(open_append(Path(self.baseFilename)), self.mode, encoding=self.encoding,
                    errors=self.errors)

    def handleError(self, record: logging.LogRecord) -> None:
        self.lost += 1
        if time.monotonic() - self.said_at < FAILURE_WINDOW_S:
            return
        error = sys.exc_info()[1]
        reason = getattr(error, "strerror", None) or error or "unknown error"
        with contextlib.suppress(OSError, ValueError):  # stderr on the full disk too
            sys.stderr.write(f"{now()} tuneup watch daemon: cannot write the log "
                             f"{self.baseFilename} ({reason}); {self.lost} record(s) lost, "
                             f"said again at most every {FAILURE_WINDOW_S:g} s\n")
            sys.stderr.flush()
        self.said_at, self.lost = time.monotonic(), 0


def cap_stderr(fd: int, path: Path) -> None:
    """Empty ``fd`` when it is ``path`` (the daemon's ``daemon.stderr``, not a test's
    terminal) and has grown past :data:`MAX_STDERR_BYTES`, saying so in its first line."""
    with contextlib.suppress(OSError):
        status, named = os.fstat(fd), os.stat(path)
        if ((status.st_dev, status.st_ino) == (named.st_dev, named.st_ino)
                and status.st_size > MAX_STDERR_BYTES):
            os.ftruncate(fd, 0)
            os.write(fd, f"{now()} tuneup watch daemon: {path} grew past "
                         f"{MAX_STDERR_BYTES >> 20} MiB; its earlier lines were cut\n".encode())


def _open_log(path: Path) -> logging.Logger:
    """A logger writing each message as one line to ``path``, rotated by size."""
    handler = _LogFile(path, maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.Logger(DAEMON_MODULE)  # not the global tree: nobody else's records land here
    log.addHandler(handler)
    return log


class Daemon:
    """The daemon's work, one :meth:`tick` at a time (tests drive it in-process)."""

    def __init__(self, state: StateDir, interval: float, log: Path | None = None,
                 serve: str | None = None, finder: Finder | None = None,
                 nvml: Any = None, serve_public: bool = False) -> None:
        """Take the state directory (its lock, its pid file), open the log, NVML (``nvml``:
        pynvml unless a test replays a recording) and the metrics endpoint; raises
        :class:`TuneupError` with nothing left behind."""
        self.state = state
        self.interval = interval
        self.lock_fd = state.lock()
        self.notes: list[str] = []
        self.exporter: Exporter | None = None
        try:
            stale = state.read_pid()
            if stale is not None:
                state.remove_pid()
                self.notes.append(f"removed the stale pid file of pid {stale} (it is gone)")
            self.exporter = Exporter(serve, serve_public) if serve is not None else None
            self.log_path = log or state.log_file
            if log is not None:
                check_log(log)
            try:
                self.log = _open_log(self.log_path)
            except OSError as exc:
                raise UsageError(f"cannot write the log {self.log_path} "
                                  f"({exc.strerror or exc})") from None
        except BaseException:
            self._release()
            raise
        self.gpus, note = open_gpus(nvml)
        self.notes += [note] if note else []
        self.finder = finder or Finder()
        self.host = _TickHost(Host(probe_cpu().usable_cores))
        self.jobs: dict[int, Watched] = {}
        self.ended: list[Watched] = []
        self.started_at = now()
        state.write_pid(os.getpid())
        self._event("started", pid=os.getpid(), interval_s=interval,
                    state_dir=str(state.path), serve=self.serve_url)
        for note in self.notes:
            self._event("note", note=note)
        self._write_status()

    @property
    def serve_url(self) -> str | None:
        return self.exporter.url if self.exporter is not None else None

    def _event(self, event: str, **fields: Any) -> None:
        self.log.info(json.dumps({"time": now(), "event": event, **fields}))

    def _note(self, note: str) -> None:
        self.notes.append(note)
        self._event("note", note=note)

    def tick(self) -> None:
        """Find jobs, sample each, judge, log, publish, write the status."""
        self.host.tick()
        for found in self.finder.find(gpu_pids(self.gpus)):
            if found.pid not in self.jobs:
                self._watch(found)
        while self.finder.notes:
            self._note(self.finder.notes.pop(0))
        for pid, job in list(self.jobs.items()):
            if job.ended():
                self._end(pid, job)
                continue
            sample = job.sampler.sample()
            before = job.recent.verdict
            verdict = job.recent.add(sample)
            job.samples += 1
            self._event("sample", job=pid, sample=sample.to_dict(),
                        verdict=verdict.kind if verdict is not None else None)
            if verdict is not None and (before is None or before.kind != verdict.kind):
                job.verdict_since = now()
                self._event("verdict", job=pid, verdict=verdict.to_dict())
        if self.exporter is not None:
            self.exporter.publish([
                JobView(pid, job.recent.script, job.recent.latest, job.recent.figures,
                        job.recent.verdict)
                for pid, job in self.jobs.items() if job.recent.latest is not None])
        self._write_status()

    def _watch(self, found: Found) -> None:
        try:
            self.jobs[found.pid] = Watched(found, self.host, self.gpus)
        except psutil.Error:  # ended between finding and watching
            return
        self._event("job-seen", job=found.pid, command=list(found.command), user=found.user,
                    found_by=found.found_by, feed=found.feed_directory is not None)

    def _end(self, pid: int, job: Watched) -> None:
        job.ended_at = now()
        del self.jobs[pid]
        self.ended = [*self.ended, job][-KEEP_ENDED:]
        verdict = job.recent.verdict
        self._event("job-ended", job=pid, samples=job.samples,
                    verdict=verdict.to_dict() if verdict is not None else None)

    def status(self, stopped_at: str | None = None) -> dict[str, Any]:
        """What ``status.json`` holds: bounded whatever the machine's users run (at most
        :data:`MAX_LISTED` jobs, each command line cut by the finder)."""
        jobs = [*self.jobs.values(), *self.ended]
        return {"pid": os.getpid(), "state_dir": str(self.state.path),
                "log": str(self.log_path), "serve": self.serve_url,
                "interval_s": self.interval, "started_at": self.started_at,
                "updated_at": now(), "stopped_at": stopped_at, "notes": self.notes,
                "jobs": [job.status() for job in jobs[:MAX_LISTED]],
                "jobs_not_listed": max(0, len(jobs) - MAX_LISTED)}

    def _write_status(self, stopped_at: str | None = None) -> None:
        try:
            self.state.write_status(self.status(stopped_at))
        except OSError as exc:  # the disk filled up: say it in the log, go on watching
            self._event("note", note=f"cannot write {self.state.status_file} "
                                     f"({exc.strerror or exc})")

    def run(self) -> None:
        """Tick every interval until SIGTERM or SIGINT; then close everything whole."""
        stop = threading.Event()
        received: list[int] = []

        def handler(signum: int, frame: Any) -> None:
            received.append(signum)
            stop.set()

        for signum in STOP_SIGNALS:
            signal.signal(signum, handler)
        try:
            due = time.monotonic()
            while not stop.is_set():
                self.tick()
                cap_stderr(2, self.state.stderr_file)  # the daemon's stderr is that file
                due = max(due + self.interval, time.monotonic())  # a slow tick: no catching up
                stop.wait(due - time.monotonic())
        finally:
            self.close(signal.Signals(received[0]).name if received else None)

    def close(self, reason: str | None = None) -> None:
        """Log the end, close the log, leave a last status, remove the pid file."""
        self._event("stopped", signal=reason, jobs=len(self.jobs))
        self._write_status(stopped_at=now())
        for handler in self.log.handlers:
            handler.close()
        if self.gpus is not None:
            self.gpus.close()
        self.state.remove_pid()
        self._release()

    def _release(self) -> None:
        if self.exporter is not None:
            self.exporter.close()
        os.close(self.lock_fd)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {DAEMON_MODULE}",
                                     description="tuneup watch's daemon (start it with "
                                     "`tuneup watch --daemon`)")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--interval", type=float, required=True)
    parser.add_argument("--ready-fd", type=int, required=True,
                        help="a pipe to report on once running, or the error")
    parser.add_argument("--log", type=Path)
    parser.add_argument("--serve")
    parser.add_argument("--serve-public", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    """The launcher's entry: fork the daemon, which reports on ``--ready-fd`` and runs."""
    args = _parser().parse_args(argv)
    if os.fork():
        os._exit(0)
    with os.fdopen(args.ready_fd, "w", encoding="utf-8") as ready:
        try:
            daemon = Daemon(StateDir(args.state_dir), args.interval, args.log, args.serve,
                            serve_public=args.serve_public)
        except TuneupError as exc:
            ready.write(json.dumps({"error": str(exc), "exit_code": exc.exit_code}) + "\n")
            return exc.exit_code
        ready.write(json.dumps({"pid": os.getpid(), "log": str(daemon.log_path),
                                "serve": daemon.serve_url, "notes": daemon.notes}) + "\n")
    daemon.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
