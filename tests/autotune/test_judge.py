"""The judge refuses a trial whose micro-batch the runtime did not apply."""

from __future__ import annotations

import dataclasses

from test_search import record

from tuneup.autotune.search import Options, describe
from tuneup.autotune.search.judge import Judge
from tuneup.autotune.space import ScriptFacts
from tuneup.autotune.trials import Trial, TrialResult
from tuneup.settings import Knobs


def test_a_blocked_micro_batch_is_never_a_usable_result():
    """A BatchNorm trial trained whole batches: its speed (a noisy 1.65x once) is not the
    micro-batch's, and the run would refuse the setting anyway."""
    knobs = Knobs(micro_batch_size=32)
    measured = TrialResult.from_event(Trial(describe(knobs), knobs), record(0.05))
    judge = Judge(Options(), ScriptFacts(effective_batch=128))
    assert judge.problem(measured) is None
    blocked = dataclasses.replace(measured, micro_batch_blocked="BatchNorm1d '0' normalises "
                                  "with the statistics of the batch it is given")
    assert judge.problem(blocked).startswith("micro_batch_size=32 not applied: BatchNorm1d")
