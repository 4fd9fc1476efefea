"""The end-of-job summary: the verdict over the training part of the run, the figures it
rests on, a timeline of utilisation and data wait, as JSON (``--summary``) and as text."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from tuneup.files import write_atomic
from tuneup.machine.snapshot import printable
from tuneup.watch.samples import WORKER, RuntimeSample, Sample
from tuneup.watch.verdict import Figures, ceiling_line, decide, reduce, rounded


def _steps(sample: Sample) -> int:
    return sum(r.steps for r in sample.runtime)


def _stepped(samples: Sequence[Sample], index: int) -> bool:
    """The runtime made steps since the sample before."""
    return _steps(samples[index]) > (_steps(samples[index - 1]) if index else 0)


def _holds_gpu(samples: Sequence[Sample], index: int) -> bool:
    return any(g.job_memory for g in samples[index].gpus)


def _has_workers(samples: Sequence[Sample], index: int) -> bool:
    return any(p.role == WORKER for p in samples[index].processes)


def _loads(samples: Sequence[Sample], index: int) -> bool:
    """py-spy saw the training thread in the DataLoader since the sample before."""
    stacks = samples[index].stacks
    return stacks is not None and stacks.loading > 0


def training_window(samples: Sequence[Sample]) -> Sequence[Sample]:
    """The samples while the job trained, so that imports, dataset building and tear-down
    do not weigh in the verdict: from the first to the last sample in which the runtime
    made steps; without a feed, in which the job held GPU memory; without a GPU either,
    in which DataLoader workers ran; without workers, in which py-spy saw the DataLoader.
    All of them when nothing marks training."""
    for marks in (_stepped, _holds_gpu, _has_workers, _loads):
        marked = [index for index in range(len(samples)) if marks(samples, index)]
        if marked:
            return samples[marked[0]:marked[-1] + 1]
    return samples


def timeline(samples: Sequence[Sample]) -> list[dict[str, Any]]:
    """Per sample: GPU utilisation, the job's CPU, and the data wait (the feed) and the share
    of stacks in the DataLoader (py-spy) since the sample before."""
    points = []
    previous: Sequence[RuntimeSample] = ()
    for sample in samples:
        figures = reduce([sample], runtime=(previous, sample.runtime))
        previous = sample.runtime
        points.append({"t": round(sample.t, 2), "gpu_utilization": figures.gpu_utilization,
                       "job_cpu_percent": rounded(figures.job_cpu),
                       "data_wait_share": rounded(figures.data_wait_share, 3),
                       "loading_share": rounded(figures.loading_share, 3)})
    return points


def _figures_dict(figures: Figures) -> dict[str, Any]:
    data = dataclasses.asdict(figures)
    return {key: round(value, 4) if isinstance(value, float) else value
            for key, value in data.items()}


def build(samples: Sequence[Sample], final: Sequence[RuntimeSample], *,
          command: Sequence[str] | None, pid: int, exit_status: int | None,
          duration_s: float, interval_s: float, notes: Sequence[str], script: str
          ) -> dict[str, Any]:
    """The summary; ``final`` = the feed's last counters (read after the job ended), which
    cover the whole run — or, when they are gone, the last ones a sample saw; the verdict
    has none (``null``) when no sample was taken."""
    if not final:
        final = next((s.runtime for s in reversed(samples) if s.runtime), ())
    window = training_window(samples)
    figures = reduce(window, runtime=((), final)) if window else None
    verdict = decide(figures, script) if figures is not None else None
    return {
        "command": list(command) if command is not None else None, "pid": pid,
        "exit_status": exit_status, "duration_s": round(duration_s, 2),
        "interval_s": interval_s, "samples": len(samples),
        "trainer": trainer(figures),
        "verdict": verdict.to_dict() if verdict is not None else None,
        "figures": _figures_dict(figures) if figures is not None else None,
        "notes": list(notes), "timeline": timeline(samples),
    }


def trainer(figures: Figures | None) -> str | None:
    """The trainer whose loop iterated the DataLoader ("transformers", "lightning"), as the
    plain-DataLoader probe saw it; ``None`` for a loop of the script's own, or no probe."""
    runtime = figures.runtime if figures is not None else None
    return runtime.trainer if runtime is not None else None


def _processes(figures: dict[str, Any]) -> str:
    """How the job's processes were read: several trainers (their feeds summed), DataLoader
    workers, children of unknown role; empty for one training process alone."""
    parts = []
    if figures.get("trainers", 0) > 1:
        parts.append(f"{figures['trainers']} trainer processes (their feeds summed)")
    if figures.get("workers"):
        parts.append(f"{figures['workers']} DataLoader workers")
    if figures.get("children"):
        many = "es" if figures["children"] > 1 else ""
        parts.append(f"{figures['children']} child process{many} of unknown role")
    return " · ".join(parts)


def write(summary: dict[str, Any], path: Path) -> None:
    """Atomically: a reader never sees half a summary."""
    write_atomic(path, json.dumps(summary, indent=2) + "\n")


def print_text(console: Console, summary: dict[str, Any]) -> None:
    what = (printable(" ".join(summary["command"]), one_line=True) if summary["command"]
            else f"pid {summary['pid']}")
    status = summary["exit_status"]
    # the watcher's readings, not training samples (those are in samples/s below)
    console.print(f"tuneup watch: {what}: {summary['duration_s']:.0f} s watched, "
                  f"{summary['samples']} readings"
                  + (f", exit status {status}" if status is not None else ""),
                  highlight=False, markup=False)
    rows = Table.grid(padding=(0, 1))
    rows.add_column(style="bold", no_wrap=True)
    rows.add_column()
    verdict = summary["verdict"]
    processes = summary.get("figures") and _processes(summary["figures"])
    if processes:
        rows.add_row("processes", Text(processes))
    if summary.get("trainer"):
        rows.add_row("trainer", Text(f"{summary['trainer']} (its DataLoader timed by the "
                                     "plain-DataLoader probe)"))
    if verdict is None:
        rows.add_row("verdict", Text("none: the job ended before the first sample"))
    else:
        evidence = " · ".join(f"{key} {value}" for key, value in verdict["evidence"].items()
                              if value is not None)
        rows.add_row("verdict", Text(f"{verdict['kind']}: "
                                     f"{printable(verdict['reason'], one_line=True)}"))
        if verdict.get("ceiling") is not None:
            rows.add_row("ceiling", Text(ceiling_line(verdict["ceiling"])))
        rows.add_row("evidence", Text(printable(evidence, one_line=True)))
        rows.add_row("action", Text(printable(verdict["action"], one_line=True)))
    for note in summary["notes"]:
        rows.add_row("note", Text(printable(note, one_line=True)))
    with console.capture() as capture:
        console.print(Padding(rows, (0, 0, 0, 2)))
    console.file.write("".join(line.rstrip() + "\n" for line in capture.get().splitlines()))
