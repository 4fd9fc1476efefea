"""The end-of-job summary: which samples it judges, and its JSON and text forms."""

from __future__ import annotations

import dataclasses
import io
import json

from rich.console import Console
from test_verdict import cpu_window

from tuneup.watch import summary
from tuneup.watch.samples import MAIN, ProcessSample, StackCounts


def test_start_up_and_tear_down_are_left_out_of_the_verdict():
    training = cpu_window(98.0, [], wait_s=0.5)
    before = dataclasses.replace(training[0], t=-1.0, runtime=())
    after = [dataclasses.replace(training[-1], t=training[-1].t + n) for n in (1, 2)]
    samples = [before, *training, *after]
    assert summary.training_window(samples) == training


def test_without_a_feed_the_workers_mark_the_training():
    training = cpu_window(30.0, [95.0])
    alone = (ProcessSample(10, MAIN, 100.0, 1, 4, 2**30, None),)
    start_up = dataclasses.replace(training[0], t=-1.0, processes=alone)
    tear_down = dataclasses.replace(training[-1], t=99.0, processes=alone)
    assert summary.training_window([start_up, *training, tear_down]) == training
    assert summary.training_window(cpu_window(99.0, [])) == cpu_window(99.0, [])


def test_the_summary_judges_the_training_part_with_the_runs_final_counters():
    window = cpu_window(98.0, [], wait_s=0.5)
    startup = [dataclasses.replace(window[0], t=-1.0, runtime=())]
    final = (dataclasses.replace(window[-1].runtime[0], steps=100, elapsed_s=20.0,
                                 data_wait_s=1.0),)
    result = summary.build(startup + window, final, command=["python", "t.py"], pid=10,
                           exit_status=0, duration_s=21.0, interval_s=1.0, notes=[],
                           script="t.py")
    assert result["verdict"]["kind"] == "compute-bound"  # 1 s of 20 waiting: 5 %
    assert result["verdict"]["evidence"]["data_wait_share"] == 0.05
    assert result["figures"]["seconds"] == 4.0 and len(result["timeline"]) == 6
    assert result["timeline"][2]["data_wait_share"] == 0.5
    json.dumps(result)  # every figure is plain JSON


def test_when_the_final_counters_are_gone_the_last_sampled_ones_stand_in():
    window = cpu_window(98.0, [], wait_s=0.5)
    kept = summary.build(window, (), command=None, pid=10, exit_status=None, duration_s=5.0,
                         interval_s=1.0, notes=[], script="t.py")
    final = summary.build(window, window[-1].runtime, command=None, pid=10, exit_status=None,
                          duration_s=5.0, interval_s=1.0, notes=[], script="t.py")
    assert kept["verdict"] == final["verdict"] and kept["verdict"]["kind"] == "input-bound"


def test_no_sample_no_verdict(tmp_path):
    result = summary.build([], (), command=["python", "-c", "pass"], pid=1, exit_status=0,
                           duration_s=0.1, interval_s=1.0, notes=[], script="train.py")
    assert result["verdict"] is None and result["figures"] is None
    summary.write(result, tmp_path / "s.json")
    assert json.loads((tmp_path / "s.json").read_text()) == result
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]
    out = io.StringIO()
    summary.print_text(Console(file=out, width=80), result)
    assert "  verdict none: the job ended before the first sample\n" in out.getvalue()


def test_the_text_names_verdict_evidence_action_and_notes_without_trailing_blanks():
    samples = cpu_window(98.0, [], wait_s=0.5)
    result = summary.build(samples, samples[-1].runtime, command=["python", "t.py"],
                           pid=10, exit_status=3, duration_s=5.0, interval_s=1.0,
                           notes=["NVML is not available"], script="t.py")
    out = io.StringIO()
    summary.print_text(Console(file=out, width=70), result)
    text = out.getvalue()
    assert text.startswith("tuneup watch: python t.py: 5 s watched, 5 readings, exit status 3\n")
    for label in ("verdict  input-bound: the loop waits for data 50%",
                  "evidence data_wait_share 0.5", "action   more DataLoader workers",
                  "note     NVML is not available"):
        assert f"\n  {label}" in text, text
    assert "\n           `tuneup autotune t.py --only loader`" in text  # wrapped in its column
    assert all(line == line.rstrip() for line in text.splitlines())


def test_without_workers_the_stacks_that_saw_the_dataloader_mark_the_training():
    training = [dataclasses.replace(s, stacks=StackCounts(40, 100)) for s in cpu_window(99.0, [])]
    imports = dataclasses.replace(training[0], t=-1.0, stacks=StackCounts(0, 100))
    tear_down = dataclasses.replace(training[-1], t=99.0, stacks=None)
    samples = [imports, *training, tear_down]
    assert summary.training_window(samples) == training
    result = summary.build(samples, (), command=["python", "t.py"], pid=10, exit_status=0,
                           duration_s=100.0, interval_s=1.0, notes=[], script="t.py")
    assert result["verdict"]["kind"] == "input-bound"
    assert result["verdict"]["evidence"]["loading_share"] == 0.4  # the imports left out
    assert [p["loading_share"] for p in result["timeline"]] == [0.0, *[0.4] * 5, None]
