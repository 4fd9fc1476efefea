"""Merging the ranks' event streams of a torchrun trial, and reading torchrun's failure
report: what a single process would have written, at the slowest rank's pace."""

from __future__ import annotations

import pytest

from tuneup.autotune.ranks import RankEvents, died_silently, merged
from tuneup.autotune.search.judge import Judge, Options
from tuneup.autotune.space import ScriptFacts
from tuneup.autotune.trials import Trial, TrialResult
from tuneup.settings import Knobs


def end(trial: str, step_s: float, samples: int = 32, **extra) -> dict:
    return {"event": "trial_end", "id": trial, "status": "ok", "step_s": step_s,
            "samples_per_s": samples / step_s, "step_s_all": [step_s] * 3, **extra}


def test_one_hello_and_each_trial_starts_once():
    events = RankEvents(2)
    assert events.add(1, {"event": "hello", "pid": 2}) == [{"event": "hello", "pid": 2}]
    assert events.add(0, {"event": "hello", "pid": 1}) == []
    start = {"event": "trial_start", "id": "a"}
    assert events.add(1, start) == [start] and events.add(0, start) == []


def test_one_exit_an_error_first_else_once_every_rank_ended():
    events = RankEvents(2)
    ended = {"event": "exit", "reason": "script-ended", "steps": 9}
    assert events.add(1, ended) == []
    assert events.add(0, ended) == [ended]
    events = RankEvents(2)
    assert events.add(0, ended) == []
    error = {"event": "exit", "reason": "error", "message": "ValueError: x"}
    assert events.add(1, error) == [{**error, "message": "rank 1: ValueError: x"}]
    assert events.add(0, error) == [] and events.failed == {0, 1}


def test_a_trial_ends_when_every_rank_ended_it_at_the_slowest_ranks_pace():
    events = RankEvents(3)
    assert events.add(0, end("a", 0.010, check_losses=[1.0], peak_memory_bytes=5)) == []
    assert events.add(2, end("a", 0.020, peak_memory_bytes=9)) == []
    (result,) = events.add(1, end("a", 0.015))
    assert result["step_s"] == 0.020 and result["ranks"] == 3
    assert result["samples_per_s"] == pytest.approx(3 * 32 / 0.020)  # the job's samples
    assert result["step_s_all"] == [0.020] * 3 and result["peak_memory_bytes"] == 9
    assert result["check_losses"] == [1.0]  # rank 0's


def test_the_first_failure_of_any_rank_is_the_one_record():
    events = RankEvents(2)
    assert events.add(0, end("a", 0.01)) == []
    failure = {"event": "trial_end", "id": "a", "status": "error", "message": "ValueError: x"}
    (result,) = events.add(1, failure)
    assert result["status"] == "error" and result["message"] == "rank 1: ValueError: x"
    assert events.add(0, {**failure, "message": "peer gone"}) == []
    assert events.failed == {0, 1}


def test_ranks_steps_merge_step_by_step():
    a, b = end("t", 0.02), end("t", 0.015)
    a["step_s_all"], b["step_s_all"] = [0.01, 0.03, 0.02], [0.02, 0.01]
    result = merged([a, b])
    assert result["step_s_all"] == [0.02, 0.03] and result["step_s"] == pytest.approx(0.025)
    assert result["samples_per_s"] == pytest.approx(64 / 0.025)


REPORT = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-23_23:01:02
  host      : node
  rank      : {other} (local_rank: {other})
  exitcode  : {other_code} (pid: 11)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_23:01:02
  host      : node
  rank      : {first} (local_rank: {first})
  exitcode  : {first_code} (pid: 12){signal}
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 12
============================================================
"""


@pytest.mark.parametrize(("first", "first_code", "sig", "other", "other_code", "failed", "named"), [
    (1, -9, "  (SIGKILL)", 0, 3, set(), (1, "exit code -9 (SIGKILL)")),
    (0, 3, "", 1, -9, {0}, (1, "exit code -9")),  # torchrun saw the consequence first
    (1, 1, "", 0, 3, {0, 1}, None),  # both said why themselves
    (1, -15, "  (SIGTERM)", 0, 3, {0}, None),  # the agent's own stop signal
])
def test_the_rank_that_died_without_a_word_is_named(first, first_code, sig, other, other_code,
                                                    failed, named):
    report = REPORT.format(first=first, first_code=first_code, signal=sig, other=other,
                           other_code=other_code)
    assert died_silently("warnings before\n" + report, failed) == named


def test_no_report_no_name():
    assert died_silently("Traceback (most recent call last): ...", set()) is None


def test_speeds_are_the_jobs_every_ranks_batch_per_step():
    facts = ScriptFacts.from_hello({"effective_batch": 32, "ranks": 4})
    assert (facts.effective_batch, facts.samples_per_step) == (32, 128)  # per rank, job
    result = TrialResult(Trial("t", Knobs()), "ok", step_s=0.5)
    assert Judge(Options(), facts).speed(result) == 256.0
