"""What the search can afford: expected trial times, timeouts, and reserves for later work."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from tuneup.autotune import protocol, space
from tuneup.autotune.space import ScriptFacts
from tuneup.autotune.trials import Trial, TrialResult
from tuneup.settings import Knobs

COMPILE_GUESS_S = 20.0  # compile-trial overhead assumed before one has been measured
# A later process of the same run compiles the same graphs from the run's inductor cache (the
# children share the run's TMPDIR): dynamo still traces, inductor loads its compiled code.
# Measured on 2 cores: 1.4 s against 11.4 s cold for docs/examples/train_images.py, 1.4 s
# against 9.4 s for train_mlp.py; a quarter of the cold compile leaves room for larger graphs.
WARM_COMPILE_SHARE = 0.25
DEFAULT_STARTUP_S = 5.0
CONFIRM_ROUNDS = 1  # held for the confirmation while the stages run
WINDOW = protocol.WINDOW_DEFAULTS


class Executor(Protocol):
    """Runs trials (the :class:`~tuneup.autotune.runner.Runner`, or recorded timings in tests)."""

    facts: ScriptFacts | None
    startup_s: float | None

    def run(self, trials: list[Trial],
            stop: Callable[[TrialResult], bool] | None = None) -> list[TrialResult]: ...

    def time_left(self) -> float: ...

    def live_process(self) -> bool:
        """Whether the next :meth:`run` goes on in a process that waits for it."""

    def held_graphs(self) -> Knobs | None:
        """The compiled graphs (knobs less the loader's) that waiting process holds, None
        where no process waits or it compiled nothing."""


class Budget:
    """Time estimates from what has been measured so far.

    ``typical`` is the result trial times are estimated from (the incumbent's latest run),
    ``baseline`` the defaults' run; ``reserve_s`` is what the current stage must leave for
    later ones; ``compile_s`` the measured cost of a cold compile (0 until the compile
    stage). Every later plan compiling the same settings (a race's next plan, the
    confirmation) is priced at :meth:`warm_compile_seconds` instead: a fresh process loads
    them from the run's cache, and a live one holds only the graphs it compiled last.
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
        return warmup + window + (WINDOW["check_steps"] + 1) * step + 0.5 + self._own_process()

    def _own_process(self) -> float:
        """The start-up each trial pays where the script's trainer runs one trial a process."""
        return self.startup_seconds() if self._one_trial_a_process() else 0.0

    def _one_trial_a_process(self) -> bool:
        facts = self.executor.facts
        return facts is not None and bool(facts.trials_per_process)

    def plan_startup_seconds(self) -> float:
        """The start-up a new plan's process adds to its trials' own times: none where each
        trial already pays one (a trainer's), which would otherwise be counted twice."""
        return 0.0 if self._one_trial_a_process() else self.startup_seconds()

    def timeout(self, trial: Trial) -> float:
        """Per-trial timeout for the runner: generous, and longer for compile trials."""
        if self.baseline is None:
            return 300.0
        seconds = max(60.0, 10 * self.trial_seconds())
        return seconds + (600.0 if trial.knobs.compile_mode else 0.0)

    def startup_seconds(self) -> float:
        """A process's start-up, measured (or the default before one): what reserves for
        later work hold, since a failure until then ends the live process."""
        return self.executor.startup_s or DEFAULT_STARTUP_S

    def next_startup_seconds(self) -> float:
        """What the next plan pays before its first trial: nothing while a process waits
        for it (see :meth:`Executor.live_process`)."""
        return 0.0 if self.executor.live_process() else self.plan_startup_seconds()

    def compile_seconds(self) -> float:
        """Expected cost of one compile stage: two trials and a first compile (in the
        process that waits for them, or a new one's start-up), and the warm compile a
        compiled pick's confirmation pays (without it a found compile goes unconfirmed: it
        is held from earlier races and low-impact stages)."""
        return (self.next_startup_seconds() + 2 * self.trial_seconds() + COMPILE_GUESS_S
                + self.warm_compile_seconds())

    def warm_compile_seconds(self, cold_s: float | None = None) -> float:
        """What a process pays to compile settings an earlier process of the run compiled
        cold in ``cold_s`` (default: the measured compile, or the guess before one)."""
        return WARM_COMPILE_SHARE * (cold_s or self.compile_s or COMPILE_GUESS_S)

    def compile_fits(self, facts: ScriptFacts) -> bool:
        """Whether a compile stage fits in what is left (it is worth keeping room for)."""
        left = self.time_left() - self.confirm_reserve() - self.compile_seconds()
        return bool(space.compile_modes(facts)) and left >= 0

    def confirm_reserve(self) -> float:
        """One confirmation round of the pick and the defaults, in a process that compiles
        (warm) once when the pick is compiled and no waiting process holds its graphs (see
        :meth:`holds_pick`): with the runs the stages made of each (the
        baseline, the incumbent re-run beside every stage's candidates, the races) one more
        pair gives the pick's interval; what the stages leave over buys more rounds."""
        rounds = CONFIRM_ROUNDS * (self.trial_seconds() + self.trial_seconds(self.baseline))
        compile_s = (self.warm_compile_seconds() if self.compile_s and not self.holds_pick()
                     else 0.0)
        return self.plan_startup_seconds() + compile_s + rounds

    def holds_pick(self) -> bool:
        """Whether a waiting process holds the graphs the confirmation would compile: the
        incumbent's where it is compiled; while it is eager (the compile stage's race), any
        (those of the race's compiled contender, the pick should compile win)."""
        knobs = self.typical.trial.knobs if self.typical is not None else None
        held = self.executor.held_graphs()
        return held is not None and knobs is not None and (
            not knobs.compile_mode or knobs.without_loader() == held)

    def affordable(self, trials: int, extra_s: float = 0.0, confirmation: bool = True) -> int:
        """How many of ``trials`` fit in the budget after a reserve for one confirmation round
        (unless ``confirmation`` is False) and ``reserve_s`` (in low-impact stages, the
        compile stage still to come; in the compile stage, the loader stage after it)."""
        spare = self._spare(extra_s) + (0.0 if confirmation else self.confirm_reserve())
        return max(0, min(trials, int(spare // self.trial_seconds())))

    def still_fits(self, seconds: float) -> bool:
        """Whether ``seconds`` more in a process already running (no start-up to pay) leave
        the reserves :meth:`affordable` planned it with. A plan is priced from estimates;
        trials that run long (a noisy stretch, a compile slower than guessed) end it early
        rather than take the confirmation's share."""
        return seconds <= self._unreserved()

    def shortfall(self, trials: int, extra_s: float = 0.0) -> float:
        """Seconds of budget missing for ``trials`` more and ``extra_s`` (0 when they fit)."""
        return max(0.0, trials * self.trial_seconds() - self._spare(extra_s))

    def _spare(self, extra_s: float = 0.0) -> float:
        """What the next plan's trials may spend: it pays ``extra_s`` and a start-up when
        no process waits for it."""
        return self._unreserved() - self.next_startup_seconds() - extra_s

    def _unreserved(self) -> float:
        """The time left beyond the confirmation's reserve and ``reserve_s``."""
        return self.time_left() - self.confirm_reserve() - self.reserve_s
