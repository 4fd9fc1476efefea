"""Process isolation for the probe protocol (docs/probe-protocol.md), parent side.

The script runs as ``sys.executable SCRIPT ARGS`` (or, with ``nproc_per_node`` > 1, under
``python -m torch.distributed.run`` with that many local ranks) in its own process group
with ``TUNEUP_PROBE`` pointing at a plan; results come back as JSON lines in a file per
rank. A trial that crashes, hangs, runs out of memory or errors — on any rank — is recorded
once with its cause and the remaining trials go on in a fresh process.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuneup import owned_dirs
from tuneup.autotune import protocol, write_guard
from tuneup.autotune.leftovers import SNAPSHOT_DIR, WORKDIR_PREFIX, Recovered, sweep_stale_workdirs
from tuneup.autotune.protocol import BUDGET, CRASH, ERROR, HANG, NONFINITE, OOM, SKIPPED
from tuneup.autotune.put_back import armed, restore
from tuneup.autotune.ranks import RankEvents, died_silently
from tuneup.autotune.scratch import trial_tmpdir
from tuneup.autotune.sentinel import DIE_WITH_PARENT, Sentinel, kill_marked
from tuneup.autotune.snapshot import FolderSnapshot, named_folders
from tuneup.autotune.space import ScriptFacts
from tuneup.autotune.trials import Trial, TrialResult
from tuneup.errors import ScriptError
from tuneup.files import write_atomic
from tuneup.runtime.hooks import ENV_OBSERVERS
from tuneup.site import ENV_JOURNAL, SITE_DIR

if TYPE_CHECKING:
    import psutil

    from tuneup.settings import Knobs

# what a script built on a trainer calls instead (docs/integrations.md)
TRAINERS = "for a Trainer: tuned_trainer or tuned_trainer_kwargs"
POLL_S = 0.05
BEAT_S = 1.0  # how often the run marks itself alive on its lock file (see replay_workdir)
MEMORY_POLL_S = 0.25
STDERR_TAIL_LINES = 12
@dataclass
class _EventFile:
    """One results file, read as it grows."""

    path: Path
    offset: int = 0
    buffer: str = ""

    def new_events(self) -> list[dict[str, Any]]:
        """Complete JSON lines appended since the last call (a partial last line waits)."""
        try:
            with self.path.open("rb") as handle:
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


@dataclass
class _Process:
    """One child process (or torchrun with its ranks) and the files it writes."""

    popen: subprocess.Popen[bytes]
    files: list[_EventFile]  # one per rank
    stderr: Path
    started: float
    next_plan: Path  # where this process looks for its next plan
    marker: str  # its protocol.ENV_MARKER value, inherited by all it starts
    journal: Path  # what the script wrote, to put back when the process has ended
    said_hello: bool = False
    put_back: list[str] = field(default_factory=list)  # the user's paths restored after it
    not_put_back: list[str] = field(default_factory=list)  # changed, and no copy to restore
    snapshot: FolderSnapshot | None = None  # the script's folder before the first trial
    started_wall: float = field(default_factory=time.time)  # changes since count as its own
    guarded: bool = True  # its write guard was armed (its journal existed when it ended)
    waits: bool = False  # its hello said it waits for a next plan after its last trial
    last_knobs: Knobs | None = None  # of the trial it started last, whatever its plan
    previous_knobs: Knobs | None = None  # of the one before that
    graphs: Knobs | None = None  # the compiled graphs it holds (the child keeps the last)

    def __post_init__(self) -> None:
        self.ranks = RankEvents(len(self.files)) if len(self.files) > 1 else None

    def trial_started(self, knobs: Knobs) -> None:
        self.previous_knobs, self.last_knobs = self.last_knobs, knobs
        if knobs.compile_mode:
            self.graphs = knobs.without_loader()

    def reusable(self) -> bool:
        """It waits for a next plan, and runs."""
        return self.waits and self.popen.poll() is None

    def new_events(self) -> list[dict[str, Any]]:
        """The events written since the last call, as one process would have written them."""
        if self.ranks is None:
            return self.files[0].new_events()
        return [merged for rank, events in enumerate(f.new_events() for f in self.files)
                for event in events for merged in self.ranks.add(rank, event)]

    def kill(self) -> None:
        """Kill the script and every descendant: its process group, the members of its tree
        that started a session of their own (found before anything is killed), and those
        that left the tree (a double fork) but carry its marker."""
        kill_tree(self.popen.pid)
        self.popen.wait()
        kill_marked(self.marker)
        self.guarded = self.guarded and armed(self.journal)  # the guard made it at start
        self.put_back.extend(restore(self.journal, None, self.not_put_back))
        if self.snapshot is not None:  # what the journal did not see, compared
            compared = self.snapshot.compare_and_put_back(since=self.started_wall - 1.0)
            self.put_back.extend(compared.put_back)
            self.not_put_back.extend(compared.not_put_back)

    def stderr_text(self) -> str:
        try:
            return self.stderr.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def stderr_tail(self, lines: int = STDERR_TAIL_LINES) -> str:
        return "\n".join(line for line in self.stderr_text().strip().splitlines()[-lines:])

    def exit_description(self) -> str:
        code = self.popen.returncode
        if code is not None and code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit status {code}"


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``, its process group and all its descendants, wherever they moved."""
    import psutil

    try:
        members = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        members = []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
    for member in members:
        with contextlib.suppress(psutil.Error):
            member.kill()


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
        nproc_per_node: int = 1,
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
        self.nproc_per_node = nproc_per_node
        self.window = {**protocol.WINDOW_DEFAULTS, **(plan or {})}
        self.on_trial_start = on_trial_start
        self.on_trial_end = on_trial_end
        self.facts: ScriptFacts | None = None
        self.startup_s: float | None = None  # process start -> first trial_start, measured
        self.processes_started = 0
        self.plans_written = 0
        self.recovered = Recovered()  # what killed runs before this one had left changed
        sweep_stale_workdirs(self.recovered)
        self._owned = owned_dirs.OwnedDir(WORKDIR_PREFIX)  # locked while this run lives
        self._last_beat = 0.0
        self._snapshot: FolderSnapshot | None = None
        self._sentinel: Sentinel | None = None  # puts back what trials changed if this run dies
        self._run_marker = f"{os.getpid()}-{secrets.token_hex(4)}"  # begins each trial's marker
        self._workdir = self._owned.path
        self._process: _Process | None = None
        self._started: list[_Process] = []
        self._retried: set[str] = set()  # trials re-run in a fresh process after a switch

    @property
    def unguarded(self) -> int:
        """Trial processes that said hello without their write guard armed (no journal)."""
        return sum(p.said_hello and not p.guarded for p in self._started)

    @property
    def put_back(self) -> list[str]:
        """The user's files the script changed during trials, each restored (once named)."""
        return list(dict.fromkeys(path for p in self._started for path in p.put_back))

    @property
    def not_put_back(self) -> list[str]:
        """Files of the script's folder a trial changed unseen by the write guard and with no
        copy kept (too big to copy up front): left as the trial left them."""
        return list(dict.fromkeys(path for p in self._started for path in p.not_put_back))

    @property
    def folder_snapshot(self) -> FolderSnapshot | None:  # the user's folders before trials
        return self._snapshot

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def live_process(self) -> bool:
        """Whether the next :meth:`run` goes on in a process already started (no start-up
        to pay): one that finished its plan, or was paused by an early stop, and waits."""
        return self._process is not None and self._process.reusable()

    def held_graphs(self) -> Knobs | None:
        """The compiled graphs the waiting process holds (None: none waits, or it compiled
        nothing): its next trial of the same knobs, loader knobs aside, compiles nothing."""
        return self._process.graphs if self._process is not None and self.live_process() \
            else None

    def close(self) -> None:
        """Kill a running child (Ctrl-C, errors) and remove the work files."""
        if self._process is not None:
            self._process.kill()
            self._process = None
        shutil.rmtree(self._workdir, ignore_errors=True)
        self._owned.release()
        if self._sentinel is not None:
            self._sentinel.stop()

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
                for trial in pending:
                    results[trial.id] = TrialResult(trial, ERROR,
                                                    message=protocol.SCRIPT_TOO_SHORT)
                pending = []
        for trial in pending:
            results[trial.id] = TrialResult(trial, BUDGET, message="budget exhausted")
        return [results[t.id] for t in trials]

    def _write_plan(self, trials: list[Trial], path: Path | None = None
                    ) -> tuple[Path, list[_EventFile], Path]:
        """Write a plan of ``trials`` (to ``path``, default a new file) atomically: its
        results files, read from the start, and where its process's next plan goes (a
        child under torchrun ignores that, see :attr:`protocol.Plan.waits_for_next_plan`)."""
        self.plans_written += 1
        n = self.plans_written
        results = self._workdir / f"results-{n}.jsonl"
        next_plan = self._workdir / f"next-{n}.json"
        plan = protocol.Plan(results=results, trials=[t.plan_entry() for t in trials],
                             reference=self._workdir / "reference.pt", parent_pid=os.getpid(),
                             ranks=self.nproc_per_node, next_plan=next_plan,
                             **self.window)
        files = [_EventFile(protocol.for_rank(results, rank))
                 for rank in range(self.nproc_per_node)]
        for file in files:
            file.path.touch()
        path = path or self._workdir / f"plan-{n}.json"
        write_atomic(path, plan.to_json(), durable=False)
        return path, files, next_plan

    def _continue(self, trials: list[Trial]) -> _Process | None:
        """The live process, given ``trials`` as its next plan; None when there is none."""
        process = self._process
        if process is None:
            return None
        if not process.reusable():  # it died while it waited (the kernel's OOM killer)
            process.kill()
            self._process = None
            return None
        self._hand_over(process, trials)
        return process

    def _hand_over(self, process: _Process, trials: list[Trial]) -> None:
        """Give a waiting process its next plan."""
        _, process.files, process.next_plan = self._write_plan(trials, process.next_plan)

    def _pause(self, process: _Process, running: Trial, finished: list[TrialResult]) -> bool:
        """After an early stop, pause the process rather than kill it: a plan without trials,
        which it takes at the end of the running trial's current step, dropping that trial.
        Whether it did: the pause waits for its ``done``, so a failure in that step (the
        process then exits) ends it here and cannot be taken for the next plan's. Not while
        that step compiles new graphs, which can take longer than a start-up."""
        last = finished[-1].trial.knobs if finished else None
        if not process.reusable() or running.knobs.compile_mode and (
                last is None or running.knobs.without_loader() != last.without_loader()):
            return False
        dropped = process.files[0]
        self._hand_over(process, [])
        waited = time.monotonic()
        while not any(e.get("event") == protocol.EVENT_DONE for e in process.new_events()):
            if (process.popen.poll() is not None or self.time_left() <= 0
                    or time.monotonic() - waited > self._trial_timeout(running)):
                return False
            self._beat()
            time.sleep(POLL_S)
        if any(e.get("event") == "trial_start" and e.get("id") == running.id
               for e in dropped.new_events()):
            process.trial_started(running.knobs)
        return True

    def _beat(self) -> None:
        now = time.monotonic()
        if now - self._last_beat >= BEAT_S:
            self._last_beat = now
            self._owned.beat()

    def _start(self, trials: list[Trial]) -> _Process:
        self.processes_started += 1
        n = self.processes_started
        plan_path, files, next_plan = self._write_plan(trials)
        stderr = self._workdir / f"stderr-{n}.txt"
        scratch = trial_tmpdir(self._workdir)  # removed with the work directory
        marker = f"{self._run_marker}-{n}-{secrets.token_hex(8)}"
        journal = self._workdir / f"writes-{n}.jsonl"
        if self._snapshot is None:  # before the first trial: what the user's folders hold
            self._snapshot = FolderSnapshot.take(named_folders(self.script, self.args),
                                                 self._workdir / SNAPSHOT_DIR, (self._workdir,))
            self._sentinel = Sentinel(self._workdir, f"{self._run_marker}-")
        python_path = [str(SITE_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]
        env = {**os.environ, protocol.ENV_PROBE: str(plan_path),
               ENV_OBSERVERS: protocol.OBSERVER, protocol.ENV_MARKER: marker,
               **(dict.fromkeys(("TMPDIR", "TEMP", "TMP"), str(scratch)) if scratch else {}),
               # what the script writes during trials is journaled and put back
               ENV_JOURNAL: str(journal), "PYTHONPATH": os.pathsep.join(python_path),
               write_guard.ENV_SCRIPT_DIR: str(self.script.resolve().parent),
               **write_guard.environment(self._workdir)}
        with stderr.open("wb") as err:
            popen = subprocess.Popen(
                [*self._launcher(), str(self.script), *self.args],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                env=env, start_new_session=True,
            )
        process = _Process(popen, files, stderr, time.monotonic(), next_plan, marker, journal,
                           snapshot=self._snapshot)
        self._started.append(process)
        return process

    def _launcher(self) -> list[str]:
        """The interpreter, or torchrun with the local ranks on a free port of this host,
        started through :data:`DIE_WITH_PARENT`."""
        launcher = [sys.executable, "-c", DIE_WITH_PARENT, str(os.getpid()), sys.executable]
        if self.nproc_per_node == 1:
            return launcher
        return [*launcher, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={self.nproc_per_node}"]

    def _retry_fresh(self, result: TrialResult, process: _Process) -> bool:
        """Whether a failure may be the earlier trial's doing: it came right after a change
        of AMP dtype or compile mode in the same process, where state the script keeps
        (a carried RNN state in the old dtype, a compiled graph) leaks into the next trial.
        Such a trial runs once more, first in a fresh process, before its failure counts."""
        previous, knobs = process.previous_knobs, result.trial.knobs
        if result.status not in (ERROR, NONFINITE, CRASH) or previous is None:
            return False
        switched = (previous.amp_dtype, previous.compile_mode) != (knobs.amp_dtype,
                                                                   knobs.compile_mode)
        if not switched or result.trial.id in self._retried:
            return False
        self._retried.add(result.trial.id)
        return True

    def _trial_timeout(self, trial: Trial) -> float:
        return self.timeout(trial) if callable(self.timeout) else self.timeout

    def _run_process(self, pending: list[Trial], stop: Callable[[TrialResult], bool] | None
                     ) -> tuple[list[TrialResult], bool]:
        """One child process over ``pending``: the live one when there is one, else a new
        one; returns (finished results, early-stopped). A process that finished the plan, or
        was paused after an early stop, is kept for the next plan; any other is killed."""
        by_id = {t.id: t for t in pending}
        continued = self._continue(pending)
        process = self._process = continued or self._start(pending)
        finished: list[TrialResult] = []
        current: Trial | None = None
        begun = False  # a trial of this plan started
        keep = False
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
                        process.said_hello = True
                        process.waits = event.get("waits_for_next_plan") is True
                        if self.facts is None:
                            self.facts = ScriptFacts.from_hello(event)
                    elif kind == "trial_start" and event.get("id") in by_id:
                        current = by_id[event["id"]]
                        process.trial_started(current.knobs)
                        begun = True
                        if self.startup_s is None:
                            self.startup_s = last_event - process.started
                        if self.on_trial_start:
                            self.on_trial_start(current)
                    elif kind == "exit":
                        script_ended = event.get("reason") == "script-ended"
                        exit_message = str(event.get("message") or "")
                    elif kind == "trial_end" and event.get("id") in by_id:
                        result = TrialResult.from_event(by_id[event["id"]], event)
                        if self._retry_fresh(result, process):
                            return finished, False
                        finished.append(result)
                        current = None
                        if self.on_trial_end:
                            self.on_trial_end(result)
                        if stop is not None and stop(result) and len(finished) < len(pending):
                            keep = self._pause(process, pending[len(finished)], finished)
                            return finished, True
                    elif kind == protocol.EVENT_DONE and process.reusable():
                        keep = True
                        return finished, False
                if exited:
                    break
                now = time.monotonic()
                failure = self._watchdog(process, current, pending, finished,
                                         now - last_event, now - last_memory_check)
                if now - last_memory_check >= MEMORY_POLL_S:
                    last_memory_check = now
                if failure is not None:
                    process.kill()
                    if not process.said_hello and self.facts is None and failure.status == HANG:
                        raise ScriptError(self._slow_start_message())
                    return finished + [failure], False
                self._beat()
                time.sleep(POLL_S)
            if continued and not begun:
                return [], False  # it died while it waited: the plan goes to a fresh process
            if not process.said_hello:
                if self.facts is None:
                    raise ScriptError(self._never_started_message(process, exit_message))
                return [self._crash(pending[0], process, exit_message)], False
            unfinished = current is not None and all(r.trial.id != current.id for r in finished)
            if unfinished and not script_ended:
                crash = self._crash(current, process, exit_message)
                if not self._retry_fresh(crash, process):
                    finished.append(crash)
            self._name_first_failure(finished, process)
            return finished, False
        finally:
            if not keep:
                process.kill()
                self._process = None

    def _watchdog(self, process: _Process, current: Trial | None, pending: list[Trial],
                  finished: list[TrialResult], quiet_s: float, since_memory_check: float
                  ) -> TrialResult | None:
        """A result for the trial to abandon (hang, memory cap, budget), or ``None``."""
        done_ids = {r.trial.id for r in finished}
        due = current or next((t for t in pending if t.id not in done_ids), None)
        if due is None:
            return None
        if self.time_left() <= 0:
            if process.said_hello:
                return TrialResult(due, BUDGET, message="budget exhausted during the trial")
            return TrialResult(due, BUDGET, message=(
                f"budget exhausted during start-up: no training step "
                f"{time.monotonic() - process.started:.0f} s after the script started"))
        limit = self._trial_timeout(due) if process.said_hello else self.startup_timeout
        if quiet_s > limit:
            where = "the trial" if process.said_hello else "start-up (no hello)"
            return TrialResult(due, HANG, message=f"no progress in {limit:.0f} s during {where}; "
                                                  "process group killed")
        if self.max_memory_bytes and since_memory_check >= MEMORY_POLL_S:
            used = process_tree_memory(process.popen.pid, above=self.max_memory_bytes)
            if used > self.max_memory_bytes:
                cap = self.max_memory_bytes / 2**30
                return TrialResult(due, OOM, message=f"host memory {used / 2**30:.2f} GiB above "
                                                     f"--max-memory {cap:.2f} GiB")
        return None

    def _name_first_failure(self, finished: list[TrialResult], process: _Process) -> None:
        """Under torchrun one rank's failure fails the others (a peer gone, a SIGTERM from
        the agent): when a rank died without a word (a signal, an exit outside Python), the
        record names it and how."""
        last = finished[-1] if finished else None
        if process.ranks is None or last is None or last.status not in (ERROR, CRASH,
                                                                         NONFINITE, OOM):
            return
        cause = died_silently(process.stderr_text(), process.ranks.failed)
        if cause is None:
            return
        rank, how = cause
        last.message = (f"rank {rank} died ({how})" if last.status == CRASH
                        else f"rank {rank} failed first ({how}); {last.message}")

    def _crash(self, trial: Trial, process: _Process, reason: str = "") -> TrialResult:
        tail = reason or last_line(process.stderr_tail())
        message = f"process died ({process.exit_description()})" + (f": {tail}" if tail else "")
        return TrialResult(trial, CRASH, message=message)

    def _never_started_message(self, process: _Process, why: str = "") -> str:
        """The script ended before its first training step: what the child saw missing
        (``why``), or, without a word from it, that neither wrapper was called; and its own
        failure, when it failed."""
        failed = process.popen.returncode != 0
        if why and failed:  # an exception before training: the child's one line of it
            message = f"{self.script.name} failed before its first training step: {why}"
        elif why:
            message = f"{self.script.name}: {why} — see docs/autotune.md"
        elif failed:
            message = (f"{self.script.name} failed ({process.exit_description()}) and never "
                       f"called tuned_loop or tuned_loader ({TRAINERS}): fix that first")
        else:
            message = (f"{self.script.name} never called tuned_loop or tuned_loader ({TRAINERS})"
                       " — see docs/autotune.md")
        tail = process.stderr_tail()
        if failed and tail:
            indented = "\n".join("  " + line for line in tail.splitlines())
            message += f"\nits own output ({process.exit_description()}):\n{indented}"
        return message

    def _slow_start_message(self) -> str:
        """No training step within the start-up timeout: the script is slow to start
        (imports, data) or stuck before its loop, which says nothing of the wrappers."""
        return (f"{self.script.name} reached no training step within {self.startup_timeout:.0f}"
                " s of starting: it is stuck before its training loop, or its start-up "
                "(imports, building its data) takes longer than that; check that it trains "
                "when run on its own")


def process_tree_memory(pid: int, above: int = 0) -> int:
    """Memory a process and its children hold together, in bytes (0 when it is gone).

    Each member counts its proportional set size: a page shared by n processes counts 1/n
    in each. DataLoader workers are forked from the script and share its pages (torch's
    libraries, the dataset) until they write them; summed resident sizes counted those pages
    once a worker, and two workers of a 0.7 GiB script read 2.1 GiB. The proportional size
    walks every mapping, so it is only read when the resident sizes add up to more than
    ``above`` (it is never larger); the resident size where the system does not report it
    (outside Linux)."""
    import psutil

    try:
        root = psutil.Process(pid)
        members = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    resident = sum(_member_memory(member, proportional=False) for member in members)
    if resident <= above:
        return resident
    return sum(_member_memory(member, proportional=True) for member in members)


def _member_memory(process: psutil.Process, proportional: bool) -> int:
    """One process's proportional set size, or resident size; 0 once it is gone."""
    import psutil

    try:
        if proportional:
            try:
                return process.memory_full_info().pss
            except (AttributeError, psutil.AccessDenied):  # no pss on this system
                pass
        return process.memory_info().rss
    except psutil.Error:
        return 0
