"""Merging the ranks' event streams of a torchrun trial, and reading torchrun's failure
report: what a single process would have written, at the slowest rank's pace."""

from __future__ import annotations

import random

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


# Rank 0's and rank 1's measured steps of one trial (s, to 0.1 ms), recorded under
# `--nproc-per-node 2` on gloo: a DDP MLP whose dataset costs 2 ms of CPU a sample, 2 workers
# a rank (their queue fills, then empties in a burst of fast steps). Both started their
# window at the agreed step's broadcast.
RECORDED = ([0.4045, 0.248, 0.3698, 0.0263, 0.5837, 0.0271, 0.6276, 0.0479, 0.5418, 0.0445,
             0.4699],
            [0.401, 0.2344, 0.3839, 0.0216, 0.577, 0.0367, 0.6275, 0.0426, 0.5564, 0.0463,
             0.4557])


def ranks_windows(steps_per_rank: list[list[float]], batch: int = 32) -> tuple[list[dict], float]:
    """Each rank's trial_end for its step times, and the job's true rate: all ranks' samples
    over the wall time from the window's common start until the last rank's last step."""
    ends = [{**end("t", sum(s) / len(s), batch), "step_s_all": s} for s in steps_per_rank]
    samples = batch * sum(len(s) for s in steps_per_rank)
    return ends, samples / max(sum(s) for s in steps_per_rank)


def lockstep(rng: random.Random, steps: int) -> list[list[float]]:
    """Two DDP ranks: each step ends at the all-reduce they share, give or take a skew."""
    common = [sum(rng.uniform(0.002, 0.08) for _ in range(i + 1)) for i in range(steps)]
    ends = [[t + rng.uniform(0, 0.001) for t in common] for _ in range(2)]
    return [[b - a for a, b in zip([0.0, *e], e)] for e in ends]


def free_running(rng: random.Random, steps: int) -> list[list[float]]:
    """Two ranks with no collective between steps: each at its own pace, stragglers anywhere."""
    return [[rng.uniform(0.001, 0.1) for _ in range(steps)] for _ in range(2)]


def test_the_jobs_rate_is_its_samples_over_the_span_the_ranks_trained():
    """Never more (a 30x figure for 2 ranks on 2 cores once looked like one; the one-process
    baseline had run 2 intra-op threads on busy cores, torchrun's ranks 1); in lockstep, the
    same within the ranks' skew."""
    ends, true_rate = ranks_windows([list(s) for s in RECORDED])
    job = merged(ends)
    assert 0.97 * true_rate <= job["samples_per_s"] <= true_rate
    assert job["samples_per_s"] == pytest.approx(2 * 32 / job["step_s"])  # the judge's figure
    rng = random.Random(0)
    for _ in range(200):
        steps = rng.randint(1, 60)
        ends, true_rate = ranks_windows(lockstep(rng, steps))
        assert 0.95 * true_rate <= merged(ends)["samples_per_s"] <= true_rate * (1 + 1e-9)
        ends, true_rate = ranks_windows(free_running(rng, steps))
        assert merged(ends)["samples_per_s"] <= true_rate * (1 + 1e-9)
