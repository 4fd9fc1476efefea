"""What the search can afford (tuneup/autotune/search/budget.py)."""

from __future__ import annotations

import pytest

from tuneup.autotune.search.budget import Budget
from tuneup.autotune.space import ScriptFacts


class Executor:
    facts = ScriptFacts()
    startup_s = 8.0
    live = True

    def time_left(self) -> float:
        return 100.0

    def live_process(self) -> bool:
        return self.live

    def held_graphs(self) -> None:
        return None


def test_a_compile_in_the_waiting_process_is_priced_without_a_start_up():
    """The compile stage goes on in the process that waits for it: holding a start-up for
    it made compile look unaffordable and freed its share for races between close settings."""
    executor = Executor()
    budget = Budget(executor)
    waiting = budget.compile_seconds()
    executor.live = False
    assert budget.compile_seconds() == pytest.approx(waiting + 8.0)


def test_the_confirmations_share_can_be_spent_when_asked():
    budget = Budget(Executor())
    held = budget.affordable(100)
    spent = budget.affordable(100, confirmation=False)
    assert spent > held
    assert spent * budget.trial_seconds() <= 100.0
