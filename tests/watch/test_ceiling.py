"""The ceiling of each verdict: the most that fixing what it names can gain, from the figures
it rests on, or no bound (and why); in the verdict's JSON, the summary and the live view."""

from __future__ import annotations

import dataclasses
import io

import pytest
from fake_nvml import tick_clock
from rich.console import Console
from test_verdict import cpu_window, stacked
from watch_helpers import load, replay

from tuneup.watch import summary
from tuneup.watch.verdict import decide, reduce
from tuneup.watch.view import status_lines


@pytest.fixture(autouse=True)
def _ticks_a_second_apart(monkeypatch):
    tick_clock(monkeypatch)


def recorded(name: str, **changes) -> dict:
    recording = load(name)
    recording.update(changes)
    return decide(reduce(replay(recording))).to_dict()["ceiling"]


def test_waiting_11_percent_for_data_bounds_the_input_side_at_about_1_12x():
    verdict = decide(reduce(cpu_window(98.0, [], wait_s=0.11)))
    assert verdict.kind == "input-bound"
    assert verdict.to_dict()["ceiling"] == {
        "speedup_at_most": 1.12, "from": "the input side",
        "why": "the loop waits for data 11 % of the time: removing all of it gives at most "
               "1/(1-0.11) = 1.12x"}


def test_the_input_side_without_a_measured_wait_has_no_bound():
    ceiling = recorded("input-bound-workers")
    assert ceiling["speedup_at_most"] is None and ceiling["from"] == "the input side"
    assert "not measured" in ceiling["why"]


def test_py_spy_s_share_in_the_dataloader_bounds_the_input_side():
    verdict = decide(reduce(stacked(cpu_window(99.0, []), 30, 100)))
    assert verdict.kind == "input-bound"
    assert verdict.ceiling.speedup_at_most == round(1 / 0.7, 2)
    assert "the training thread is in the DataLoader 30 %" in verdict.ceiling.why


def test_copies_bound_what_faster_copies_give():
    ceiling = recorded("copy-bound")
    assert ceiling["speedup_at_most"] == round(1 / (1 - 0.22), 2)
    assert ceiling["from"] == "the copies"
    unmeasured = recorded("copy-bound", runtime=None)  # seen on the PCIe link only
    assert unmeasured["speedup_at_most"] is None and "PCIe" in unmeasured["why"]


def test_compute_bound_has_nothing_to_gain_from_the_input_side():
    waited = recorded("compute-bound")  # the loop waits 2 % for data
    assert waited["speedup_at_most"] == 1.02 and waited["from"] == "the input side"
    assert waited["why"].endswith("only faster compute (less work per step, AMP, compile) "
                                  "makes it faster")
    unfed = recorded("compute-bound", runtime=None)
    assert unfed["speedup_at_most"] == 1.0 and "nothing to gain" in unfed["why"]
    unknown = decide(reduce(cpu_window(99.0, [])))  # a busy process alone: no claim, no bound
    assert unknown.kind == "undetermined" and unknown.ceiling.speedup_at_most is None


def test_host_overhead_bounds_by_how_busy_the_gpu_is():
    sms = recorded("host-bound-h100")  # SMs busy 30 % of the time
    assert sms["speedup_at_most"] == 3.33 and sms["from"] == "removing host overhead"
    assert sms["why"].startswith("the GPU's SMs are busy 30 % of the time: the GPU could do "
                                 "the same work in 30 % of it")
    kernels = recorded("host-bound")  # no GPM: kernels run 51.5 % of the time
    assert kernels["speedup_at_most"] == round(1 / 0.515, 2)
    assert kernels["why"].startswith("kernels run 52 % of the time")


def test_held_clocks_bound_at_their_ratio():
    verdict = decide(reduce(replay(load("throttled"))))
    ratio = reduce(replay(load("throttled"))).sm_clock_ratio
    assert verdict.ceiling.speedup_at_most == round(1 / ratio, 2)
    assert verdict.ceiling.source == "full clocks"


def test_oversubscribed_threads_bound_at_threads_per_core():
    crowded = cpu_window(180.0, [90.0, 90.0], wait_s=0.3, busy=2, cpu_percent=99.0)
    verdict = decide(reduce(crowded))
    assert verdict.kind == "cpu-oversubscribed"
    assert verdict.ceiling.speedup_at_most == 2.0  # 4 busy threads on 2 cores
    assert "4.0/2 = 2.00x" in verdict.ceiling.why


@pytest.mark.parametrize(("window", "kind"), [
    (cpu_window(1.0, [0.5], busy=0), "idle"),
    (cpu_window(99.0, [], 0.0, swap_bytes_s=50 * 2**20), "memory-pressure"),
    (cpu_window(50.0, []), "undetermined")])
def test_idle_memory_pressure_and_undetermined_have_no_bound(window, kind):
    verdict = decide(reduce(window))
    assert verdict.kind == kind
    assert verdict.to_dict()["ceiling"]["speedup_at_most"] is None
    assert verdict.ceiling.why


def test_the_summary_shows_the_ceiling_in_its_json_and_in_one_line_of_text():
    samples = cpu_window(98.0, [], wait_s=0.11)
    result = summary.build(samples, samples[-1].runtime, command=["python", "t.py"], pid=10,
                           exit_status=0, duration_s=5.0, interval_s=1.0, notes=[],
                           script="t.py")
    assert result["verdict"]["ceiling"]["speedup_at_most"] == 1.12
    out = io.StringIO()
    summary.print_text(Console(file=out, width=100), result)
    assert "\n  ceiling  at most 1.12x from the input side\n" in out.getvalue()
    result["verdict"]["ceiling"] = {"speedup_at_most": None, "from": None, "why": "no figure"}
    out = io.StringIO()
    summary.print_text(Console(file=out, width=100), result)
    assert "\n  ceiling  no bound: no figure\n" in out.getvalue()


def test_the_live_view_adds_a_bounded_ceiling_to_the_verdict_and_shows_sm_activity():
    window = replay(load("host-bound-h100"))
    figures = reduce(window)
    lines = [line.plain for line in status_lines(window[-1], figures, decide(figures))]
    assert " 99 %  SM 30 %  mem " in lines[0]
    assert lines[-1].startswith("host-bound: the GPU's SMs are busy only 30 %")
    assert lines[-1].endswith(" · at most 3.33x from removing host overhead")
    idle = decide(reduce(cpu_window(1.0, [0.5], busy=0)))
    unbounded = status_lines(dataclasses.replace(window[-1], gpus=()), None, idle)[-1].plain
    assert "·" not in unbounded and "no bound" not in unbounded
