"""``--plot``: the run's timeline drawn as a PNG (matplotlib) or a self-contained HTML page,
and the one-line error before the job starts when matplotlib is missing."""

from __future__ import annotations

import dataclasses
import json
import re
import struct
import sys
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner
from test_verdict import cpu_window
from watch_helpers import load, replay

from tuneup.cli import main
from tuneup.errors import EXIT_USAGE, UsageError
from tuneup.watch import plot, summary
from tuneup.watch.samples import StackCounts


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's signature and IHDR chunk."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def gpu_run() -> dict:
    """A recorded input-bound GPU run: utilisation, CPU and the feed's data wait."""
    samples = replay(load("input-bound"))
    return summary.build(samples, samples[-1].runtime, command=["python", "train.py"], pid=10,
                         exit_status=0, duration_s=5.0, interval_s=1.0, notes=[],
                         script="train.py")


def stacks_run() -> dict:
    """A CPU-only run without a feed, split by py-spy's stacks every other sample."""
    samples = [dataclasses.replace(s, stacks=StackCounts(70, 100) if n % 2 else None)
               for n, s in enumerate(cpu_window(99.0, [], ticks=8))]
    return summary.build(samples, (), command=["python", "</script>.py"], pid=10,
                         exit_status=0, duration_s=8.0, interval_s=1.0, notes=[],
                         script="t.py")


def test_the_png_is_a_png_of_the_expected_size(tmp_path):
    path = tmp_path / "run.png"
    plot.write(gpu_run(), path)
    assert png_size(path.read_bytes()) == (1000, 600)
    plot.write(stacks_run(), path)  # no GPU line, sparse py-spy points
    assert png_size(path.read_bytes()) == (1000, 600)


def test_the_lines_are_the_timelines_known_points_in_percent():
    lines = {line.key: line for line in plot.series(gpu_run()["timeline"])}
    assert set(lines) == {"gpu_utilization", "job_cpu_percent", "data_wait_share"}
    assert lines["data_wait_share"].panel == 1
    assert all(0 <= value <= 100 for _, value in lines["data_wait_share"].points)
    sparse = {line.key: line for line in plot.series(stacks_run()["timeline"])}
    assert set(sparse) == {"job_cpu_percent", "loading_share"}  # no GPU, no feed
    assert sparse["loading_share"].points == ((1.0, 70.0), (3.0, 70.0), (5.0, 70.0), (7.0, 70.0))


def test_the_html_page_holds_the_series_the_timeline_and_the_verdict(tmp_path):
    path = tmp_path / "run.html"
    result = gpu_run()
    plot.write(result, path)
    page = path.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<img" not in page and "src=" not in page
    svg = ET.fromstring(re.search(r"<svg .*</svg>", page, re.S).group(0))  # well-formed
    drawn = {line.get("data-series"): line.get("points")
             for line in svg.iter("{http://www.w3.org/2000/svg}polyline")}
    assert set(drawn) == {"gpu_utilization", "job_cpu_percent", "data_wait_share"}
    assert len(drawn["job_cpu_percent"].split()) == len(result["timeline"])
    data = re.search(r'<script type="application/json" id="timeline">(.*)</script>', page)
    assert json.loads(data.group(1)) == result["timeline"]
    assert f"{result['verdict']['kind']}: {result['verdict']['reason']}" in page


def test_the_html_escapes_what_the_command_says(tmp_path):
    page = plot.html_page(stacks_run())
    assert "&lt;/script&gt;.py" in page and page.count("</script>") == 1
    assert 'data-series="loading_share"' in page and "no GPU figures" in page


@pytest.mark.parametrize("name", ["run.svg", "run", "run.PNG.txt"])
def test_only_png_and_html_are_written(tmp_path, name):
    with pytest.raises(UsageError, match="--plot writes PATH.png or PATH.html"):
        plot.check(tmp_path / name)


@pytest.fixture
def no_matplotlib(monkeypatch):
    """An environment without the plot extra, or with a broken one: importing it fails."""
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)


def test_a_png_without_matplotlib_is_refused_before_the_job_runs(tmp_path, no_matplotlib):
    ran = tmp_path / "ran"
    result = CliRunner().invoke(main, ["watch", "--plot", str(tmp_path / "run.png"), "--",
                                       sys.executable, "-c", f"open({str(ran)!r}, 'w')"])
    assert result.exit_code == EXIT_USAGE
    (line,) = result.output.strip().splitlines()
    assert line.startswith("tuneup watch: --plot PATH.png needs a working matplotlib (")
    assert line.endswith("pip install 'tuneup[plot]' (PATH.html needs nothing)")
    assert not ran.exists()
    plot.check(tmp_path / "run.html")  # needs nothing


@pytest.mark.parametrize("name", ["run.png", "run.html"])
def test_watching_a_job_draws_its_run(tmp_path, name):
    path = tmp_path / name
    job = "import time\nend = time.monotonic() + 1\nwhile time.monotonic() < end: pass"
    result = CliRunner().invoke(main, ["watch", "--interval", "0.2", "--plot", str(path), "--",
                                       sys.executable, "-c", job])
    assert result.exit_code == 0, result.output
    if name.endswith(".png"):
        assert png_size(path.read_bytes()) == (1000, 600)
    else:
        assert 'data-series="job_cpu_percent"' in path.read_text()


def test_a_plot_into_a_missing_folder_is_refused(tmp_path):
    result = CliRunner().invoke(main, ["watch", "--plot", str(tmp_path / "no" / "run.html"),
                                       "--", sys.executable, "-c", "pass"])
    assert result.exit_code == EXIT_USAGE and "cannot write the picture into" in result.output
