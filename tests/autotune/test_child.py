"""The autotune child, end to end: real subprocesses running a tiny training script.

Failures are provoked by the test's own script (an OOM stand-in, a NaN loss, an exception in
the user's code); the product code only sees what a real script would do.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = '''
import os, sys
import torch
from torch.utils.data import TensorDataset
from tuneup import tuned_loader, tuned_loop

x = torch.randn(200, 8, generator=torch.Generator().manual_seed(1))
dataset = TensorDataset(x, (x[:, 0] > 0).long())
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))  # unseeded
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
if os.environ.get("NO_WRAPPERS"):
    sys.exit(0)
if os.environ.get("LOADER_ONLY"):  # iterates, but no loop: nothing to tune
    sys.exit(sum(len(b[0]) for b in tuned_loader(dataset, batch_size=32)) != 200)
if os.environ.get("THREADS") == "before-loop":  # the script's own thread count
    torch.set_num_threads(2)
loop = tuned_loop(model, optimizer)
if os.environ.get("THREADS") == "after-loop":
    torch.set_num_threads(2)
if os.environ.get("EVAL_FIRST"):  # a validation loader, linked too, iterated before training
    with torch.no_grad():
        for features, labels in tuned_loader(dataset, batch_size=50, loop=loop):
            loop.model(features)
if os.environ.get("LOOP_ONLY"):
    sys.exit(0)
batch_size = int(os.environ.get("BATCH_SIZE", "32"))
loader = tuned_loader(dataset, batch_size=batch_size, shuffle=True, drop_last=True, loop=loop)
max_steps = int(os.environ.get("MAX_STEPS", "1000000"))
oom_above = int(os.environ.get("OOM_ABOVE", "1000000"))
steps = 0


def compute_loss(batch):
    features, labels = batch
    if os.environ.get("THREADS_LOG"):  # the threads each step really ran with
        with open(os.environ["THREADS_LOG"], "a") as log:
            print(torch.get_num_threads(), file=log)
    if len(features) > oom_above:  # an OOM stand-in: this micro-batch "does not fit"
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    loss = torch.nn.functional.cross_entropy(loop.model(features), labels)
    if os.environ.get("NAN_WITH_AMP") and torch.is_autocast_enabled("cpu"):
        loss = loss * float("nan")
    return loss


for epoch in range(1000):
    for features, labels in loader:
        if os.environ.get("PLAIN_FORM"):
            with loop.step():
                loss = compute_loss((features, labels))
            loop.backward(loss)
        else:
            loop.train_step((features, labels), compute_loss)
        steps += 1
        if steps == int(os.environ.get("RAISE_AT", "-1")):
            raise ValueError("the user's own bug")
        if steps >= max_steps:
            break
    if steps >= max_steps:
        break
print("script ended after", steps, "steps")
'''


def run_child(tmp_path: Path, trials: list[dict], name: str = "run", window: dict | None = None,
              **env: str):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    results = tmp_path / "results.jsonl"
    plan = {"protocol": 1, "results": str(results), "warmup_steps": 1, "measure_steps": 2,
            "min_measure_seconds": 0.0, "max_measure_steps": 4, "check_steps": 2, "trials": trials,
            **(window or {})}
    if "PLAN_PARENT_PID" in env:
        plan["parent_pid"] = int(env.pop("PLAN_PARENT_PID"))
    plan_path = tmp_path / f"{name}.plan.json"
    plan_path.write_text(json.dumps(plan))
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TUNEUP_")}
    environment.update(env, TUNEUP_PROBE=str(plan_path), OMP_NUM_THREADS="1",
                       TUNEUP_OBSERVERS="tuneup.autotune.child:install")
    before = len(results.read_text().splitlines()) if results.exists() else 0
    process = subprocess.run([sys.executable, str(script)], env=environment, cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
    lines = results.read_text().splitlines()[before:] if results.exists() else []
    return process, [json.loads(line) for line in lines]


def ends(events: list[dict]) -> dict[str, dict]:
    return {e["id"]: e for e in events if e["event"] == "trial_end"}


def test_a_normal_plan_runs_every_trial_and_exits_0(tmp_path):
    trials = [{"id": "baseline", "knobs": {}, "check": True},
              {"id": "mb=8", "knobs": {"micro_batch_size": 8}, "check": True},
              {"id": "amp=bfloat16", "knobs": {"amp_dtype": "bfloat16"}, "check": True},
              {"id": "workers=1", "knobs": {"num_workers": 1, "persistent_workers": True}},
              {"id": "threads=1", "knobs": {"cpu_threads": 1}}]
    process, events = run_child(tmp_path, trials)
    assert process.returncode == 0, process.stderr
    assert "script ended" not in process.stdout  # the plan ended the run, not the loop
    assert [e["event"] for e in events] == ["hello"] + ["trial_start", "trial_end"] * 5 + ["done"]
    hello = events[0]
    assert (hello["device"], hello["effective_batch"], hello["dataset_size"]) == ("cpu", 32, 200)
    assert hello["fixed_knobs"] == [] and hello["shuffles"] is True
    # malloc's thresholds fixed before any trial, wherever glibc is
    assert hello["every_trial"] == ({"fixed_malloc_thresholds": True}
                                    if platform.libc_ver()[0] == "glibc" else {})
    # bfloat16 is offered where the CPU runs it fast, else the hello says why not (measured)
    assert hello["amp_dtypes"] == ["bfloat16"] or (
        hello["amp_dtypes"] == [] and "no fast bfloat16" in hello["fixed_reasons"]["amp_dtype"])
    results = ends(events)
    assert all(r["status"] == "ok" for r in results.values())
    for result in results.values():
        assert result["samples_per_s"] > 0 and result["warmup_s"] > 0
        assert 2 <= len(result["step_s_all"]) <= 4 and 0 <= result["data_wait_share"] <= 1
        assert result["input_shapes"] == 1  # an epoch's last, shorter batch counts as one
    assert results["mb=8"]["micro_batch_size"] == 8 and results["baseline"]["micro_batch_size"] is None
    baseline = results["baseline"]["check_losses"]
    assert len(baseline) == 2
    assert results["mb=8"]["check_losses"] == pytest.approx(baseline, abs=1e-5)
    assert results["amp=bfloat16"]["check_losses"] == pytest.approx(baseline, abs=0.05)
    assert results["workers=1"]["check_losses"] is None


def test_an_epochs_restart_is_timed_as_the_run_pays_it(tmp_path):
    """Six batches an epoch and a window of twelve steps: the window spans restarts, and the
    steps that start a worker again are timed (the run pays them every epoch), not left out
    as the user's own gaps are."""
    trials = [{"id": "workers=1", "knobs": {"num_workers": 1}}]
    process, events = run_child(tmp_path, trials, window={"measure_steps": 12,
                                                          "max_measure_steps": 12})
    assert process.returncode == 0, process.stderr
    steps = sorted(ends(events)["workers=1"]["step_s_all"])
    assert len(steps) == 12
    assert steps[-1] > 5 * steps[len(steps) // 2]  # a worker's start-up among them


def test_a_failing_trial_is_recorded_and_the_next_process_resumes(tmp_path):
    trials = [{"id": "baseline", "knobs": {}, "check": True},
              {"id": "fp16", "knobs": {"amp_dtype": "float16"}},
              {"id": "never", "knobs": {}}]
    process, events = run_child(tmp_path, trials)
    assert process.returncode == 3
    failed = ends(events)["fp16"]
    assert failed["status"] == "error" and "float16" in failed["message"]
    assert "\n" not in failed["message"]
    assert "never" not in json.dumps(events)
    # A fresh (unseeded) process starts from the same reference state and batches.
    again, more = run_child(tmp_path, [{"id": "baseline-again", "knobs": {}, "check": True}], "again")
    assert again.returncode == 0, again.stderr
    assert ends(more)["baseline-again"]["check_losses"] == ends(events)["baseline"]["check_losses"]


def test_unknown_knob_is_an_error_trial(tmp_path):
    process, events = run_child(tmp_path, [{"id": "odd", "knobs": {"turbo": True}}])
    assert process.returncode == 3
    assert ends(events)["odd"]["message"] == "SettingsError: unknown knob(s): turbo"


def test_an_out_of_memory_trial(tmp_path):
    trials = [{"id": "mb=8", "knobs": {"micro_batch_size": 8}},
              {"id": "mb=32", "knobs": {"micro_batch_size": 32}}]
    process, events = run_child(tmp_path, trials, OOM_ABOVE="16")
    assert process.returncode == 3
    results = ends(events)
    assert results["mb=8"]["status"] == "ok"
    assert results["mb=32"]["status"] == "oom" and "out of memory" in results["mb=32"]["message"]


def test_a_nonfinite_loss_is_recorded_and_the_plan_goes_on(tmp_path):
    trials = [{"id": "amp=bfloat16", "knobs": {"amp_dtype": "bfloat16"}, "check": True},
              {"id": "baseline", "knobs": {}, "check": True}]
    process, events = run_child(tmp_path, trials, NAN_WITH_AMP="1")
    assert process.returncode == 0, process.stderr
    results = ends(events)
    assert results["amp=bfloat16"]["status"] == "nonfinite"
    assert results["baseline"]["status"] == "ok"
    assert all(v == v for v in results["baseline"]["check_losses"])  # restored: no NaN left


def test_an_exception_in_the_users_own_code(tmp_path):
    process, events = run_child(tmp_path, [{"id": "baseline", "knobs": {}}], RAISE_AT="2")
    assert process.returncode == 1
    assert ends(events)["baseline"]["status"] == "error"
    assert ends(events)["baseline"]["message"] == "ValueError: the user's own bug"
    assert "Traceback" in process.stderr
    assert events[-1]["event"] == "trial_end"  # no "script-ended" after a failure


def test_a_short_script_ends_with_script_ended(tmp_path):
    trials = [{"id": "baseline", "knobs": {}, "check": True}, {"id": "next", "knobs": {}}]
    process, events = run_child(tmp_path, trials, MAX_STEPS="2")
    assert process.returncode == 0 and "script ended after 2 steps" in process.stdout
    assert events[-1] == {"event": "exit", "reason": "script-ended", "steps": 2, "trial": "baseline",
                          "message": "the script's loop ended after 2 steps, before trial "
                                     "baseline finished; give it more steps"}


@pytest.mark.parametrize(("env", "expected"), [
    ({"NO_WRAPPERS": "1"}, None),
    ({"LOOP_ONLY": "1"}, "the script never called tuned_loader(dataset, ..., loop=loop)"),
    ({"LOADER_ONLY": "1"}, "the script never called tuned_loop(model, optimizer), nor "
                           "tuned_trainer / tuned_trainer_kwargs for a Trainer"),
])
def test_wrappers_never_used(tmp_path, env, expected):
    process, events = run_child(tmp_path, [{"id": "baseline", "knobs": {}}], **env)
    assert process.returncode == 0
    if expected is None:
        assert events == []  # no observer: the parent says neither wrapper was called
    else:
        assert events == [{"event": "exit", "reason": "script-ended", "steps": 0, "trial": None,
                           "message": expected}]


def test_a_loader_without_batches_is_named_not_a_hang(tmp_path):
    process, events = run_child(tmp_path, [{"id": "baseline", "knobs": {}}], BATCH_SIZE="256")
    assert process.returncode == 0
    assert events[-1]["message"] == ("a tuned_loader yielded no batch (a dataset smaller than "
                                     "batch_size with drop_last=True?)")


def test_the_training_loader_is_the_one_whose_batches_reach_a_step(tmp_path):
    """A validation loader linked to the loop and iterated first stays plain."""
    trials = [{"id": "baseline", "knobs": {}}, {"id": "mb=8", "knobs": {"micro_batch_size": 8}}]
    process, events = run_child(tmp_path, trials, EVAL_FIRST="1")
    assert process.returncode == 0, process.stderr
    hello = next(e for e in events if e["event"] == "hello")
    assert hello["effective_batch"] == 32
    assert ends(events)["mb=8"]["micro_batch_size"] == 8


def test_the_plain_form_reports_why_micro_batching_cannot_apply(tmp_path):
    trials = [{"id": "mb=8", "knobs": {"micro_batch_size": 8}}]
    process, events = run_child(tmp_path, trials, PLAIN_FORM="1")
    assert process.returncode == 0, process.stderr
    end = ends(events)["mb=8"]
    assert end["status"] == "ok" and end["micro_batch_size"] is None
    assert end["micro_batch_blocked"] == "the script computes its loss outside loop.train_step"


def test_a_rank_left_in_the_environment_of_a_one_process_run_changes_nothing(tmp_path):
    """``RANK`` from a batch system's job: the plan says one process, so rank 0's files."""
    trials = [{"id": "baseline", "knobs": {}, "check": True}]
    process, events = run_child(tmp_path, trials, RANK="3", WORLD_SIZE="4")
    assert process.returncode == 0, process.stderr
    assert ends(events)["baseline"]["status"] == "ok"
    assert not list(tmp_path.glob("*.rank3*"))


def test_a_child_whose_parent_is_gone_exits_at_once(tmp_path):
    """The plan names the parent: a child under another process, neither its parent nor an
    ancestor (torchrun's agent stands between them), never runs a trial."""
    trials = [{"id": "baseline", "knobs": {}}]
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        process, events = run_child(tmp_path, trials, PLAN_PARENT_PID=str(stranger.pid))
    finally:
        stranger.kill()
        stranger.wait()
    assert process.returncode == 3 and events == []
    process, events = run_child(tmp_path, trials, name="ancestor", PLAN_PARENT_PID=str(os.getpid()))
    assert process.returncode == 0 and ends(events)["baseline"]["status"] == "ok"


def test_a_bad_plan_exits_2(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    plan = tmp_path / "plan.json"
    plan.write_text('{"protocol": 7}')
    environment = dict(os.environ, TUNEUP_PROBE=str(plan),
                       TUNEUP_OBSERVERS="tuneup.autotune.child:install")
    process = subprocess.run([sys.executable, str(script)], env=environment, capture_output=True,
                             text=True, timeout=120)
    assert process.returncode == 2
    assert "tuneup: bad probe plan" in process.stderr and "protocol 7" in process.stderr


def test_bfloat16_is_called_slow_only_when_every_round_says_so():
    """One disturbed round (116x, seen in a tuning child on a CPU with AVX512-BF16) must
    not take bfloat16 out of the search; emulated bfloat16 is slow in every round."""
    from tuneup.autotune.child_facts import SLOW_BFLOAT16, least_slowdown

    disturbed = iter([116.0, 0.8, 50.0])
    assert least_slowdown(lambda: next(disturbed)) == 0.8
    emulated = iter([61.0, 59.0, 64.0, 60.0, 62.0, 1.0])
    assert least_slowdown(lambda: next(emulated)) == 59.0 > SLOW_BFLOAT16
    assert next(emulated) == 1.0  # five rounds at most


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _wait_for(path: Path, event: str, timeout: float = 60.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = _events(path)
        if any(e["event"] == event for e in events):
            return events
        time.sleep(0.05)
    raise AssertionError(f"no {event} in {path.name}: {_events(path)}")


def test_a_child_that_finished_its_plan_runs_the_next_in_the_same_process(tmp_path):
    """The search's next comparison pays no second start-up: after its last trial the
    child waits for the plan at ``next_plan``; its trials start from the same reference
    state (the same check losses as in the first plan); a plan without trials pauses, and
    a plan written while trials still run ends them at the next step."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    window = {"warmup_steps": 1, "measure_steps": 2, "min_measure_seconds": 0.0,
              "max_measure_steps": 4, "check_steps": 2}

    def plan(n: int, trials: list[dict], last: bool = False) -> Path:
        path = tmp_path / f"plan-{n}.json"
        data = {"protocol": 1, "results": str(tmp_path / f"results-{n}.jsonl"), "trials": trials,
                "reference": str(tmp_path / "reference.pt"), "parent_pid": os.getpid(), **window}
        if not last:
            data["next_plan"] = str(tmp_path / f"plan-{n + 1}.json")
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(data))
        temporary.rename(path)
        return tmp_path / f"results-{n}.jsonl"

    baseline = {"id": "baseline", "knobs": {}, "check": True}
    first = plan(1, [baseline])
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TUNEUP_")}
    environment.update(TUNEUP_PROBE=str(tmp_path / "plan-1.json"), OMP_NUM_THREADS="1",
                       TUNEUP_OBSERVERS="tuneup.autotune.child:install")
    process = subprocess.Popen([sys.executable, str(script)], env=environment, cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        events = _wait_for(first, "done")
        assert events[0]["waits_for_next_plan"] is True
        time.sleep(0.5)
        assert process.poll() is None  # idle, waiting
        slow = {"id": "slow", "knobs": {}, "check": False}
        second = plan(2, [{**baseline, "id": "again"}] + [dict(slow, id=f"slow {i}")
                                                          for i in range(200)])
        events = _wait_for(second, "trial_end")
        assert events[0]["event"] == "trial_start"  # no second hello: the same process
        plan(3, [])  # stops plan 2 early: a pause
        paused = len(ends(_events(second)))
        assert paused < 201
        last = plan(4, [{**baseline, "id": "last"}], last=True)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, stderr
    assert "script ended" not in stdout
    assert len(ends(_events(second))) <= paused + 1  # at most the trial running at the pause
    checks = [ends(_events(path))[name]["check_losses"]
              for path, name in ((first, "baseline"), (second, "again"), (last, "last"))]
    assert checks[0] == checks[1] == checks[2] and len(checks[0]) == 2
    assert [e["event"] for e in _events(last)] == ["trial_start", "trial_end", "done"]


@pytest.mark.parametrize("when", ["before-loop", "after-loop"])
def test_the_scripts_own_thread_count_is_the_baseline_and_not_tuned(tmp_path, when):
    """The script calls torch.set_num_threads(2) itself (torch's default here is 1, from
    OMP_NUM_THREADS), before tuned_loop or after it: the defaults' trial runs its 2 threads,
    and the hello names cpu_threads as the script's, so no stage tries another count (read
    when the observer was installed, a set_num_threads(1) after tuned_loop was overridden by
    every trial: a 9.3x "speed-up" for the thread count the script already had)."""
    log = tmp_path / "threads.log"
    process, events = run_child(tmp_path, [{"id": "baseline", "knobs": {}}], THREADS=when,
                                THREADS_LOG=str(log))
    assert process.returncode == 0, process.stderr
    hello = events[0]
    assert hello["cpu_threads"] == 2 and "cpu_threads" in hello["fixed_knobs"]
    reason = hello["fixed_reasons"]["cpu_threads"]
    assert reason == ("the script calls torch.set_num_threads(2) itself" if when == "after-loop"
                      else "the script runs 2 intra-op thread(s) where torch's default here is "
                           "1 (torch.set_num_threads before tuned_loop)")
    assert set(log.read_text().split()) == {"2"}  # every step of the baseline: the script's 2


def test_torchs_default_thread_count_follows_its_environment_variables():
    from tuneup.autotune.child_facts import torch_default_threads

    assert torch_default_threads({"OMP_NUM_THREADS": "3"}) == 3
    assert torch_default_threads({"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "5"}) == 5
    assert torch_default_threads({"OMP_NUM_THREADS": "junk"}) == torch_default_threads({})
    assert torch_default_threads({}) >= 1
