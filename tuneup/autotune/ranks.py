"""The events of a trial run under torchrun, one stream per rank, as one process's stream.

Every rank of a ``--nproc-per-node N`` trial runs the same plan in lockstep and writes its
own results file (``protocol.for_rank``). The runner reads them through :class:`RankEvents`,
which passes on what a single process would have written: the first ``hello``, each trial's
first ``trial_start``, one ``trial_end`` per trial — the first failure of any rank at once
(the others are stopped by torchrun, or hang and are killed: one record either way), or,
when every rank finished it, their results merged at the pace of the slowest rank — and one
``exit``: the first error, else the first rank's once all ranks said how they ended.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from typing import Any

from tuneup.autotune import protocol


class RankEvents:
    """Merges the event streams of ``ranks`` processes into one (rank 0's figures first)."""

    def __init__(self, ranks: int) -> None:
        self.ranks = ranks
        self.started: set[str] = set()
        self.ended: dict[str, dict[int, dict[str, Any]]] = {}  # trial id -> rank -> event
        self.reported: set[str] = set()
        self.failed: set[int] = set()  # ranks that recorded a failure of their own
        self.said_hello = False
        self.exits: dict[int, dict[str, Any]] = {}
        self.exit_passed = False

    def add(self, rank: int, event: dict[str, Any]) -> list[dict[str, Any]]:
        """The events to pass on now that ``rank`` wrote ``event`` (maybe none)."""
        kind = event.get("event")
        if kind == protocol.EVENT_HELLO:  # the ranks' hellos differ in their pid only
            if self.said_hello:
                return []
            self.said_hello = True
            return [event]
        if kind == protocol.EVENT_TRIAL_START:
            trial = str(event.get("id"))
            if trial in self.started:
                return []
            self.started.add(trial)
            return [event]
        if kind == protocol.EVENT_TRIAL_END:
            return self._trial_end(rank, event)
        if kind == protocol.EVENT_EXIT:
            return self._exit(rank, event)
        return [event]

    def _exit(self, rank: int, event: dict[str, Any]) -> list[dict[str, Any]]:
        if event.get("message") and rank:
            event = {**event, "message": f"rank {rank}: {event['message']}"}
        self.exits[rank] = event
        error = event.get("reason") == "error"
        if error:
            self.failed.add(rank)
        if self.exit_passed or not (error or len(self.exits) == self.ranks):
            return []
        self.exit_passed = True
        return [event if error else self.exits[min(self.exits)]]

    def _trial_end(self, rank: int, event: dict[str, Any]) -> list[dict[str, Any]]:
        trial = str(event.get("id"))
        if event.get("status") != protocol.OK:
            self.failed.add(rank)
        if trial in self.reported:
            return []
        if event.get("status") != protocol.OK:
            self.reported.add(trial)
            message = str(event.get("message") or "")
            return [{**event, "message": f"rank {rank}: {message}" if message else f"rank {rank}"}]
        ends = self.ended.setdefault(trial, {})
        ends[rank] = event
        if len(ends) < self.ranks:
            return []
        self.reported.add(trial)
        return [merged([ends[r] for r in sorted(ends)])]


def merged(ends: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One ``trial_end`` from every rank's (rank 0 first). The ranks step together, so the
    job goes at the slowest one's pace: each step takes the longest of the ranks' times for
    it, and the job's samples per second are all ranks' samples per step over the mean of
    those times. Check losses and the applied micro-batch are rank 0's (DDP averages the
    gradients, so a loss check on one rank sees every rank's)."""
    first = ends[0]
    columns = [e.get("step_s_all") or [] for e in ends]
    slowest = [max(c[i] for c in columns) for i in range(min(len(c) for c in columns))]
    step_s = (sum(slowest) / len(slowest) if slowest
              else _largest(e.get("step_s") for e in ends))
    per_step = [e["samples_per_s"] * e["step_s"] for e in ends
                if _number(e.get("samples_per_s")) and _number(e.get("step_s"))]
    return {
        **first,
        "step_s": step_s,
        "samples_per_s": (sum(per_step) / step_s if step_s and len(per_step) == len(ends)
                          else None),
        "step_s_all": slowest,
        "data_wait_share": _largest(e.get("data_wait_share") for e in ends),
        "warmup_s": _largest(e.get("warmup_s") for e in ends),
        "peak_memory_bytes": _largest(e.get("peak_memory_bytes") for e in ends),
        "ranks": len(ends),
    }


def _largest(values: Any) -> Any:
    numbers = [v for v in values if _number(v)]
    return max(numbers) if numbers else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def died_silently(stderr: str, failed: set[int]) -> tuple[int, str] | None:
    """(rank, how it ended) of a rank that died without recording why (a signal, an exit
    outside Python), read from the failures torchrun reports on stderr — its root cause
    first. Ranks in ``failed`` recorded their own failure; SIGTERM is the agent stopping the
    others once one failed."""
    _, found, report = stderr.rpartition("Failures:")
    if not found:
        return None
    others, _, first = report.partition("Root Cause")
    ended = []
    for block in (first, others):
        for rank, code, name in re.findall(
                r"^\s*rank\s*:\s*(\d+)[^\n]*\n(?:[^\n]*\n)*?\s*exitcode\s*:\s*(-?\d+)"
                r"[^\n]*?(?:\((SIG\w+)\))?[ \t]*$", block, re.MULTILINE):
            ended.append((int(rank), int(code), name))
    for rank, code, name in ended:
        if rank not in failed and code != -signal.SIGTERM:
            return rank, f"exit code {code}" + (f" ({name})" if name else "")
    return None
