"""The parent <-> child contract of ``tuneup autotune``, in one torch-free module.

Both sides import these names: the parent (runner, search) writes plans and reads events,
the child (``child.py``, inside the user's script) reads plans and writes events. The
details and every field are in docs/probe-protocol.md.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROTOCOL = 1
ENV_PROBE = "TUNEUP_PROBE"  # the plan's path, set for the child
ENV_RANK = "RANK"  # set by torchrun: which rank of a multi-process trial this child is
OBSERVER = "tuneup.autotune.child:install"  # named in TUNEUP_OBSERVERS for the child
# set for each trial process, inherited by everything it starts: the parent ends every
# process carrying its value with the trial process, detached ones included
ENV_MARKER = "TUNEUP_AUTOTUNE_PROCESS"

# Exit codes of the child process.
EXIT_DONE, EXIT_BAD_PLAN, EXIT_TRIAL_FAILED = 0, 2, 3

# Events, one JSON object per line in the results file.
EVENT_HELLO, EVENT_TRIAL_START, EVENT_TRIAL_END = "hello", "trial_start", "trial_end"
EVENT_EXIT, EVENT_DONE = "exit", "done"

# How a trial ends. The first four come from the child, the rest from the parent.
OK, OOM, ERROR, NONFINITE = "ok", "oom", "error", "nonfinite"
CRASH, HANG, BUDGET, SKIPPED = "crash", "hang", "budget", "skipped"
# an ERROR's message from the parent when the script's loop keeps ending before a trial can
SCRIPT_TOO_SHORT = ("the script's loop ended before a trial finished twice in a row: give it "
                    "more steps through SCRIPT_ARGS")

@dataclass
class Plan:
    """What the child runs: where to write, the measuring window, the trials.

    The window's defaults are the ones the parent uses; a plan may set each.
    """

    results: Path
    trials: list[dict[str, Any]]
    warmup_steps: int = 2
    measure_steps: int = 9
    min_measure_seconds: float = 1.5
    max_measure_steps: int = 60
    check_steps: int = 3
    reference: Path | None = None  # prefix of the reference files; default beside results
    parent_pid: int | None = None  # the child ends when its parent is gone
    ranks: int = 1  # local ranks under torchrun; 1: one process, whatever RANK says
    # where the parent writes this process's next plan: after its last trial the child waits
    # for that file instead of exiting, and a file there before then ends this plan at the
    # next step (one with no trials pauses: the child waits for the file its plan names)
    next_plan: Path | None = None

    @property
    def waits_for_next_plan(self) -> bool:
        """Whether the child waits for ``next_plan`` after its last trial: only a single
        process (torchrun's ranks would have to switch plans at the same step)."""
        return self.next_plan is not None and self.ranks == 1

    def reference_paths(self, rank: int = 0) -> tuple[Path, Path]:
        """(state file, check-batches file) shared by every process of one run; each rank
        of a torchrun trial has its own (its share of the data)."""
        base = self.reference or self.results.with_name(self.results.name + ".reference.pt")
        base = for_rank(base, rank)
        return base, base.with_name(base.name + ".batches")

    def to_json(self) -> str:
        data = {"protocol": PROTOCOL, "results": str(self.results), "trials": self.trials,
                **{name: getattr(self, name) for name in WINDOW_KEYS},
                "parent_pid": self.parent_pid, "ranks": self.ranks}
        if self.reference is not None:
            data["reference"] = str(self.reference)
        if self.next_plan is not None:
            data["next_plan"] = str(self.next_plan)
        return json.dumps(data, indent=1)


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs: the child's test of its parent at every step (one
    syscall), the parent's of the owners of stale work directories."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it runs, as another user
    return True


def for_rank(path: Path, rank: int) -> Path:
    """The file of ``rank`` in a trial under torchrun: rank 0's is ``path`` itself, so a
    single-process trial writes where it always did; rank R's is ``path.rankR``."""
    return path if rank == 0 else path.with_name(f"{path.name}.rank{rank}")


def rank_of(environ: Mapping[str, str]) -> int:
    """This process's rank as torchrun set it (0 outside torchrun or when unreadable)."""
    try:
        return max(0, int(environ.get(ENV_RANK, "0")))
    except ValueError:
        return 0


WINDOW_KEYS = ("warmup_steps", "measure_steps", "min_measure_seconds", "max_measure_steps",
               "check_steps")
WINDOW_DEFAULTS = {name: Plan.__dataclass_fields__[name].default for name in WINDOW_KEYS}


def read_plan(path: Path) -> Plan:
    """Parse and check a plan file; raises ``ValueError`` (or ``OSError``) naming the problem."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError("a plan is a JSON object")
    if data.get("protocol") != PROTOCOL:
        raise ValueError(f"protocol {data.get('protocol')!r} is not {PROTOCOL}")
    trials = data.get("trials")
    if not isinstance(trials, list) or not all(
            isinstance(t, dict) and isinstance(t.get("id"), str) for t in trials):
        raise ValueError("'trials' must be a list of objects with a string 'id'")
    if not isinstance(data.get("results"), str):
        raise ValueError("'results' must be a path")
    parent, ranks = data.get("parent_pid"), data.get("ranks", 1)
    return Plan(
        results=Path(data["results"]), trials=trials,
        warmup_steps=max(1, int(data.get("warmup_steps", WINDOW_DEFAULTS["warmup_steps"]))),
        measure_steps=max(1, int(data.get("measure_steps", WINDOW_DEFAULTS["measure_steps"]))),
        min_measure_seconds=float(data.get("min_measure_seconds",
                                           WINDOW_DEFAULTS["min_measure_seconds"])),
        max_measure_steps=max(1, int(data.get("max_measure_steps",
                                              WINDOW_DEFAULTS["max_measure_steps"]))),
        check_steps=max(0, int(data.get("check_steps", WINDOW_DEFAULTS["check_steps"]))),
        reference=Path(data["reference"]) if data.get("reference") else None,
        parent_pid=int(parent) if isinstance(parent, int) and not isinstance(parent, bool) else None,
        ranks=max(1, ranks) if isinstance(ranks, int) and not isinstance(ranks, bool) else 1,
        next_plan=Path(data["next_plan"]) if isinstance(data.get("next_plan"), str) else None,
    )
