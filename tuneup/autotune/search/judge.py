"""Judging results: speed, noise margins, and what disqualifies a trial. Pure functions of
measurements; recording a rejection is the search's business."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tuneup.autotune import protocol
from tuneup.autotune.space import CUDA_GRAPH_MODES, GROUPS, ScriptFacts
from tuneup.autotune.trials import TrialResult
from tuneup.settings import Knobs


@dataclass
class Options:
    groups: frozenset[str] = frozenset(GROUPS)
    expected_steps: int = 5000
    loss_tolerance: float = 0.05  # relative distance from the fp32 losses that is accepted
    min_gain: float = 0.03  # smallest speed-up worth a change, even on a quiet machine
    max_memory_bytes: int | None = None
    memory_headroom: float = 0.85  # share of --max-memory a chosen micro-batch may use

    @property
    def tie(self) -> float:
        """``min_gain`` on the log scale of paired step-time ratios: closer is a tie."""
        return math.log(1 + self.min_gain)


@dataclass
class Rejection:
    """``on_speed``: lost a comparison of speeds (not a failure or a drift), so a closer
    comparison later in the search may word it again."""

    trial_id: str
    reason: str
    on_speed: bool = False


@dataclass
class Judge:
    """Compares results of one search: speeds in the job's samples/s (every rank's
    effective batch per optimizer step)."""

    options: Options
    facts: ScriptFacts = field(default_factory=ScriptFacts)
    reference_losses: list[float] = field(default_factory=list)

    def speed(self, result: TrialResult) -> float:
        if result.step_time:
            return self.facts.samples_per_step / result.step_time
        return result.samples_per_s or 0.0

    def margin(self, a: TrialResult, b: TrialResult) -> float:
        """Relative difference that counts as real between two measurements."""
        return max(self.options.min_gain, 2 * math.hypot(a.noise, b.noise))

    def better(self, candidate: TrialResult, reference: TrialResult) -> bool:
        threshold = self.speed(reference) * (1 + self.margin(candidate, reference))
        return self.speed(candidate) > threshold

    def within_noise(self, a: TrialResult, b: TrialResult) -> bool:
        return not self.better(a, b) and not self.better(b, a)

    def versus(self, candidate: TrialResult, reference: TrialResult) -> str:
        """Why a candidate was not taken: ``slower (-40%)`` beyond the two windows' noise,
        ``likely slower (-12%)`` beyond ``min_gain`` but not their noise, otherwise ``within
        noise (+6.0%)``."""
        gain = self.speed(candidate) / self.speed(reference) - 1
        if self.better(reference, candidate):
            return f"slower ({gain:+.0%})"
        if self.speed(reference) > self.speed(candidate) * (1 + self.options.min_gain):
            return f"likely slower ({gain:+.0%})"
        return f"within noise ({gain:+.1%})"

    def needs_check(self, knobs: Knobs) -> bool:
        """Whether a sweep's run of ``knobs`` is usable only loss-checked: CUDA graphs
        replaying micro-batches that accumulate into captured gradient buffers, where a
        wrong replay changes the training, not the speed."""
        batch = self.facts.effective_batch
        accumulating = (knobs.micro_batch_size or batch) < batch
        return knobs.compile_mode in CUDA_GRAPH_MODES and accumulating

    def problem(self, result: TrialResult) -> str | None:
        """Why ``result`` cannot be used — a failure, non-finite or drifting losses, memory
        over the cap — or None when it can."""
        if result.status != protocol.OK or result.step_time is None and not result.samples_per_s:
            return f"{result.status}: {result.message}".rstrip(": ")
        knobs = result.trial.knobs
        if knobs.micro_batch_size is not None and result.micro_batch_blocked:
            # whole batches ran: its speed is not the micro-batch's, and the run would refuse it
            return (f"micro_batch_size={knobs.micro_batch_size} not applied: "
                    f"{result.micro_batch_blocked}")
        if result.trial.check:
            drift = loss_drift(result.check_losses, self.reference_losses)
            if drift > self.options.loss_tolerance:
                if result.check_losses and not all(map(math.isfinite, result.check_losses)):
                    return "loss went non-finite"
                if drift == math.inf:
                    return "no comparable check losses"
                return (f"loss left the fp32 trajectory by {drift:.1%} "
                        f"(tolerance {self.options.loss_tolerance:.0%})")
        if self.needs_check(knobs) and not result.trial.check:
            return "CUDA graphs with accumulation need the loss check"
        cap = self.options.max_memory_bytes
        if cap and result.peak_memory_bytes and result.peak_memory_bytes > cap:
            return f"peak memory {result.peak_memory_bytes / 2**30:.2f} GiB above --max-memory"
        return None


def loss_drift(losses: list[float] | None, reference: list[float]) -> float:
    """Largest relative distance of ``losses`` from the reference trajectory (inf if unusable)."""
    if not losses or len(losses) < len(reference) or not all(map(math.isfinite, losses)):
        return math.inf
    return max(abs(a - b) / max(abs(b), 1e-3) for a, b in zip(losses, reference))
