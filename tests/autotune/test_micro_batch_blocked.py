"""A micro-batch that can never apply (the plain backward form, BatchNorm) is reported with
its reason from the baseline on, never as "batch: skipped, budget too small"."""

from __future__ import annotations

from test_child import ends, run_child
from test_search import record, search

from tuneup.autotune.search import Options

PLAIN = "the script computes its loss outside loop.train_step"


def test_the_baseline_says_the_plain_form_cannot_be_micro_batched(tmp_path):
    process, events = run_child(tmp_path, [{"id": "baseline", "knobs": {}}], PLAIN_FORM="1")
    assert process.returncode == 0, process.stderr
    assert ends(events)["baseline"]["micro_batch_blocked"] == PLAIN


def test_a_loop_that_can_be_micro_batched_says_nothing(tmp_path):
    process, events = run_child(tmp_path, [{"id": "baseline", "knobs": {}}])
    assert process.returncode == 0, process.stderr
    assert ends(events)["baseline"]["micro_batch_blocked"] is None


def test_a_micro_batch_that_never_applies_is_not_skipped_for_budget():
    """The budget holds no batch stage; the micro-batch is left alone for its real reason."""
    def timing(knobs):
        return {**record(0.1), "micro_batch_blocked": PLAIN}

    outcome = search(timing, Options(groups=frozenset({"batch"})), budget=14)[0].run()
    assert f"batch: micro-batching left alone: {PLAIN}" in outcome.notes
    assert not [n for n in outcome.notes if n.startswith("batch: skipped")]
