"""Process isolation for the probe protocol (docs/probe-protocol.md), parent side.

The script runs as ``sys.executable SCRIPT ARGS`` in its own process group with
``TUNEUP_PROBE`` pointing at a plan; results come back as JSON lines in a file. A trial
that crashes, hangs, runs out of memory or errors is recorded with its cause and the
remaining trials go on in a fresh process.
"""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuneup.autotune.space import Hardware
from tuneup.settings import Knobs

ENV_PROBE = "TUNEUP_PROBE"
PROTOCOL = 1
POLL_S = 0.05
MEMORY_POLL_S = 0.25
STDERR_TAIL_LINES = 12
# Measurement window of every trial (plan keys of docs/probe-protocol.md).
PLAN_DEFAULTS = {"warmup_steps": 2, "measure_steps": 9, "min_measure_seconds": 1.5,
                 "max_measure_steps": 60, "check_steps": 3}

# Statuses a trial can end with. The first four come from the child.
OK, OOM, ERROR, NONFINITE = "ok", "oom", "error", "nonfinite"
CRASH, HANG, BUDGET, SKIPPED = "crash", "hang", "budget", "skipped"


class ScriptError(Exception):
    """The script cannot be probed at all (never reached the wrappers, failed on its own)."""


@dataclass(frozen=True)
class Trial:
    """One point to measure: an id, the knobs, and whether to record check losses."""

    id: str
    knobs: Knobs
    check: bool = False

    def plan_entry(self) -> dict[str, Any]:
        return {"id": self.id, "knobs": self.knobs.to_dict(), "check": self.check}


@dataclass
class TrialResult:
    """What happened to one trial, from its ``trial_end`` event or from the parent."""

    trial: Trial
    status: str
    samples_per_s: float | None = None
    step_s: float | None = None
    step_s_all: list[float] = field(default_factory=list)
    data_wait_share: float | None = None
    warmup_s: float | None = None
    check_losses: list[float] | None = None
    peak_memory_bytes: int | None = None
    message: str = ""

    @classmethod
    def from_event(cls, trial: Trial, event: dict[str, Any]) -> TrialResult:
        def number(key: str) -> float | None:
            value = event.get(key)
            return float(value) if _is_number(value) and math.isfinite(value) else None

        losses = event.get("check_losses")
        peak = event.get("peak_memory_bytes")
        return cls(
            trial=trial,
            status=str(event.get("status") or ERROR),
            samples_per_s=number("samples_per_s"),
            step_s=number("step_s"),
            step_s_all=[float(s) for s in event.get("step_s_all") or [] if _is_number(s) and s > 0],
            data_wait_share=number("data_wait_share"),
            warmup_s=number("warmup_s"),
            check_losses=[_loss(v) for v in losses] if isinstance(losses, list) else None,
            peak_memory_bytes=int(peak) if _is_number(peak) else None,
            message=str(event.get("message") or ""),
        )

    @property
    def ok(self) -> bool:
        return self.status == OK and self.step_time is not None

    @property
    def step_time(self) -> float | None:
        """Mean optimizer-step time over the measured window.

        The whole window counts: a loader's queue fills while the model is slow and empties
        in a burst of fast steps, so any selection of "good" steps would flatter it.
        """
        if self.step_s is not None:
            return self.step_s
        return statistics.fmean(self.step_s_all) if self.step_s_all else None

    @property
    def noise(self) -> float:
        """Relative standard error of :attr:`step_time`, from block means of the steps.

        Blocks (2 x workers steps, at least 3) absorb a loader's bursts and stretches of
        interference that slow neighbouring steps together.
        """
        size = max(3, 2 * (self.trial.knobs.num_workers or 0))
        times = self.step_s_all
        means = [statistics.fmean(times[i:i + size]) for i in range(0, len(times) - size + 1, size)]
        if len(means) < 2:
            return 0.05
        return max(0.005, statistics.stdev(means) / statistics.fmean(means) / math.sqrt(len(means)))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _loss(value: Any) -> float:
    return float(value) if _is_number(value) else math.nan


@dataclass
class _Process:
    """One child process and the files it writes."""

    popen: subprocess.Popen[bytes]
    results: Path
    stderr: Path
    started: float
    offset: int = 0
    buffer: str = ""

    def new_events(self) -> list[dict[str, Any]]:
        """Complete JSON lines appended since the last call (a partial last line waits)."""
        try:
            with self.results.open("rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        self.buffer += chunk.decode("utf-8", errors="replace")
        *lines, self.buffer = self.buffer.split("\n")
        events = []
        for line in lines:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict):
                events.append(event)
        return events

    def kill(self) -> None:
        """Kill the whole process group (the script and any DataLoader workers it left)."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            if self.popen.poll() is None:
                self.popen.kill()
        self.popen.wait()

    def stderr_tail(self, lines: int = STDERR_TAIL_LINES) -> str:
        try:
            text = self.stderr.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(line for line in text.strip().splitlines()[-lines:])

    def exit_description(self) -> str:
        code = self.popen.returncode
        if code is not None and code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit status {code}"


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


class Runner:
    """Runs trials of one script in child processes, within a deadline.

    ``timeout`` (seconds, or a function of the trial) bounds the wait for the next event
    once a trial is due; ``startup_timeout`` bounds the wait for ``hello``.
    """

    def __init__(
        self,
        script: Path,
        args: list[str] | tuple[str, ...] = (),
        *,
        deadline: float = math.inf,
        timeout: float | Callable[[Trial], float] = 120.0,
        startup_timeout: float = 180.0,
        max_memory_bytes: int | None = None,
        plan: dict[str, Any] | None = None,
        on_trial_start: Callable[[Trial], None] | None = None,
        on_trial_end: Callable[[TrialResult], None] | None = None,
    ) -> None:
        self.script = Path(script)
        self.args = list(args)
        self.deadline = deadline
        self.timeout = timeout
        self.startup_timeout = startup_timeout
        self.max_memory_bytes = max_memory_bytes
        self.plan = {**PLAN_DEFAULTS, **(plan or {})}
        self.on_trial_start = on_trial_start
        self.on_trial_end = on_trial_end
        self.hardware: Hardware | None = None
        self.startup_s: float | None = None  # process start -> first trial_start, measured
        self.processes_started = 0
        self._workdir = Path(tempfile.mkdtemp(prefix="tuneup-autotune-"))
        self._process: _Process | None = None

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def close(self) -> None:
        """Kill a running child (Ctrl-C, errors) and remove the work files."""
        if self._process is not None:
            self._process.kill()
            self._process = None
        for path in self._workdir.glob("*"):
            path.unlink(missing_ok=True)
        self._workdir.rmdir()

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, trials: list[Trial],
            stop: Callable[[TrialResult], bool] | None = None) -> list[TrialResult]:
        """Run ``trials`` in order and return one result per trial, in the same order.

        ``stop(result)`` returning true after a trial skips the rest (early stop). Trials
        left when the deadline passes end with status ``budget``.
        """
        results: dict[str, TrialResult] = {}
        pending = list(trials)
        idle_processes = 0
        while pending:
            if self.time_left() <= 0:
                break
            finished, stopped = self._run_process(pending, stop)
            for result in finished:
                results[result.trial.id] = result
            pending = [t for t in pending if t.id not in results]
            if stopped:
                for trial in pending:
                    results[trial.id] = TrialResult(trial, SKIPPED, message="early stop")
                pending = []
            idle_processes = 0 if finished else idle_processes + 1
            if idle_processes >= 2 and pending:
                message = ("the script's loop ended before a trial finished twice in a row: "
                           "give it more steps through SCRIPT_ARGS")
                for trial in pending:
                    results[trial.id] = TrialResult(trial, ERROR, message=message)
                pending = []
        for trial in pending:
            results[trial.id] = TrialResult(trial, BUDGET, message="budget exhausted")
        return [results[t.id] for t in trials]

    def _start(self, trials: list[Trial]) -> _Process:
        self.processes_started += 1
        n = self.processes_started
        results = self._workdir / f"results-{n}.jsonl"
        plan_path = self._workdir / f"plan-{n}.json"
        plan = {"protocol": PROTOCOL, "results": str(results),
                "reference": str(self._workdir / "reference.pt"), **self.plan,
                "trials": [t.plan_entry() for t in trials]}
        plan_path.write_text(json.dumps(plan, indent=1), encoding="utf-8")
        results.touch()
        stderr = self._workdir / f"stderr-{n}.txt"
        env = {**os.environ, ENV_PROBE: str(plan_path)}
        with stderr.open("wb") as err:
            popen = subprocess.Popen(
                [sys.executable, str(self.script), *self.args],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                env=env, start_new_session=True,
            )
        return _Process(popen, results, stderr, time.monotonic())

    def _trial_timeout(self, trial: Trial) -> float:
        return self.timeout(trial) if callable(self.timeout) else self.timeout

    def _run_process(self, pending: list[Trial], stop: Callable[[TrialResult], bool] | None
                     ) -> tuple[list[TrialResult], bool]:
        """One child process over ``pending``; returns (finished results, early-stopped)."""
        by_id = {t.id: t for t in pending}
        process = self._process = self._start(pending)
        finished: list[TrialResult] = []
        current: Trial | None = None
        said_hello = False
        exit_message = ""  # the child's own account of an exit outside a trial
        script_ended = False  # the script's own loop finished: restart, nothing failed
        last_event = last_memory_check = time.monotonic()
        try:
            while True:
                exited = process.popen.poll() is not None
                for event in process.new_events():
                    last_event = time.monotonic()
                    kind = event.get("event")
                    if kind == "hello":
                        said_hello = True
                        if self.hardware is None:
                            self.hardware = Hardware.from_hello(event)
                    elif kind == "trial_start" and event.get("id") in by_id:
                        current = by_id[event["id"]]
                        if self.startup_s is None:
                            self.startup_s = last_event - process.started
                        if self.on_trial_start:
                            self.on_trial_start(current)
                    elif kind == "exit":
                        script_ended = event.get("reason") == "script-ended"
                        exit_message = str(event.get("message") or "")
                    elif kind == "trial_end" and event.get("id") in by_id:
                        result = TrialResult.from_event(by_id[event["id"]], event)
                        finished.append(result)
                        current = None
                        if self.on_trial_end:
                            self.on_trial_end(result)
                        if stop is not None and stop(result) and len(finished) < len(pending):
                            return finished, True
                if exited:
                    break
                now = time.monotonic()
                failure = self._watchdog(process, current, pending, finished, said_hello,
                                         now - last_event, now - last_memory_check)
                if now - last_memory_check >= MEMORY_POLL_S:
                    last_memory_check = now
                if failure is not None:
                    process.kill()
                    if not said_hello and self.hardware is None and failure.status == HANG:
                        raise ScriptError(self._never_called_message(process, failure.message))
                    return finished + [failure], False
                time.sleep(POLL_S)
            if not said_hello:
                if self.hardware is None:
                    raise ScriptError(self._never_called_message(process, exit_message))
                return [self._crash(pending[0], process, exit_message)], False
            unfinished = current is not None and all(r.trial.id != current.id for r in finished)
            if unfinished and not script_ended:
                finished.append(self._crash(current, process, exit_message))
            return finished, False
        finally:
            process.kill()
            self._process = None

    def _watchdog(self, process: _Process, current: Trial | None, pending: list[Trial],
                  finished: list[TrialResult], said_hello: bool, quiet_s: float,
                  since_memory_check: float) -> TrialResult | None:
        """A result for the trial to abandon (hang, memory cap, budget), or ``None``."""
        done_ids = {r.trial.id for r in finished}
        due = current or next((t for t in pending if t.id not in done_ids), None)
        if due is None:
            return None
        if self.time_left() <= 0:
            return TrialResult(due, BUDGET, message="budget exhausted during the trial")
        limit = self._trial_timeout(due) if said_hello else self.startup_timeout
        if quiet_s > limit:
            where = "the trial" if said_hello else "start-up (no hello)"
            return TrialResult(due, HANG, message=f"no progress in {limit:.0f} s during {where}; "
                                                  "process group killed")
        if self.max_memory_bytes and since_memory_check >= MEMORY_POLL_S:
            used = process_tree_rss(process.popen.pid)
            if used > self.max_memory_bytes:
                cap = self.max_memory_bytes / 2**30
                return TrialResult(due, OOM, message=f"host memory {used / 2**30:.2f} GiB above "
                                                     f"--max-memory {cap:.2f} GiB")
        return None

    def _crash(self, trial: Trial, process: _Process, reason: str = "") -> TrialResult:
        tail = reason or last_line(process.stderr_tail())
        message = f"process died ({process.exit_description()})" + (f": {tail}" if tail else "")
        return TrialResult(trial, CRASH, message=message)

    def _never_called_message(self, process: _Process, why: str = "") -> str:
        message = f"{self.script.name} never called tuned_loader — see docs/autotune.md"
        if why:
            message += f" ({why})"
        tail = process.stderr_tail()
        if process.popen.returncode != 0 and tail:
            indented = "\n".join("  " + line for line in tail.splitlines())
            message += f"\nit failed on its own ({process.exit_description()}):\n{indented}"
        return message


def process_tree_rss(pid: int) -> int:
    """Resident memory of a process and its children, in bytes (0 when it is gone)."""
    import psutil

    try:
        root = psutil.Process(pid)
        members = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for member in members:
        try:
            total += member.memory_info().rss
        except psutil.Error:
            continue
    return total
