"""What a search produces: its answer, the moves it made, and the error when it cannot run."""

from __future__ import annotations

from dataclasses import dataclass, field

from tuneup.autotune import protocol
from tuneup.autotune.search.judge import Rejection
from tuneup.autotune.space import ScriptFacts
from tuneup.autotune.trials import TrialResult
from tuneup.errors import ScriptError
from tuneup.settings import Knobs


class SearchError(ScriptError):
    """Nothing to tune: the script fails with PyTorch defaults, or no time to measure it."""


@dataclass(frozen=True)
class Change:
    """One move of the incumbent: which stage, from what, to what, and its measured gain."""

    stage: str
    before: Knobs
    after: Knobs
    gain: float


@dataclass(frozen=True)
class RunnerUp:
    """The fastest other settings re-run in the confirmation, set against the pick:
    ``relative_speed`` is its speed over the pick's (geometric mean of the paired rounds),
    ``confidence`` the chance, from those rounds, that the pick is the faster one."""

    knobs: Knobs
    relative_speed: float
    confidence: float


@dataclass
class Outcome:
    """The search's answer. ``confirmed``: the speed-up's 95 % interval, over every steady
    run of the pick and the baseline in the search (with the confirmation's re-runs, or
    where none fit, the stages' runs alone), excludes 1; or the baseline was kept on the
    re-runs. ``baseline_knobs``: what the speed-up is over, PyTorch defaults unless the
    user's batch did not fit."""

    facts: ScriptFacts
    knobs: Knobs
    baseline_samples_per_s: float
    tuned_samples_per_s: float
    results: list[TrialResult]
    rejected: list[Rejection]
    notes: list[str] = field(default_factory=list)
    confirmed: bool = False
    speedup_interval: tuple[float, float] | None = None
    runner_up: RunnerUp | None = None
    baseline_knobs: Knobs = field(default_factory=Knobs)
    # how the speed-up was measured, said beside it
    measured_by: str = "unconfirmed: from single trials of the stages, not re-measured"

    @property
    def file_knobs(self) -> Knobs:
        """What the settings file holds: the pick as the trials ran it."""
        return self.facts.as_run(self.knobs)

    @property
    def unfinished(self) -> list[Rejection]:
        """Trials the budget cut short: not measured losers (a compile that ran out of
        budget was once listed under "rejected" beside settings shown slower)."""
        return [r for r in self.rejected if r.reason.startswith(f"{protocol.BUDGET}:")]

    @property
    def losers(self) -> list[Rejection]:
        """The rejections that were measured: slower, failing, drifting, over memory."""
        return [r for r in self.rejected if r not in self.unfinished]

    @property
    def kept_baseline(self) -> bool:
        """Nothing beat the baseline: there is no tuned setting to claim a speed-up for."""
        return self.knobs == self.baseline_knobs

    @property
    def speedup(self) -> float | None:
        """Tuned over baseline; None when the baseline was kept (its runs measured against
        themselves would only show noise: 1.72x once, for the defaults kept)."""
        if self.kept_baseline:
            return None
        return self.tuned_samples_per_s / self.baseline_samples_per_s
