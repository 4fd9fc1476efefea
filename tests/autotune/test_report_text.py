"""How the result states the speed-up, and the progress shown while trials run."""

from __future__ import annotations

import io
from dataclasses import replace

from rich.console import Console
from test_search import CPU, compute_bound, oom_above, record, search

from tuneup.autotune.report import Progress, print_table, speedup_text, to_json
from tuneup.autotune.trials import Trial, TrialResult
from tuneup.settings import Knobs


def test_kept_defaults_say_so_instead_of_unconfirmed():
    tuner, _ = search(lambda knobs: record(0.1 * (1.3 if knobs.changed() else 1.0)))
    outcome = tuner.run()
    assert not outcome.knobs.changed()
    assert speedup_text(outcome) == ("PyTorch's defaults kept: nothing beat them beyond noise; "
                                     "no speed-up to claim")


def test_a_kept_micro_batch_that_fits_is_named_as_the_baseline(tmp_path):
    """The user's batch ran out of memory: the result's baseline is the micro-batch that
    fits, in the text and in JSON, and keeping it is not called keeping the defaults."""
    outcome = search(oom_above(64, lambda knobs: record(0.1)))[0].run()
    assert speedup_text(outcome) == ("the largest micro-batch that fits kept: nothing beat it "
                                     "beyond noise; no speed-up to claim")
    out = io.StringIO()
    print_table(Console(file=out, width=200), outcome, None, 1.0)
    assert "samples/s: micro_batch=64 (fits) 2,560; the largest" in out.getvalue()
    assert to_json(outcome, tmp_path / "train.py", None, 1.0, 300.0)["baseline"] == "micro_batch=64"


def test_a_confirmed_change_gives_its_interval():
    outcome = search(compute_bound)[0].run()
    assert outcome.confirmed and speedup_text(outcome).startswith(f"{outcome.speedup:.2f}x [")


def test_piped_progress_is_one_unwrapped_line_per_trial_and_the_live_line_counts_trials():
    out = io.StringIO()
    progress = Progress(Console(file=out, width=40), lambda: 42.0)
    long_id = "workers=2,prefetch=4,micro_batch=64,amp=bfloat16,compile=default,threads=1"
    with progress:
        progress.stage("compile")
        for n in (1, 2):
            trial = Trial(long_id if n == 1 else f"{long_id} #{n}", Knobs(num_workers=2))
            progress.trial_started(trial)
            progress.trial_finished(TrialResult.from_event(
                trial, {**record(0.05), "samples_per_s": 2560.0}))
        progress.best(2560.0, 1.9, "workers=2")
        live = progress._render().plain
    lines = out.getvalue().splitlines()
    assert lines == [f"  [compile] {long_id}: ok, 2560 samples/s  (42 s left)",
                     f"  [compile] {long_id} #2: ok, 2560 samples/s  (42 s left)"]
    assert "trials done: 2" in live and "best: workers=2 at 2560 samples/s (1.90x)" in live
    assert "42 s left" in live


def test_a_knob_set_for_every_trial_is_said_beside_the_defaults_kept(tmp_path):
    """Once "PyTorch's defaults kept" sat above a table showing fixed_malloc_thresholds
    off -> on: what was kept and what every trial ran with are both said."""
    facts = replace(CPU, every_trial=Knobs(fixed_malloc_thresholds=True))
    outcome = search(lambda knobs: record(0.1 * (1.3 if knobs.changed() else 1.0)),
                     facts=facts)[0].run()
    assert outcome.kept_baseline
    assert speedup_text(outcome) == (
        "PyTorch's defaults kept (and fixed_malloc_thresholds on set for every trial, theirs "
        "too): nothing beat them beyond noise; no speed-up to claim")
    out = io.StringIO()
    print_table(Console(file=out, width=200), outcome, None, 1.0)
    assert ("set for every trial, the baseline's too (not a tuned change): "
            "fixed_malloc_thresholds on") in out.getvalue()
    summary = to_json(outcome, tmp_path / "train.py", None, 1.0, 300.0)
    assert summary["every_trial"] == {"fixed_malloc_thresholds": True}


def test_a_compile_trial_the_budget_cut_is_not_among_the_rejected(tmp_path):
    """A compile trial that ran out of budget was listed under "rejected" beside measured
    losers; it is "not finished (budget)"."""
    def timing(knobs: Knobs) -> dict:
        if knobs.compile_mode:
            return {**record(0.05, 5.0, status="budget"),
                    "message": "budget exhausted during the trial"}
        return compute_bound(knobs)

    outcome = search(timing)[0].run()
    out = io.StringIO()
    print_table(Console(file=out, width=200), outcome, None, 1.0)
    text = out.getvalue()
    assert "not finished (budget):\n  amp=bfloat16,compile=default: budget exhausted during the " \
           "trial\n" in text
    rejected = text.split("rejected:")[1] if "rejected:" in text else ""
    assert "compile" not in rejected.split("not finished")[0]
    summary = to_json(outcome, tmp_path / "train.py", None, 1.0, 300.0)
    assert [r["trial"] for r in summary["not_finished"]] == ["amp=bfloat16,compile=default"]
    assert not [r for r in summary["rejected"] if "compile" in r["trial"]]
