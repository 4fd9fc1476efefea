"""Scripts that train in processes they spawn themselves (Hogwild: one ``mp.Process`` per
trainer, each with its own ``tuned_loop``): every trainer inherits the probe, and each ran
the plan, so every trial was measured once per trainer at different speeds ("38 trials"),
and each figure was one trainer's, not the job's.

autotune measures one process's loop, so such a script is refused with one line: the first
spawned trainer to create a loop claims the refusal (an exclusive file beside the plan's
results), writes it as the child's exit event and ends; every other trainer ends quietly,
and the script's own process, when it creates a loop or exits later, says nothing more.
torchrun's and ``accelerate launch``'s ranks are started as programs, not through
``multiprocessing``, and are not refused."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from tuneup.autotune import protocol

if TYPE_CHECKING:
    from tuneup.autotune.child import TrialSession

# multiprocessing's own helpers: a tracker is no trainer
HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def claim_path(plan: protocol.Plan) -> Path:
    return plan.results.with_name(plan.results.name + ".spawned")


def is_spawned_trainer() -> bool:
    """This process was started by the script through ``multiprocessing`` (fork, spawn or
    forkserver; ``torch.multiprocessing`` too) and trains: the hooks that call this run on
    a training loop's creation or its first step, which DataLoader workers never reach."""
    return multiprocessing.parent_process() is not None


def refuse(session: TrialSession) -> None:
    """End this spawned trainer; the first to get here writes the refusal for the job."""
    try:
        fd = os.open(claim_path(session.plan), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError:  # a sibling claimed it: its line is the job's
        session.finished = True
        os._exit(0)
    os.close(fd)
    session.emit({"event": protocol.EVENT_EXIT, "reason": "spawned-trainers",
                  "message": refusal(_trainers())})
    session.exit(0)


def refused_elsewhere(plan: protocol.Plan) -> bool:
    """A spawned trainer of this job refused it: this process has nothing to add."""
    return claim_path(plan).exists()


def refusal(trainers: int) -> str:
    """The one line the user reads."""
    count = f"{trainers} spawned processes" if trainers > 1 else "a spawned process"
    return (f"this script trains in {count} (multiprocessing), each with its own "
            "tuned_loop; tuneup autotune measures one process's training loop: tune a run "
            "that calls the training function in the script's own process (one trainer, "
            "no mp.Process), then every trainer reads the settings file it writes")


def _trainers() -> int:
    """The spawned processes beside this one (its parent's multiprocessing children,
    trackers aside): all the trainers, once the script has started them."""
    with contextlib.suppress(psutil.Error):
        parent = psutil.Process().parent()
        if parent is not None:
            return sum(1 for child in parent.children()
                       if not any(h in " ".join(_cmdline(child)) for h in HELPERS)) or 1
    return 1


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []
