"""What the watcher shows while the job runs.

On a terminal, a status block pinned to its last lines: the lines above become the
terminal's scrolling region (the way apt pins its progress bar), so the job's own output,
written straight to the same terminal, scrolls above the block and is never redrawn or
garbled. Elsewhere, one plain line (or one JSON object) per sample.
"""

from __future__ import annotations

import io
import json
import os
from typing import TextIO

from rich.console import Console
from rich.text import Text

from tuneup.machine.snapshot import printable
from tuneup.watch.samples import CHILD, MAIN, WORKER, Sample
from tuneup.watch.verdict import Figures, Verdict, ceiling_line

MAX_GPUS = 8  # GPU lines in the live block; more GPUs are summed up in one line
BAR = 20


def block_height(gpus: int) -> int:
    """Lines of the live block for ``gpus`` GPUs: theirs, CPU, loop, verdict."""
    return min(gpus, MAX_GPUS) + (gpus > MAX_GPUS) + 3


def _percent(value: float | None) -> str:
    return f"{value:3.0f} %" if value is not None else "  ? %"


def _share(value: float | None) -> str:
    return f"{value:.0%}" if value is not None else "?"


def _gib(value: int | None) -> str:
    return f"{value / 2**30:.1f}" if value is not None else "?"


def bar(percent: float | None, width: int = BAR) -> Text:
    filled = round(min(max(percent or 0.0, 0.0), 100.0) / 100 * width)
    style = "green" if (percent or 0) >= 90 else "yellow" if (percent or 0) >= 50 else "red"
    return Text("█" * filled, style=style) + Text("░" * (width - filled), style="dim")


def cpu_split(sample: Sample) -> str:
    """The job's CPU by process: the training process(es), the workers, the rest."""
    mains = [p for p in sample.processes if p.role == MAIN and p.cpu_percent is not None]
    workers = [p for p in sample.processes if p.role == WORKER]
    children = sum(p.role == CHILD for p in sample.processes)
    busiest = max(mains, key=lambda p: p.cpu_percent, default=None)
    text = f"main {_percent(busiest.cpu_percent if busiest else None).strip()}"
    if len(sample.runtime) > 1:
        text += f" · {len(sample.runtime)} trainer processes"
    if children:
        text += f" · {children} child process{'es' if children > 1 else ''} (role not yet known)"
    if workers:
        each = [p.cpu_percent for p in workers if p.cpu_percent is not None]
        mean = sum(each) / len(each) if each else None
        text += f" · {len(workers)} workers {_percent(mean).strip()} each"
    else:
        text += " · no DataLoader workers"
    rss = sum(p.rss for p in sample.processes)
    return text + f" · {sum(p.threads for p in sample.processes)} threads · RSS {_gib(rss)} GiB"


def status_lines(sample: Sample, figures: Figures | None, verdict: Verdict | None) -> list[Text]:
    """The live block: one line per GPU, the CPU split, the loop's figures, the verdict."""
    lines = []
    for gpu in sample.gpus[:MAX_GPUS]:
        memory = f"{_gib(gpu.memory_used)}/{_gib(gpu.memory_total)} GiB"
        line = Text(f"GPU{gpu.index} ") + bar(gpu.utilization) + Text(
            f" {_percent(gpu.utilization)}"
            + (f"  SM {gpu.sm_activity:.0f} %" if gpu.sm_activity is not None else "")
            + f"  mem {memory}"
            + (f"  {gpu.power_w:.0f}/{gpu.power_limit_w:.0f} W"
               if gpu.power_w is not None and gpu.power_limit_w else "")
            + (f"  {gpu.sm_clock_mhz:.0f}/{gpu.sm_clock_max_mhz:.0f} MHz"
               if gpu.sm_clock_mhz is not None and gpu.sm_clock_max_mhz else "")
            + (f"  {gpu.temperature_c:.0f} °C" if gpu.temperature_c is not None else ""))
        lines.append(line)
    if len(sample.gpus) > MAX_GPUS:
        lines.append(Text(f"… and {len(sample.gpus) - MAX_GPUS} more GPUs", style="dim"))
    host = sample.host
    lines.append(Text(f"CPU  {cpu_split(sample)} · machine {_percent(host.cpu_percent).strip()}"
                      f", iowait {_percent(host.iowait_percent).strip()}"))
    lines.append(Text(loop_line(figures)))
    if verdict is None:
        lines.append(Text("verdict: sampling…", style="dim"))
    else:
        line = Text(verdict.kind, style="bold") + Text(f": {printable(verdict.reason)}")
        ceiling = verdict.ceiling
        if ceiling is not None and ceiling.speedup_at_most is not None:
            line += Text(f" · {ceiling_line(ceiling.to_dict())}", style="dim")
        lines.append(line)
    return lines


def loop_line(figures: Figures | None) -> str:
    if (figures is not None and figures.data_wait_share is None
            and figures.loading_share is not None):
        return (f"loop in the DataLoader {_share(figures.loading_share)} of the time "
                "(py-spy stacks; no runtime feed)")
    if figures is None or figures.data_wait_share is None:
        return ("loop no runtime feed (no DataLoader iterated yet, or the job was not started by "
                "`tuneup watch -- ...`)")
    text = (f"loop data wait {_share(figures.data_wait_share)} · copies "
            f"{_share(figures.copy_share)} · {figures.samples_per_s or 0:.0f} samples/s")
    if figures.runtime is not None:
        text += f" · num_workers {figures.runtime.num_workers}"
        if figures.runtime.trainer:
            text += f" · {figures.runtime.trainer} Trainer"
    return text


def plain_line(sample: Sample, figures: Figures | None, verdict: Verdict | None) -> str:
    """One line per sample, for logs and pipes."""
    gpus = " ".join(f"gpu{g.index} {_percent(g.utilization).strip()}" for g in sample.gpus)
    parts = [f"[{sample.t:6.1f}s]", gpus or "no gpu", cpu_split(sample)]
    if figures is not None and figures.data_wait_share is not None:
        parts.append(f"data wait {_share(figures.data_wait_share)}, "
                     f"{figures.samples_per_s or 0:.0f} samples/s")
    elif figures is not None and figures.loading_share is not None:
        parts.append(f"in DataLoader {_share(figures.loading_share)} (py-spy)")
    parts.append(_kind(verdict))
    return " | ".join(parts)


def _kind(verdict: Verdict | None) -> str:
    """The verdict's kind, marked when it rests on process CPU alone (a guess, say so)."""
    if verdict is None:
        return "sampling"
    basis = verdict.evidence.get("basis")
    return f"{verdict.kind} ({basis})" if basis else verdict.kind


class PlainView:
    """A line (text or JSON) per sample on ``stream``."""

    def __init__(self, stream: TextIO, as_json: bool) -> None:
        self.stream = stream
        self.as_json = as_json

    def __enter__(self) -> PlainView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stream.flush()

    def show(self, sample: Sample, figures: Figures | None, verdict: Verdict | None) -> None:
        if self.as_json:
            line = json.dumps({"sample": sample.to_dict(),
                               "verdict": verdict.to_dict() if verdict is not None else None})
        else:
            line = plain_line(sample, figures, verdict)
        self.stream.write(line + "\n")
        self.stream.flush()


class LiveView:
    """The status block pinned to the bottom lines of the terminal behind ``stream``."""

    def __init__(self, stream: TextIO, height: int) -> None:
        self.stream = stream
        self.fd = stream.fileno()
        self.height = height
        self.seen: os.terminal_size | None = None  # the terminal's size at the last look
        self.pinned: os.terminal_size | None = None  # the size the block is pinned for

    def _write(self, text: str) -> None:
        """One write: the job's output, written to the same terminal, never lands inside."""
        self.stream.flush()
        data = text.encode(self.stream.encoding or "utf-8", errors="replace")
        while data:
            data = data[os.write(self.fd, data):]

    def _pin(self) -> None:
        """Pin the block for the terminal's current size (not at all on a tiny terminal)."""
        self._unpin()
        self.seen = size = os.get_terminal_size(self.fd)
        rows = size.lines
        if rows <= self.height + 2:
            return
        # Make room, step back up, and confine scrolling to the lines above the block
        # (setting the region homes the cursor: save and restore it around).
        self._write("\n" * self.height + f"\x1b[{self.height}A\x1b7"
                    f"\x1b[1;{rows - self.height}r\x1b8")
        self.pinned = size

    def _unpin(self) -> None:
        if self.pinned is None:
            return
        rows, self.pinned = self.pinned.lines, None
        clear = "".join(f"\x1b[{row};1H\x1b[2K" for row in range(rows - self.height + 1, rows + 1))
        self._write(f"\x1b7\x1b[r\x1b8\x1b7{clear}\x1b8")

    def __enter__(self) -> LiveView:
        self._pin()
        return self

    def __exit__(self, *exc: object) -> None:
        self._unpin()

    def show(self, sample: Sample, figures: Figures | None, verdict: Verdict | None) -> None:
        if os.get_terminal_size(self.fd) != self.seen:  # resized: pin the block again
            self._pin()
        size = self.pinned
        if size is None:
            return
        lines = status_lines(sample, figures, verdict)[-self.height:]
        console = Console(file=io.StringIO(), force_terminal=True, width=size.columns,
                          color_system="standard", highlight=False)
        drawn = []
        for row, line in enumerate([*lines, *[Text()] * (self.height - len(lines))]):
            line.truncate(size.columns - 1, overflow="ellipsis")
            with console.capture() as capture:
                console.print(line, end="", no_wrap=True)
            drawn.append(f"\x1b[{size.lines - self.height + 1 + row};1H\x1b[2K{capture.get()}")
        self._write("\x1b7" + "".join(drawn) + "\x1b8")
