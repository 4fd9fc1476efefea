"""Trials and their results, with the timing statistics in one place.

Shaped like ``torch.utils.benchmark``'s ``Measurement``: raw step times go in, derived
figures (mean, median, IQR, standard error, interval) come out, and replicates of the same
knobs merge into one. Every other module reads these figures; none recomputes them.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from tuneup.autotune import protocol
from tuneup.settings import Knobs

DEFAULT_NOISE = 0.05  # relative standard error assumed when a window is too short to tell
MIN_NOISE = 0.005


@dataclass(frozen=True)
class Trial:
    """One point to measure: an id, the knobs, and whether to record check losses."""

    id: str
    knobs: Knobs
    check: bool = False

    def plan_entry(self) -> dict[str, Any]:
        return {"id": self.id, "knobs": self.knobs.to_dict(), "check": self.check}


@dataclass(frozen=True)
class Timing:
    """Step times of one measuring window (seconds), and what follows from them."""

    times: tuple[float, ...]
    block: int = 3  # steps per block mean: absorbs a loader's bursts and interference

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.times) if self.times else None

    @property
    def median(self) -> float | None:
        return statistics.median(self.times) if self.times else None

    @property
    def iqr(self) -> float | None:
        if len(self.times) < 4:
            return None
        quartiles = statistics.quantiles(self.times, n=4)
        return quartiles[2] - quartiles[0]

    @property
    def noise(self) -> float:
        """Relative standard error of :attr:`mean`, from block means of the steps."""
        size, times = self.block, self.times
        means = [statistics.fmean(times[i:i + size]) for i in range(0, len(times) - size + 1, size)]
        if len(means) < 2:
            return DEFAULT_NOISE
        return max(MIN_NOISE,
                   statistics.stdev(means) / statistics.fmean(means) / math.sqrt(len(means)))


@dataclass
class TrialResult:
    """What happened to one trial, from its ``trial_end`` event or from the parent."""

    trial: Trial
    status: str
    samples_per_s: float | None = None
    step_s: float | None = None
    step_s_all: list[float] = field(default_factory=list)
    data_wait_share: float | None = None
    # the step's time split: seconds a step the device was busy (CUDA events around the
    # step; on a CPU the compute, the step less its data wait), and the host's (CUDA: the
    # step's wall time less device and data wait: Python, launches, syncs, copies)
    device_s: float | None = None
    host_s: float | None = None
    warmup_s: float | None = None
    check_losses: list[float] | None = None
    peak_memory_bytes: int | None = None
    micro_batch_size: int | None = None  # what the child applied (None: whole batches)
    micro_batch_blocked: str | None = None  # why the script cannot be micro-batched
    input_shapes: int | None = None  # distinct batch shapes in the measured window
    message: str = ""

    @classmethod
    def from_event(cls, trial: Trial, event: dict[str, Any]) -> TrialResult:
        def number(key: str) -> float | None:
            value = event.get(key)
            return float(value) if _is_number(value) and math.isfinite(value) else None

        losses = event.get("check_losses")
        peak = event.get("peak_memory_bytes")
        micro = event.get("micro_batch_size")
        blocked = event.get("micro_batch_blocked")
        shapes = event.get("input_shapes")
        return cls(
            trial=trial,
            status=str(event.get("status") or protocol.ERROR),
            samples_per_s=number("samples_per_s"),
            step_s=number("step_s"),
            step_s_all=[float(s) for s in event.get("step_s_all") or [] if _is_number(s) and s > 0],
            data_wait_share=number("data_wait_share"),
            device_s=number("device_s"),
            host_s=number("host_s"),
            warmup_s=number("warmup_s"),
            check_losses=[_loss(v) for v in losses] if isinstance(losses, list) else None,
            peak_memory_bytes=int(peak) if _is_number(peak) else None,
            micro_batch_size=int(micro) if _is_number(micro) else None,
            micro_batch_blocked=str(blocked) if blocked else None,
            input_shapes=int(shapes) if _is_number(shapes) and shapes >= 1 else None,
            message=str(event.get("message") or ""),
        )

    @property
    def ok(self) -> bool:
        return self.status == protocol.OK and self.step_time is not None

    @property
    def ran(self) -> bool:
        """The trial ran (whatever its outcome): not skipped by a stop rule or the budget."""
        return self.status not in (protocol.SKIPPED, protocol.BUDGET)

    @property
    def timing(self) -> Timing:
        return Timing(tuple(self.step_s_all), block=max(3, 2 * (self.trial.knobs.num_workers or 0)))

    @property
    def step_time(self) -> float | None:
        """Mean optimizer-step time over the measured window.

        The whole window counts: a loader's queue fills while the model is slow and empties
        in a burst of fast steps, so any selection of "good" steps would flatter it.
        """
        if self.step_s is not None:
            return self.step_s
        return self.timing.mean

    @property
    def noise(self) -> float:
        """Relative standard error of :attr:`step_time` (see :attr:`Timing.noise`)."""
        return self.timing.noise

    @property
    def breakdown(self) -> dict[str, float] | None:
        """Where a step's time goes, in seconds: ``data_wait``, ``device`` (the compute on a
        CPU) and ``host`` (0 where not measured apart); None without a step time."""
        step = self.step_time
        if not step:
            return None
        wait = min(step, step * (self.data_wait_share or 0.0))
        busy = step - wait
        device = busy if self.device_s is None else min(busy, max(0.0, self.device_s))
        host = busy - device if self.host_s is not None or self.device_s is not None else 0.0
        return {"step": step, "data_wait": wait, "device": device, "host": host}


def typical_step(results: list[TrialResult]) -> float:
    """The step time decisions compare for replicates of the same knobs: the mean of the
    faster half of their windows. Interference on a shared machine only ever slows a window
    down, so the fast windows are the machine's own speed; half of them, not the single
    fastest, so that one lucky window of noisy settings does not win."""
    times = sorted(r.step_time for r in results if r.ok and r.step_time)
    if not times:
        return math.inf
    return statistics.fmean(times[:max(1, (len(times) + 1) // 2)])


def paired_steps(a: list[TrialResult], b: list[TrialResult]) -> tuple[list[float], list[float]]:
    """Step times of runs taken next to each other in time (the i-th of each), for
    :func:`log_ratio_interval`; a pair where either run failed is left out."""
    pairs = [(x.step_time, y.step_time) for x, y in zip(a, b)
             if x.ok and y.ok and x.step_time and y.step_time]
    return [x for x, _ in pairs], [y for _, y in pairs]


def student_t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom, through the regularised
    incomplete beta function: I_x(df/2, 1/2) with x = df / (df + t^2) is P(|T| > |t|)."""
    tail = _incomplete_beta(df / (df + t * t), df / 2, 0.5) / 2
    return 1 - tail if t > 0 else tail


@functools.lru_cache(maxsize=256)
def student_t_quantile(p: float, df: int) -> float:
    """The t with ``student_t_cdf(t, df) == p`` (0.5 < p < 1), by bisection."""
    low, high = 0.0, 1e3
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if student_t_cdf(middle, df) < p else (low, middle)
    return (low + high) / 2


def _incomplete_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b) by its continued fraction (modified Lentz), on the side where it converges
    fast (x < (a + 1) / (a + b + 2), else through I_x(a, b) = 1 - I_{1-x}(b, a))."""
    if x <= 0.0 or x >= 1.0:
        return max(0.0, min(1.0, x))
    if x > (a + 1) / (a + b + 2):
        return 1 - _incomplete_beta(1 - x, b, a)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c if abs(1 + numerator / c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1) < 1e-12:
            break
    return front * fraction


def _log_ratios(slower: list[float], faster: list[float]) -> list[float]:
    return [math.log(a / b) for a, b in zip(slower, faster) if a > 0 and b > 0]


def log_ratio_interval(slower: list[float], faster: list[float]) -> tuple[float, float] | None:
    """95 % interval (Student's t) of the mean of ``log(slower_i / faster_i)`` over paired
    measurements (each pair taken next to each other in time); None with fewer than two."""
    logs = _log_ratios(slower, faster)
    if len(logs) < 2:
        return None
    centre = statistics.fmean(logs)
    half = student_t_quantile(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return centre - half, centre + half


def log_ratio_interval_pooled(slower: list[float], faster: list[float]
                              ) -> tuple[float, float] | None:
    """95 % interval (Welch's t) of ``mean(log slower) - mean(log faster)`` over independent
    runs of each side, any number of each; None with fewer than two on either side."""
    a = [math.log(x) for x in slower if x > 0]
    b = [math.log(x) for x in faster if x > 0]
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    centre = statistics.fmean(a) - statistics.fmean(b)
    if va + vb == 0:
        return centre, centre
    # Welch-Satterthwaite degrees of freedom, rounded down (the cautious side)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = student_t_quantile(0.975, max(1, int(df))) * math.sqrt(va + vb)
    return centre - half, centre + half


def confidence_faster(slower: list[float], faster: list[float]) -> float | None:
    """How sure the paired measurements make it that ``faster`` is the faster side: the
    one-sided t probability that the mean of ``log(slower_i / faster_i)`` is above 0 (what
    a flat prior gives as the chance it truly is). None with fewer than two pairs."""
    logs = _log_ratios(slower, faster)
    if len(logs) < 2:
        return None
    centre, spread = statistics.fmean(logs), statistics.stdev(logs)
    if spread == 0:
        return 1.0 if centre > 0 else 0.0 if centre < 0 else 0.5
    return student_t_cdf(centre / (spread / math.sqrt(len(logs))), len(logs) - 1)


def merge(results: list[TrialResult]) -> TrialResult | None:
    """One result from re-runs of the same knobs: the fastest window, counting its noise.

    Interference on a shared machine only ever slows a window down, so the fastest run is
    the closest to the machine's own speed. "Fastest" is judged by the upper end of each
    run's step time (mean + 2 standard errors): a clean run beats an erratic one.
    """
    ok = [r for r in results if r.ok]
    return min(ok, key=lambda r: (r.step_time or math.inf) * (1 + 2 * r.noise)) if ok else None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _loss(value: Any) -> float:
    return float(value) if _is_number(value) else math.nan
