"""The search's decisions on recorded timings with injected noise, on the simulated clock:
how often the pick is right when every window is disturbed.

The workload: the right settings are 2 workers, bfloat16 and compile (2.4x over defaults);
1-2 % differences (threads, micro-batch) are ties, and picks within 3 % of the best count as
right. Noise: per step, Gaussian jitter of the given size; per window, interference that only
slows it down (the absolute value of a Gaussian of the same size), as on a shared machine.
"""

from __future__ import annotations

import random

import pytest
from test_search import FP32_LOSSES, search

from tuneup.autotune.search import Options
from tuneup.settings import Knobs

WORKERS = {0: 1.6, 1: 1.15, 2: 1.0, 4: 1.04}


def true_step(knobs: Knobs) -> float:
    step = 0.10 * WORKERS.get(knobs.num_workers or 0, 1.1)
    step *= 0.75 if knobs.amp_dtype == "bfloat16" else 1.0
    step *= 0.9 if knobs.compile_mode else 1.0
    step *= 1.01 if knobs.cpu_threads == 1 else 1.0
    return step * (1.02 if knobs.micro_batch_size else 1.0)


BEST = min(true_step(Knobs(num_workers=w, amp_dtype=a, compile_mode=c))
           for w in WORKERS for a in (None, "bfloat16") for c in (None, "default"))


def noisy(noise: float, rng: random.Random):
    def timing(knobs: Knobs) -> dict:
        step, slow = true_step(knobs), 1 + abs(rng.gauss(0, noise))
        return {"status": "ok", "step_s_all": [step * slow * max(0.5, rng.gauss(1, noise))
                                               for _ in range(9)],
                "warmup_s": 0.5 + (16.0 if knobs.compile_mode else 0.0),
                "data_wait_share": 0.05 if knobs.num_workers else 0.4,
                "check_losses": FP32_LOSSES, "peak_memory_bytes": 2**30, "message": ""}
    return timing


def right_picks(noise: float, seeds: int) -> float:
    right = 0
    for seed in range(seeds):
        tuner, _ = search(noisy(noise, random.Random(seed)), Options(), budget=300)
        right += true_step(tuner.run().knobs) <= BEST / 0.97
    return right / seeds


# Measured on 300-seed sets (0-299, 1000-1299, 2000-2299, 3000-3299): 5 % noise 1.00; 10 %
# 1.00; 20 % 0.967, 0.973, 0.973, 0.977 (0.893 before the races were paced to the budget,
# with a stop rule per comparison). The target for 20 % is 0.95; the floors here
# guard what is reached, a few seeds below what was measured on these seeds (0-299).
@pytest.mark.parametrize(("noise", "share"), [(0.05, 0.98), (0.10, 0.98), (0.20, 0.95)])
def test_the_right_pick_under_noise(noise, share):
    assert right_picks(noise, seeds=300) >= share
