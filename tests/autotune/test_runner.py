"""The runner against real child processes: stand-ins (fast) and the real wrappers."""

from __future__ import annotations

import math
from pathlib import Path
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from tuneup.autotune.runner import Runner, _Process, process_tree_memory
from tuneup.autotune.trials import Trial, TrialResult
from tuneup.errors import ScriptError
from tuneup.settings import Knobs


def trials(*ids: str, check: bool = False) -> list[Trial]:
    return [Trial(i, Knobs(num_workers=n), check) for n, i in enumerate(ids)]


def statuses(results) -> dict[str, str]:
    return {r.trial.id: r.status for r in results}


def test_all_trials_in_one_process(fake_script):
    with Runner(fake_script()) as runner:
        results = runner.run(trials("a", "b", "c", check=True))
    assert statuses(results) == {"a": "ok", "b": "ok", "c": "ok"}
    assert runner.processes_started == 1
    assert runner.facts.effective_batch == 64 and runner.facts.amp_dtypes == ("bfloat16",)
    assert results[1].step_time == pytest.approx(0.02)
    assert results[0].check_losses == [2.3, 2.2, 2.1]


def test_crash_is_recorded_with_stderr_and_the_rest_runs_in_a_fresh_process(fake_script):
    with Runner(fake_script({"b": "crash"})) as runner:
        results = runner.run(trials("a", "b", "c"))
    assert statuses(results) == {"a": "ok", "b": "crash", "c": "ok"}
    assert "SIGKILL" in results[1].message and "Segmentation fault" in results[1].message
    assert runner.processes_started == 2


@pytest.mark.parametrize("kind", ["oom", "error"])
def test_oom_and_error_reported_by_the_child(fake_script, kind):
    with Runner(fake_script({"a": kind})) as runner:
        results = runner.run(trials("a", "b"))
    assert statuses(results) == {"a": kind, "b": "ok"}
    assert results[0].message


def test_hang_is_killed_after_the_trial_timeout(fake_script):
    with Runner(fake_script({"b": "hang"}), timeout=1.0) as runner:
        started = time.monotonic()
        results = runner.run(trials("a", "b", "c"))
    assert statuses(results) == {"a": "ok", "b": "hang", "c": "ok"}
    assert "killed" in results[1].message
    assert time.monotonic() - started < 30


def test_host_memory_cap_is_an_oom(fake_script):
    behaviour = {"a": "alloc", "b": "slow"}  # b stays under the cap while it is watched
    with Runner(fake_script(behaviour), max_memory_bytes=200 * 2**20, timeout=30) as runner:
        results = runner.run(trials("a", "b"))
    assert statuses(results) == {"a": "oom", "b": "ok"}
    assert "--max-memory" in results[0].message


def test_short_script_is_restarted_for_the_remaining_trials(fake_script):
    with Runner(fake_script({"*": "short"})) as runner:
        results = runner.run(trials("a", "b", "c"))
    assert statuses(results) == {"a": "ok", "b": "ok", "c": "ok"}
    assert runner.processes_started == 3


def test_early_stop_skips_the_rest(fake_script):
    with Runner(fake_script()) as runner:
        results = runner.run(trials("a", "b", "c"), stop=lambda r: r.trial.id == "a")
    assert statuses(results) == {"a": "ok", "b": "skipped", "c": "skipped"}


def test_a_child_that_waits_runs_every_plan_in_one_process(fake_script):
    """A child whose hello says it waits for a next plan goes on with the next run's plan,
    after its last trial and after an early stop (the stop pauses it); the budget then
    prices no start-up for the next plan."""
    with Runner(fake_script(waits_for_next_plan=True)) as runner:
        assert statuses(runner.run(trials("a", "b"))) == {"a": "ok", "b": "ok"}
        assert runner.live_process()
        results = runner.run(trials("c", "d", "e"), stop=lambda r: r.trial.id == "c")
        assert statuses(results) == {"c": "ok", "d": "skipped", "e": "skipped"}
        assert runner.live_process()
        assert statuses(runner.run(trials("f"))) == {"f": "ok"}
        assert runner.processes_started == 1
    assert not runner.live_process()


def test_a_failure_ends_the_live_process_and_the_next_plan_starts_a_fresh_one(fake_script):
    with Runner(fake_script({"b": "error"}, waits_for_next_plan=True)) as runner:
        assert statuses(runner.run(trials("a", "b"))) == {"a": "ok", "b": "error"}
        assert not runner.live_process()
        assert statuses(runner.run(trials("c"))) == {"c": "ok"}
        assert runner.processes_started == 2 and runner.live_process()


def test_a_failure_in_the_trial_a_pause_drops_is_not_the_next_plans(fake_script):
    """The pause waits until the child took it: a dropped trial that fails in its last step
    ends the process there, and the next plan runs in a fresh one, blaming nobody."""
    with Runner(fake_script({"b": "slow-error"}, waits_for_next_plan=True)) as runner:
        results = runner.run(trials("a", "b", "c"), stop=lambda r: r.trial.id == "a")
        assert statuses(results) == {"a": "ok", "b": "skipped", "c": "skipped"}
        assert not runner.live_process()
        assert statuses(runner.run(trials("d"))) == {"d": "ok"}
    assert runner.processes_started == 2


def test_a_failure_right_after_a_dtype_switch_across_plans_is_retried_fresh(fake_script):
    """The trial before may have run in the process's previous plan."""
    script = fake_script({"bf16": "error-unless-first"}, waits_for_next_plan=True)
    with Runner(script) as runner:
        runner.run([Trial("fp32", Knobs())])
        (result,) = runner.run([Trial("bf16", Knobs(amp_dtype="bfloat16"))])
    assert result.status == "ok" and runner.processes_started == 2


def test_a_child_that_does_not_wait_gets_a_process_per_plan(fake_script):
    with Runner(fake_script()) as runner:
        runner.run(trials("a"))
        assert not runner.live_process()
        runner.run(trials("b"))
    assert runner.processes_started == 2


def test_an_early_stop_before_a_first_compile_kills_rather_than_pauses(fake_script):
    """The child drops a stopped trial only at its next step's end: a step compiling new
    graphs can outlast a start-up, so that process is killed instead."""
    plan = [Trial("eager", Knobs()), Trial("compiled", Knobs(compile_mode="default"))]
    with Runner(fake_script(waits_for_next_plan=True)) as runner:
        results = runner.run(plan, stop=lambda r: True)
        assert statuses(results) == {"eager": "ok", "compiled": "skipped"}
        assert not runner.live_process()
        # the same graphs with other loader knobs: the dynamo cache holds them, no compile
        again = [Trial("compiled #2", Knobs(compile_mode="default")),
                 Trial("compiled, workers=1", Knobs(compile_mode="default", num_workers=1))]
        runner.run(again, stop=lambda r: True)
        assert runner.live_process()


def test_budget_ends_the_run(fake_script):
    with Runner(fake_script({"a": "hang"}), deadline=time.monotonic() + 2, timeout=60) as runner:
        results = runner.run(trials("a", "b"))
    assert statuses(results) == {"a": "budget", "b": "budget"}


def test_script_without_the_wrappers(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text("print('training without tuneup')\n")
    with Runner(script) as runner, pytest.raises(ScriptError) as error:
        runner.run(trials("a"))
    assert str(error.value) == ("plain.py never called tuned_loop or tuned_loader (for a Trainer: "
        "tuned_trainer or tuned_trainer_kwargs) — see "
                                "docs/autotune.md")


def test_script_failing_on_its_own_shows_its_stderr(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("import json\nraise SystemExit(json.loads('{}')['missing'])\n")
    with Runner(script) as runner, pytest.raises(ScriptError) as error:
        runner.run(trials("a"))
    message = str(error.value)
    assert message.startswith("broken.py failed (exit status 1) and never called tuned_loop")
    assert "KeyError: 'missing'" in message and "exit status 1" in message


def test_bad_script_arguments_show_the_scripts_usage(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import argparse\np = argparse.ArgumentParser()\n"
                      "p.add_argument('--steps', type=int)\np.parse_args()\n")
    with Runner(script, ["--steps", "many"]) as runner, pytest.raises(ScriptError) as error:
        runner.run(trials("a"))
    assert "invalid int value: 'many'" in str(error.value)
    assert "exit status 2" in str(error.value)


REAL_SCRIPT = textwrap.dedent('''
    import torch
    from tuneup import tuned_loader, tuned_loop
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
    model = torch.nn.Linear(8, 2)
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
    loader = tuned_loader(data, batch_size=32, shuffle=True, loop=loop)
    for epoch in range(50):
        for x, y in loader:
            with loop.step():
                if torch.get_num_threads() == 1:
                    raise RuntimeError("this model refuses one thread")
                loss = torch.nn.functional.cross_entropy(loop.model(x), y)
            loop.backward(loss)
''')


@pytest.mark.slow
def test_real_wrappers_error_in_the_users_step(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(REAL_SCRIPT)
    plan = [Trial("base", Knobs(), True), Trial("one", Knobs(cpu_threads=1)),
            Trial("amp", Knobs(amp_dtype="bfloat16"), True)]
    with Runner(script, timeout=60) as runner:
        results = runner.run(plan)
    assert statuses(results) == {"base": "ok", "one": "error", "amp": "ok"}
    assert "refuses one thread" in results[1].message
    assert runner.facts.effective_batch == 32 and runner.facts.dataset_size == 256
    assert len(results[0].check_losses) == 3 and results[0].step_time > 0
    assert runner.processes_started == 2


def test_result_from_event_tolerates_junk_and_estimates_noise():
    trial = Trial("t", Knobs())
    result = TrialResult.from_event(trial, {"status": "ok", "step_s": None, "samples_per_s": "x",
                                            "step_s_all": [0.1, "bad", -1, 0.1, 0.1, 0.1, 0.1, 0.1],
                                            "check_losses": [2.3, None], "warmup_s": float("nan")})
    assert result.ok and result.step_time == pytest.approx(0.1)
    assert result.samples_per_s is None and result.warmup_s is None
    assert result.check_losses[0] == 2.3 and math.isnan(result.check_losses[1])
    assert result.noise == pytest.approx(0.005)  # identical blocks: the floor
    bursty = TrialResult(trial, "ok", step_s_all=[0.05, 0.15] * 6)  # queue fills and empties
    assert bursty.step_time == pytest.approx(0.1)
    assert TrialResult.from_event(trial, {"status": "error"}).ok is False


def test_a_failure_right_after_a_dtype_switch_is_retried_in_a_fresh_process(fake_script):
    """State the script keeps from the trial before (a carried RNN state in the old dtype)
    must not fail a trial: it runs again, first in a new process, before its failure counts."""
    bf16 = Knobs(amp_dtype="bfloat16")
    plan = [Trial("fp32", Knobs()), Trial("bf16", bf16), Trial("fp32 again", Knobs())]
    with Runner(fake_script({"bf16": "error-unless-first"})) as runner:
        results = runner.run(plan)
    assert statuses(results) == {"fp32": "ok", "bf16": "ok", "fp32 again": "ok"}
    assert runner.processes_started == 2
    with Runner(fake_script({"bf16": "error"})) as runner:  # fails on its own too: counts
        results = runner.run(plan)
    assert statuses(results) == {"fp32": "ok", "bf16": "error", "fp32 again": "ok"}
    assert runner.processes_started == 3
    with Runner(fake_script({"b": "error-unless-first"})) as runner:  # no switch: no retry
        results = runner.run(trials("a", "b"))
    assert statuses(results) == {"a": "ok", "b": "error"}


@pytest.mark.skipif(sys.platform != "linux", reason="proportional set sizes are Linux's")
def test_forked_workers_count_the_pages_they_share_once(tmp_path):
    """The memory cap's measure: a script holding 256 MiB that forks two workers (as a
    DataLoader does) holds about 256 MiB, not the 768 MiB its resident sizes add up to;
    below a cap the resident sizes are enough (they are never smaller)."""
    script = tmp_path / "forks.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time
        data = bytearray(256 * 2**20)
        for i in range(0, len(data), 4096):
            data[i] = 1
        for _ in range(2):
            if os.fork() == 0:
                time.sleep(60)
                os._exit(0)
        print("ready", flush=True)
        time.sleep(60)
    """))
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "ready"
        tree = psutil.Process(process.pid)
        members = [tree, *tree.children()]
        assert len(members) == 3
        resident = sum(m.memory_info().rss for m in members)
        held = process_tree_memory(process.pid, above=300 * 2**20)
        assert resident > 700 * 2**20
        assert 256 * 2**20 < held < 400 * 2**20
        assert process_tree_memory(process.pid, above=2**40) >= resident - 2**20
    finally:
        for child in psutil.Process(process.pid).children():
            child.kill()
        process.kill()
        process.wait()


def test_a_process_holds_the_graphs_of_the_compiled_trial_it_started_last():
    """The child keeps the graphs of the compiled knobs it ran last (an eager trial between
    leaves them; loader knobs share them): what the search prices a confirmation by."""
    process = _Process(popen=None, files=[], stderr=Path("err"), started=0.0,  # type: ignore[arg-type]
                       next_plan=Path("plan"), marker="m", journal=Path("journal"))
    assert process.graphs is None
    process.trial_started(Knobs(num_workers=2, compile_mode="default"))
    process.trial_started(Knobs(num_workers=4))
    assert process.graphs == Knobs(compile_mode="default")
    process.trial_started(Knobs(compile_mode="reduce-overhead"))
    assert process.graphs == Knobs(compile_mode="reduce-overhead")
