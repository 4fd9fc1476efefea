"""What the search can afford: expected trial times, timeouts, and reserves for later work."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from tuneup.autotune import protocol, space
from tuneup.autotune.space import ScriptFacts
from tuneup.autotune.trials import Trial, TrialResult

COMPILE_GUESS_S = 20.0  # compile-trial overhead assumed before one has been measured
DEFAULT_STARTUP_S = 5.0
WINDOW = protocol.WINDOW_DEFAULTS


class Executor(Protocol):
    """Runs trials (the :class:`~tuneup.autotune.runner.Runner`, or recorded timings in tests)."""

    facts: ScriptFacts | None
    startup_s: float | None

    def run(self, trials: list[Trial],
            stop: Callable[[TrialResult], bool] | None = None) -> list[TrialResult]: ...

    def time_left(self) -> float: ...


class Budget:
    """Time estimates from what has been measured so far.

    ``typical`` is the result trial times are estimated from (the incumbent's latest run),
    ``baseline`` the defaults' run; ``reserve_s`` is what the current stage must leave for
    later ones; ``compile_s`` the measured cost of a cold compile (0 until the compile
    stage), which a confirmation of compiled settings pays once.
    """

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self.baseline: TrialResult | None = None
        self.typical: TrialResult | None = None
        self.reserve_s = 0.0
        self.compile_s = 0.0

    def time_left(self) -> float:
        return self.executor.time_left()

    def trial_seconds(self, like: TrialResult | None = None) -> float:
        """Expected wall time of one trial like ``like`` (default: the incumbent's last one)."""
        base = like or self.typical or self.baseline
        step = base.step_time if base and base.step_time else 0.5
        warmup = base.warmup_s if base and base.warmup_s is not None else 2 * step
        window = max(WINDOW["min_measure_seconds"], WINDOW["measure_steps"] * step)
        return warmup + window + (WINDOW["check_steps"] + 1) * step + 0.5

    def timeout(self, trial: Trial) -> float:
        """Per-trial timeout for the runner: generous, and longer for compile trials."""
        if self.baseline is None:
            return 300.0
        seconds = max(60.0, 10 * self.trial_seconds())
        return seconds + (600.0 if trial.knobs.compile_mode else 0.0)

    def startup_seconds(self) -> float:
        return self.executor.startup_s or DEFAULT_STARTUP_S

    def compile_seconds(self) -> float:
        """Expected cost of one compile stage: a process, two trials and a first compile,
        and the second compile a compiled pick's confirmation pays (without it a found
        compile goes unconfirmed: it is held from earlier races and low-impact stages)."""
        return self.startup_seconds() + 2 * self.trial_seconds() + 2 * COMPILE_GUESS_S

    def compile_fits(self, facts: ScriptFacts) -> bool:
        """Whether a compile stage fits in what is left (it is worth keeping room for)."""
        left = self.time_left() - self.confirm_reserve() - self.compile_seconds()
        return bool(space.compile_modes(facts)) and left >= 0

    def confirm_reserve(self) -> float:
        """Two confirmation rounds of the pick and the defaults, in a process that compiles
        once when the pick is compiled."""
        rounds = 2 * (self.trial_seconds() + self.trial_seconds(self.baseline))
        return self.startup_seconds() + self.compile_s + rounds

    def affordable(self, trials: int, extra_s: float = 0.0) -> int:
        """How many of ``trials`` fit in the budget after a reserve for one confirmation round
        (and, in low-impact stages, for the compile stage still to come)."""
        return max(0, min(trials, int(self._spare(extra_s) // self.trial_seconds())))

    def shortfall(self, trials: int) -> float:
        """Seconds of budget missing for ``trials`` more (0 when they fit)."""
        return max(0.0, trials * self.trial_seconds() - self._spare())

    def _spare(self, extra_s: float = 0.0) -> float:
        reserve = self.confirm_reserve() + self.reserve_s
        return self.time_left() - reserve - self.startup_seconds() - extra_s
