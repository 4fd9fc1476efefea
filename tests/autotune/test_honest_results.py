"""What the result claims: a speed-up only for settings that differ from the baseline, said
with how it was measured; a budget that runs out is never called a failing script."""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console
from test_search import compute_bound, record, search

from tuneup.autotune.command import settings_for
from tuneup.autotune.report import print_table, speedup_text, to_json
from tuneup.autotune.runner import Runner
from tuneup.autotune.search import Options, Search, SearchError
from tuneup.settings import Knobs


def slow_first_then_failing_defaults(knobs: Knobs, calls: list[Knobs]) -> dict:
    """The defaults: a fresh process's slow first window, one fast re-run in the threads
    stage, then re-runs that fail in the confirmation; one thread is slower throughout."""
    if knobs.changed():
        return record(0.13)
    calls.append(knobs)
    return record(0.17 if len(calls) == 1 else 0.1, status="ok" if len(calls) <= 2 else "error")


def test_kept_defaults_claim_no_speedup_even_when_the_confirmation_failed(tmp_path):
    """The stages kept the defaults and the confirmation's re-runs failed: the result once
    set the defaults' first window against their re-run, "1.70x (PyTorch's defaults
    kept)", and saved that speed-up in the settings file."""
    calls: list[Knobs] = []
    outcome = search(lambda knobs: slow_first_then_failing_defaults(knobs, calls),
                     Options(groups=frozenset({"threads"})), budget=120)[0].run()
    assert outcome.knobs == Knobs() and not outcome.confirmed
    assert outcome.speedup is None and outcome.speedup_interval is None
    assert outcome.tuned_samples_per_s == outcome.baseline_samples_per_s
    summary = to_json(outcome, tmp_path / "train.py", None, 1.0, 120.0)
    assert summary["speedup"] is None and summary["tuned_samples_per_s"] is None
    assert settings_for(outcome, tmp_path / "train.py").to_dict()["measured"]["speedup"] is None
    out = io.StringIO()
    print_table(Console(file=out, width=300), outcome, None, 1.0)
    text = out.getvalue()
    assert "1.70x" not in text and "-> tuned" not in text
    assert "PyTorch's defaults kept: nothing beat them beyond noise; no speed-up to claim" in text


def test_a_confirmed_speedup_says_how_it_was_measured():
    outcome = search(compute_bound)[0].run()
    assert outcome.confirmed and outcome.speedup > 1.5
    low, high = outcome.speedup_interval
    assert speedup_text(outcome).startswith(f"{outcome.speedup:.2f}x [{low:.2f}, {high:.2f}] "
                                            "(confirmed: re-measured in ")
    assert "interleaved round(s) beside PyTorch defaults" in speedup_text(outcome)


def test_an_unconfirmed_speedup_says_it_comes_from_single_trials():
    calls: list[Knobs] = []

    def timing(knobs: Knobs) -> dict:  # bfloat16 halves the step; the defaults' re-runs fail
        if knobs.amp_dtype:
            return record(0.05)
        return slow_first_then_failing_defaults(knobs, calls)

    outcome = search(timing, Options(groups=frozenset({"amp"})))[0].run()
    assert outcome.knobs.changed() and not outcome.confirmed
    assert speedup_text(outcome).endswith(
        "(unconfirmed: from single trials of the stages, not re-measured)")


def test_a_start_up_longer_than_the_budget_is_named_with_its_fix(tmp_path):
    """A script whose imports take longer than the budget was told "the script fails with
    PyTorch defaults ... fix that before tuning"."""
    script = tmp_path / "train.py"
    script.write_text("import time\ntime.sleep(60)  # a slow import\n")
    with Runner(script, deadline=time.monotonic() + 1.5) as runner, \
            pytest.raises(SearchError) as error:
        Search(runner).run()
    message = str(error.value)
    assert message.startswith("start-up exceeded the budget (budget exhausted during start-up: "
                              "no training step 2 s after the script started)")
    assert message.endswith("give a larger --budget") and "fails" not in message


def test_a_script_still_training_when_the_budget_ran_out_is_not_said_to_fail(fake_script):
    with Runner(fake_script({"defaults": "hang"}), deadline=time.monotonic() + 1.5,
                timeout=60) as runner, pytest.raises(SearchError) as error:
        Search(runner).run()
    message = str(error.value)
    assert message.startswith("the budget ran out while the script was still training with "
                              "PyTorch's defaults, in its first measured trial after a ")
    assert message.endswith("give a larger --budget") and "fails" not in message
