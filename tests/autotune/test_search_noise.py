"""The search's decisions on recorded timings with injected noise, on the simulated clock:
how often the pick is right when every window is disturbed.

The workload: the right settings are 2 workers, bfloat16 and compile (2.4x over defaults);
1-2 % differences (threads, micro-batch) are ties, and picks within 3 % of the best count as
right. Noise: per step, Gaussian jitter of the given size; per window, interference that only
slows it down (the absolute value of a Gaussian of the same size), as on a shared machine;
optionally, slow stretches of the machine that span several trials (another job for tens of
seconds), which can cover a race's last rounds or a whole confirmation.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable

import pytest
from test_search import FP32_LOSSES, search

from tuneup.autotune.search import Options
from tuneup.settings import Knobs

WORKERS = {0: 1.6, 1: 1.15, 2: 1.0, 4: 1.04}


def true_step(knobs: Knobs, compiled: float = 0.9) -> float:
    """``compiled``: the step under compile over the eager step."""
    step = 0.10 * WORKERS.get(knobs.num_workers or 0, 1.1)
    step *= 0.75 if knobs.amp_dtype == "bfloat16" else 1.0
    step *= compiled if knobs.compile_mode else 1.0
    step *= 1.01 if knobs.cpu_threads == 1 else 1.0
    return step * (1.02 if knobs.micro_batch_size else 1.0)


def best(compiled: float = 0.9) -> float:
    return min(true_step(Knobs(num_workers=w, amp_dtype=a, compile_mode=c), compiled)
               for w in WORKERS for a in (None, "bfloat16") for c in (None, "default"))


class SlowStretches:
    """Quiet and slow spells of the machine alternating on the simulated clock, of
    exponential lengths (means ``quiet_s`` and ``slow_s``); in a slow one every step takes
    ``slowdown`` longer. In the demo of 2026-11-25 every run of a confirmation was 15-20 %
    slower than the same settings in the stage before it."""

    def __init__(self, rng: random.Random, slowdown: float, quiet_s: float = 40.0,
                 slow_s: float = 20.0, horizon_s: float = 1000.0) -> None:
        self.slowdown = slowdown
        self.edges: list[float] = []
        t, slow = 0.0, False
        while t < horizon_s:
            t += rng.expovariate(1 / (slow_s if slow else quiet_s))
            self.edges.append(t)
            slow = not slow

    def factor(self, t: float) -> float:
        return 1 + self.slowdown if bisect.bisect_right(self.edges, t) % 2 else 1.0


def noisy(noise: float, rng: random.Random, stretches: SlowStretches | None = None,
          clock: Callable[[], float] = lambda: 0.0, compiled: float = 0.9):
    def timing(knobs: Knobs) -> dict:
        step, slow = true_step(knobs, compiled), 1 + abs(rng.gauss(0, noise))
        if stretches is not None:
            slow *= stretches.factor(clock())
        return {"status": "ok", "step_s_all": [step * slow * max(0.5, rng.gauss(1, noise))
                                               for _ in range(9)],
                "warmup_s": 0.5 + (16.0 if knobs.compile_mode else 0.0),
                "data_wait_share": 0.05 if knobs.num_workers else 0.4,
                "check_losses": FP32_LOSSES, "peak_memory_bytes": 2**30, "message": ""}
    return timing


def picks(noise: float, seeds: int, slowdown: float = 0.0, first_seed: int = 0,
          compiled: float = 0.9) -> tuple[float, float]:
    """Shares of seeds whose pick is right, and whose speed-up is confirmed."""
    right = confirmed = 0
    for seed in range(first_seed, first_seed + seeds):
        rng = random.Random(seed)
        executor = []  # its simulated clock times the slow stretches; trials run after this
        stretches = SlowStretches(rng, slowdown) if slowdown else None
        timing = noisy(noise, rng, stretches, lambda: executor[0].clock, compiled)
        tuner, recorded = search(timing, Options(), budget=300)
        executor.append(recorded)
        outcome = tuner.run()
        right += true_step(outcome.knobs, compiled) <= best(compiled) / 0.97
        confirmed += outcome.confirmed and recorded.clock <= 300
    return right / seeds, confirmed / seeds


# Measured on 300-seed sets (0-299, 1000-1299, 2000-2299, 3000-3299): 5 % noise 1.00; 10 %
# 1.00 in all four; 20 % 0.973, 0.970, 0.980, 0.983 with amp ahead of the loader on this
# input-bound workload (before, 0.977, 0.977, 0.987, 0.980: a process whose trials run long ends
# for the confirmation; before, 0.983, 0.977, 0.983, 0.983 with a contender shown slower
# dropped from its race mid-process and decisions on every paired round; before that,
# 0.980, 0.970, 0.990, 0.987), every result confirmed within the budget but one
# (with a confirmation that runs until each comparison is settled: 0.970, 0.967, 0.983, 0.950
# with a fixed 12 rounds). Before, 20 % gave 0.893 with a fixed repeat count, then
# 0.967-0.977 with races paced to the budget, but a third of those results went unconfirmed:
# the compile race spent the confirmation's compile. The floors guard seeds 0-299 at 20 %
# noise, 0-149 at 5 and 10 %: each 150-seed half of seeds 0-299 and 1000-1299 measured 1.000
# and 0.993-1.000 there, all confirmed (the floor allows 3 misses); at 20 % the halves span
# 0.960-0.993, too close to 0.95 for fewer seeds.
@pytest.mark.parametrize(("noise", "share", "seeds"),
                         [(0.05, 0.98, 150), (0.10, 0.98, 150), (0.20, 0.95, 300)])
def test_the_right_pick_under_noise(noise, share, seeds):
    right, confirmed = picks(noise, seeds=seeds)
    assert right >= share
    # confirmed only when the speed-up's interval excludes 1: at 20 % noise 2 of seeds 0-299
    # (5, 224) keep a simpler pick with two runs of its own, [0.99, 5.30] and [0.63, 9.89]
    assert confirmed >= (0.99 if noise >= 0.2 else 1.0)


# Slow stretches of +25 % (quiet spells of 40 s and slow ones of 20 s on average) on top of
# the per-window noise, measured on the same four seed sets, with compile 10 % faster
# (compiled=0.9) or 5 % slower (1.05): 10 % noise 0.993-1.000 either way; 20 % noise
# 0.943-0.963 and 0.957-0.973 (compile 10 % faster: 0.933, 0.960, 0.940, 0.957 once a
# process's trials that run long end it for the confirmation; 0.940, 0.960, 0.957, 0.950
# with amp ahead of the loader). A stretch that covers one side of a comparison and not the
# other is what paired rounds cancel and unpaired ones cannot; at 20 % noise it costs the
# pick 2-4 points. The floors guard seeds 0-299 at 20 % noise, 0-149 at 10 % (each 150-seed
# half of seeds 0-299 and 1000-1299 measured 0.993 either way, all confirmed).
@pytest.mark.parametrize(("noise", "compiled", "share", "seeds"),
                         [(0.10, 0.9, 0.98, 150), (0.10, 1.05, 0.98, 150), (0.20, 0.9, 0.93, 300)])
def test_the_right_pick_through_slow_stretches(noise, compiled, share, seeds):
    right, confirmed = picks(noise, seeds=seeds, slowdown=0.25, compiled=compiled)
    assert right >= share
    assert confirmed >= 0.99


def test_the_speedup_interval_covers_the_true_speedup():
    """The reported interval (every run of the pick and the defaults, Welch's t) holds the
    true speed-up of the pick in >= 90 % of seeds at 10 % noise (measured 0.94 on seeds
    0-99; the slow-only interference is not in a t interval's model), and always holds the
    reported speed-up: both come from the same runs."""
    covered = 0
    for seed in range(100):
        outcome = search(noisy(0.10, random.Random(seed)), Options(), budget=300)[0].run()
        low, high = outcome.speedup_interval
        covered += low <= true_step(Knobs()) / true_step(outcome.knobs) <= high
        assert low <= outcome.speedup <= high
    assert covered >= 90
