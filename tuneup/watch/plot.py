"""``--plot PATH``: the run as a picture, from the summary's timeline — GPU utilisation and
the job's CPU above, the data wait below, the verdict in the title.

``PATH.png`` is drawn by matplotlib, an optional extra (``pip install 'tuneup[plot]'``),
imported only here and checked for by :func:`check` before the job starts, so a missing
library costs no run. ``PATH.html`` needs nothing: one self-contained file with an SVG drawn
here and the timeline itself as JSON.
"""

from __future__ import annotations

import html
import io
import json
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuneup.errors import UsageError
from tuneup.files import write_atomic

PNG_SIZE = (10.0, 6.0)  # inches, at PNG_DPI: 1000 x 600 pixels
PNG_DPI = 100
SVG_WIDTH, SVG_HEIGHT = 1000, 600
TITLE_WIDTH = 110  # characters a title line holds before it wraps


@dataclass(frozen=True)
class Series:
    """One line of the picture: ``points`` are (t, value) where the value is known."""

    key: str  # the timeline's field
    label: str
    color: str
    panel: int  # 0: utilisation and CPU, 1: data wait
    points: tuple[tuple[float, float], ...]


LINES = (  # (timeline field, label, colour, panel, scale to %)
    ("gpu_utilization", "GPU utilisation %", "#2ca02c", 0, 1.0),
    ("job_cpu_percent", "job CPU, % of one core", "#1f77b4", 0, 1.0),
    ("data_wait_share", "data wait % (runtime feed)", "#d62728", 1, 100.0),
    ("loading_share", "in the DataLoader % (py-spy stacks)", "#ff7f0e", 1, 100.0),
)
PANELS = ("GPU and CPU (%)", "data wait (% of the loop)")


def check(path: Path) -> None:
    """Before the job starts: a format this writes, and matplotlib when it is a PNG."""
    suffix = path.suffix.lower()
    if suffix not in (".png", ".html"):
        raise UsageError(f"--plot writes PATH.png or PATH.html (got {path.name})")
    if suffix != ".png":
        return
    try:
        import matplotlib.figure  # noqa: F401 (a broken install fails now, not after the job)
    except ImportError as exc:
        raise UsageError(f"--plot PATH.png needs a working matplotlib ({exc}): pip install "
                         "'tuneup[plot]' (PATH.html needs nothing)") from None


def series(timeline: Sequence[dict[str, Any]]) -> list[Series]:
    """The lines with at least one known point (no GPU, no GPU line)."""
    lines = []
    for key, label, color, panel, scale in LINES:
        points = tuple((float(p["t"]), float(p[key]) * scale) for p in timeline
                       if p.get(key) is not None)
        if points:
            lines.append(Series(key, label, color, panel, points))
    return lines


def title(summary: dict[str, Any]) -> str:
    what = " ".join(summary["command"]) if summary["command"] else f"pid {summary['pid']}"
    verdict = summary["verdict"]
    said = f"{verdict['kind']}: {verdict['reason']}" if verdict else "no verdict"
    return f"tuneup watch: {what}\n{said}"


def write(summary: dict[str, Any], path: Path) -> None:
    """The picture of ``summary`` into ``path`` (PNG or HTML, by its suffix)."""
    if path.suffix.lower() == ".png":
        _write_png(summary, path)
    else:
        write_atomic(path, html_page(summary))


def _write_png(summary: dict[str, Any], path: Path) -> None:
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    figure = Figure(figsize=PNG_SIZE, dpi=PNG_DPI, layout="constrained")
    top, bottom = figure.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    lines = series(summary["timeline"])
    for axes, panel in ((top, 0), (bottom, 1)):
        drawn = [s for s in lines if s.panel == panel]
        for line in drawn:
            t, values = zip(*line.points)
            axes.plot(t, values, color=line.color, label=line.label, markersize=3,
                      marker="o" if len(line.points) < len(summary["timeline"]) / 3 else None,
                      drawstyle="steps-pre" if panel == 1 else "default")  # since the point before
        axes.set_ylabel(PANELS[panel])
        axes.set_ylim(0, _top(drawn))
        axes.grid(alpha=0.3)
        if drawn:
            axes.legend(loc="best", fontsize="small")
        missing = _missing(panel, drawn)
        if missing:
            axes.text(0.99, 0.95, missing, ha="right", va="top", transform=axes.transAxes,
                      color="grey", fontsize="small")
    bottom.set_xlabel("seconds since watching began")
    figure.suptitle("\n".join(textwrap.fill(line, TITLE_WIDTH) for line in
                              title(summary).splitlines()), fontsize="medium")
    image = io.BytesIO()
    figure.savefig(image, format="png")
    write_atomic(path, image.getvalue())


def _top(lines: Sequence[Series]) -> float:
    """The panel's height: 100 %, or more for a job using several cores."""
    highest = max((value for line in lines for _, value in line.points), default=0.0)
    return max(100.0, highest) * 1.05


def _missing(panel: int, drawn: Sequence[Series]) -> str:
    """What the panel lacks, said on it: an empty line is not a zero."""
    keys = {line.key for line in drawn}
    if panel == 0:
        return "" if "gpu_utilization" in keys else "no GPU figures"
    return "" if keys else "no data-wait figures: no runtime feed and no py-spy stacks"


def html_page(summary: dict[str, Any]) -> str:
    """One self-contained page: the title, the SVG, the timeline as JSON."""
    heading, verdict = title(summary).split("\n", 1)
    data = json.dumps(summary["timeline"]).replace("</", "<\\/")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\">"
        f"<title>{html.escape(heading)}</title>\n"
        "<style>body{font-family:sans-serif;margin:1em 2em}h1{font-size:1.1em}"
        "p{margin:.3em 0}</style></head>\n<body>\n"
        f"<h1>{html.escape(heading)}</h1>\n<p><b>{html.escape(verdict)}</b></p>\n"
        f"{svg(summary['timeline'])}\n"
        f"<script type=\"application/json\" id=\"timeline\">{data}</script>\n"
        "</body>\n</html>\n")


def svg(timeline: Sequence[dict[str, Any]]) -> str:
    """Both panels as one inline SVG: axes, grid, a polyline per series, a legend."""
    left, right = 70, SVG_WIDTH - 20
    panels = ((30, 290), (370, 180))  # (top, height) of each panel; its legend above it
    lines = series(timeline)
    times = [float(p["t"]) for p in timeline] or [0.0]
    t0, span = min(times), (max(times) - min(times)) or 1.0

    def x(t: float) -> float:
        return left + (t - t0) / span * (right - left)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{SVG_WIDTH}" '
             f'height="{SVG_HEIGHT}" viewBox="0 0 {SVG_WIDTH} {SVG_HEIGHT}" '
             'font-family="sans-serif" font-size="12">']
    for panel, (top, height) in enumerate(panels):
        drawn = [s for s in lines if s.panel == panel]
        ceiling = _top(drawn)
        for tick in _ticks(ceiling / 1.05):
            level = top + height * (1 - tick / ceiling)
            parts.append(f'<line x1="{left}" x2="{right}" y1="{level:.1f}" y2="{level:.1f}" '
                         f'stroke="#ddd"/><text x="{left - 6}" y="{level + 4:.1f}" '
                         f'text-anchor="end">{tick:g}</text>')
        parts.append(f'<rect x="{left}" y="{top}" width="{right - left}" height="{height}" '
                     'fill="none" stroke="#888"/>'
                     f'<text transform="translate(16,{top + height / 2}) rotate(-90)" '
                     f'text-anchor="middle">{html.escape(PANELS[panel])}</text>')
        for row, line in enumerate(drawn):
            shown = _steps(line.points) if panel == 1 else line.points
            points = " ".join(f"{x(t):.1f},{top + height * (1 - v / ceiling):.1f}"
                              for t, v in shown)
            parts.append(f'<polyline data-series="{line.key}" fill="none" '
                         f'stroke="{line.color}" stroke-width="1.5" points="{points}"/>'
                         f'<rect x="{left + row * 300}" y="{top - 12}" width="14" height="3" '
                         f'fill="{line.color}"/><text x="{left + 20 + row * 300}" '
                         f'y="{top - 7}">{html.escape(line.label)}</text>')
        missing = _missing(panel, drawn)
        if missing:
            parts.append(f'<text x="{right}" y="{top - 7}" text-anchor="end" '
                         f'fill="grey">{missing}</text>')
    bottom = panels[1][0] + panels[1][1]
    for tick in _ticks(span, start=t0):
        parts.append(f'<text x="{x(tick):.1f}" y="{bottom + 16}" text-anchor="middle">'
                     f'{tick:g}</text>')
    parts.append(f'<text x="{(left + right) / 2}" y="{bottom + 34}" text-anchor="middle">'
                 'seconds since watching began</text></svg>')
    return "\n".join(parts)


def _steps(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """A share measured since the point before holds over that span (matplotlib's
    ``steps-pre``)."""
    stepped = list(points[:1])
    for (before, _), (t, value) in zip(points, points[1:]):
        stepped += [(before, value), (t, value)]
    return stepped


def _ticks(span: float, start: float = 0.0) -> list[float]:
    """About five round steps over ``span`` from ``start``."""
    raw = span / 5 or 1.0
    step = next(s * 10 ** e for e in range(-2, 7) for s in (1, 2, 2.5, 5) if s * 10 ** e >= raw)
    first = -(-start // step) * step
    return [round(first + n * step, 6) for n in range(int((start + span - first) // step) + 1)]
