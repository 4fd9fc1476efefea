"""How the result states the speed-up."""

from __future__ import annotations

from test_search import compute_bound, record, search

from tuneup.autotune.report import speedup_text


def test_kept_defaults_say_so_instead_of_unconfirmed():
    tuner, _ = search(lambda knobs: record(0.1 * (1.3 if knobs.changed() else 1.0)))
    outcome = tuner.run()
    assert not outcome.knobs.changed()
    assert speedup_text(outcome) == "1.00x (PyTorch's defaults kept: nothing beat them beyond noise)"


def test_a_confirmed_change_gives_its_interval():
    outcome = search(compute_bound)[0].run()
    assert outcome.confirmed and speedup_text(outcome).startswith(f"{outcome.speedup:.2f}x [")
