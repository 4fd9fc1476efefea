"""The search's policy in one place: each stage's ceiling, the order, and the spend.

A stage's ceiling is the most it can gain on this run by Amdahl's law, from the step's time
split of the incumbent's latest run (:attr:`TrialResult.breakdown`): the loader can at most
remove the data wait; amp and compile can at most shrink the device's (a CPU's compute)
time by what the hardware offers; pin_memory and CUDA graphs can at most remove host time.
Stages run in order of ceiling, recomputed after every stage from the incumbent's run (once
workers feed the GPU, amp's ceiling rises); a stage whose ceiling is within the measured
noise is skipped with a note saying why. The loader's first point is predicted from the
same split: the workers that hide the data time behind the rest of the step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuneup.autotune import space
from tuneup.autotune.space import ScriptFacts
from tuneup.autotune.trials import TrialResult
from tuneup.settings import Knobs

# Upper bounds of a change's effect on the part of the step it acts on, each an upper bound
# of what was measured, not a fit to one run:
# bfloat16 on a GPU: dense bf16 tensor-core rates are 8-16x fp32 SIMT rates (A100: 312 vs
# 19.5 TFLOPS; H100/H200: 990 vs 67); the H200 decoder of 2026-11-28 measured 5.5x
AMP_GPU = 8.0
# bfloat16 on a CPU the child found fast (AVX512-BF16 / AMX): the MLP example measured
# 2.0-2.9x on an AMD EPYC (docs/benchmarks.md, 2026-11-25); where slow, it is not offered
AMP_CPU = 3.0
TF32_GPU = 4.0  # TF32 matmuls: 8x the fp32 rate on A100/H100 dense, halved for the rest
COMPILE = 1.5  # inductor on the device's work (PyTorch 2.0's suites: 1.3-1.5x on average)
COMPILE_HOST = 0.5  # share of host time compile's fewer, fused kernels can remove
# cuDNN's autotuner on convolutions: picks among algorithms the heuristics may miss
CUDNN = 1.25
# a CPU micro-batch gains at most cache effects: in 12 grids of four workloads on 2 cores
# the best micro-batched point was never 3 % ahead of the best whole batch
CPU_MICRO_BATCH = 1.03
# workers decode in parallel less than linearly (H200 images: 4 workers 3.4x one, 8 workers
# 6.4x): the predicted count has this headroom
WORKER_HEADROOM = 1.25


# a ceiling worth more than telling two close settings apart: a stage's race stops at two
# rounds while a stage with such a ceiling is still to run (the winner of a near-tie gains
# a few %, the stage to come up to this much)
LARGE_GAIN = 1.2
# the data-wait share at which an amp candidate's gain counts as hidden by the loader: the loop
# waits for data a third of the step or more (workers would shorten that step further)
HIDDEN_BY_WAIT = 0.3
# the host time CUDA graphs and compile's fewer kernels can remove, as a multiple of the host
# time the step took with no workers beside it: what the step itself launches. Host time that
# came with the workers stays (H200, docs/examples/train_images.py: 0.2 ms a step alone, 29 ms
# beside 16 workers on 16 cores). The 2 is a margin, not a measurement: room for autocast's
# casts and a busier core, far below the 145x the workers brought there
LAUNCH_HEADROOM = 2.0
# the host's share of the step below which CUDA graphs cannot repay their own compile: twice
# the 3 % min_gain (a gain the race must see, and graphs add their capture)
HOST_SHARE = 0.06
# the host's share from which CUDA graphs are compiled before the default mode: a third of
# the step, where the default mode's fewer kernels leave about half of it
GRAPHS_FIRST = 0.3
# a fresh process's compile of settings compiled before, as a share of the first compile,
# that says the run's cache was missed: from the cache 1.4 s against 11.4 s cold (14 %) on
# docs/examples/train_images.py, 2 cores; three quarters is no cache at all
CACHE_MISS_SHARE = 0.75
# the stages and the --only/--skip group of each; their order is the ceilings'
STAGE_GROUPS = {"amp": "amp", "loader": "loader", "loader_extras": "loader", "batch": "batch",
                "threads": "threads", "cudnn": "compile", "compile": "compile"}


@dataclass(frozen=True)
class Ceiling:
    """The most ``stage`` can gain here (``factor``), and the part of the step that says so."""

    stage: str
    factor: float
    why: str

    def skipped(self) -> str:
        return f"{self.stage}: at most {self.factor:.2f}x here, {self.why}; skipped"


def split(result: TrialResult | None) -> dict[str, float]:
    """The step's parts in seconds (zeros without a measured step)."""
    parts = result.breakdown if result is not None else None
    return parts or {"step": 0.0, "data_wait": 0.0, "device": 0.0, "host": 0.0}


def launches(parts: dict[str, float], launch_s: float | None) -> float:
    """The host time of ``parts`` that graphs can remove: at most :data:`LAUNCH_HEADROOM`
    times ``launch_s``, the host time of a run with no workers (None where unmeasured)."""
    host = parts["host"]
    return host if launch_s is None else min(host, LAUNCH_HEADROOM * launch_s)


def may_pin(facts: ScriptFacts, knobs: Knobs) -> bool:
    """Whether pinned memory is still to try beside ``knobs``: on CUDA, unset, and not a
    value the script fixes (the loader stages' test, and their ceiling's)."""
    return facts.on_cuda and knobs.pin_memory is None and "pin_memory" not in facts.fixed_knobs


def host_why(parts: dict[str, float], launch_s: float | None) -> str:
    """What the host's share of the step is made of, for a note on CUDA graphs."""
    step, own = parts["step"] or 1.0, launches(parts, launch_s)
    if own < parts["host"]:
        return (f"the step's own launches take {own / step:.0%} of it, the rest of the "
                f"host's {parts['host'] / step:.0%} came with the workers")
    return f"the host takes {parts['host'] / step:.0%} of the step"


def _amdahl(step: float, removed: float) -> float:
    """Speed-up when ``removed`` seconds of a ``step`` go (at most 100x)."""
    if step <= 0:
        return 1.0
    return step / max(step - removed, step / 100)


def _shares(parts: dict[str, float]) -> str:
    step = parts["step"] or 1.0
    waits = parts["data_wait"] / step
    if waits >= 0.5:
        return f"the loop waits for data {waits:.0%} of the step"
    if parts["host"] / step >= 0.3:
        return f"the device idles for the host {parts['host'] / step:.0%} of the step"
    return (f"the {'device' if parts['host'] else 'compute'} takes "
            f"{parts['device'] / step:.0%} of the step")


def ceiling(stage: str, result: TrialResult | None, facts: ScriptFacts, workers: int,
            expected_steps: int, compile_s: float, decode_s: float | None = None,
            launch_s: float | None = None) -> Ceiling:
    """``stage``'s ceiling from ``result``, the incumbent's latest run (``workers``: its
    num_workers; ``compile_s``: a cold compile, measured or guessed; ``decode_s``: a batch's
    data time in one process, the wait of a run without workers, None where unknown;
    ``launch_s``: the host time of a run without workers, see :func:`launches`)."""
    parts = split(result)
    step, wait, device, host = parts["step"], parts["data_wait"], parts["device"], parts["host"]
    why = _shares(parts)
    if stage == "loader":
        factor = _amdahl(step, wait)
    elif stage == "loader_extras":
        knobs = result.trial.knobs if result is not None else Knobs()
        pinned = host if may_pin(facts, knobs) else 0.0  # pin_memory: the copy is host time
        factor = _amdahl(step, max(wait, pinned)) if workers else 1.0
    elif stage == "amp":
        rate = AMP_GPU if facts.on_cuda else AMP_CPU
        if not space.amp_dtypes(facts):
            rate = TF32_GPU if space.matmul_precisions(facts) else 1.0
        factor = _amdahl(step, device * (1 - 1 / rate))
    elif stage == "compile":
        own = launches(parts, launch_s)
        if own < host and facts.on_cuda:
            why = host_why(parts, launch_s)
        removed = device * (1 - 1 / COMPILE) + own * COMPILE_HOST
        if facts.on_cuda:
            removed = max(removed, device * (1 - 1 / COMPILE) + own)  # reduce-overhead
        after = step - removed
        spread = compile_s / max(1, expected_steps)  # its cost over the run's steps
        factor = step / (max(after, step / 100) + spread) if step else 1.0
    elif stage == "cudnn":
        convolutions = facts.on_cuda and facts.convolutions is not False
        fixed = not shapes_vary(result)
        factor = _amdahl(step, device * (1 - 1 / CUDNN)) if convolutions and fixed else 1.0
        why = why if convolutions else "the model has no convolutions"
        if convolutions and not fixed:
            why = (f"the input's shape changes between steps ({result.input_shapes} shapes in "
                   "one window): cuDNN's autotuner would search again for each")
    elif stage == "batch":
        factor = 1.0 if facts.on_cuda else CPU_MICRO_BATCH
        why = ("smaller micro-batches add launches and host time" if facts.on_cuda
               else "a CPU micro-batch gains at most cache effects")
    elif stage == "threads":  # workers and other processes' load on the threads' cores
        threads, cores = facts.cpu_threads, space.free_cores(facts)
        busy = 1.0  # the share of the step each worker decodes
        if decode_s is not None and workers and step:
            busy = min(1.0, decode_s / (workers * step))
        factor = 1.0 if facts.on_cuda else max(1.0, (threads + workers * busy) / cores)
        why = f"{threads} threads and {workers} workers share {cores} cores"
        if facts.busy_cores >= 0.5:
            why += (f" (other processes keep {facts.busy_cores:.1f} of "
                    f"{facts.usable_cores} busy)")
    else:
        factor = 1.0
    return Ceiling(stage, factor, why)


def shapes_vary(result: TrialResult | None) -> bool:
    """Whether ``result``'s window brought a new input shape at most of its steps: cuDNN's
    autotuner searches once a shape, so a few recurring shapes (buckets, a last short
    batch) repay it and only ever-new ones do not (False where the shapes were not counted)."""
    if result is None or not result.input_shapes:
        return False
    return result.input_shapes > max(1, len(result.step_s_all) // 2)


def revisit(stage: str, incumbent: Knobs) -> bool:
    """Whether a stage visited once is worth a second visit after later stages moved the
    incumbent: amp once adopted is not (its revisit is for a dtype whose gain the data
    wait hid; the other dtypes run at the adopted one's tensor-core rate)."""
    return not (stage == "amp" and incumbent.amp_dtype is not None)


def outweighs_confirmation(factor: float, compile_factor: float | None, found: bool,
                           shown: bool = False) -> bool:
    """Whether a stage that can gain ``factor`` may take the confirmation's reserve for one
    sweep when nothing else is left for it: for a large gain (:data:`LARGE_GAIN`), one at
    least compile's (``compile_factor``, while compile is to come: the sweep would take its
    share too), and only while nothing was ``found`` yet (nothing to confirm but the
    defaults) or the find is ``shown`` to stand beyond noise of the defaults already, by an
    interval of the search's runs (the claim the confirmation would check is made) or by a
    lead far beyond the windows' spread (:func:`stages.clearly_ahead`): in the replay the
    loader after a compile 4.7x ahead was 5 s short of its sweep, and 60 s searches under
    0.85 of the best went 53/43/47 -> 50/40/46, seeds 1-3. The report says the pick is
    unconfirmed where no round is left."""
    return (not found or shown) and factor >= LARGE_GAIN and factor >= (compile_factor or 1.0)


def clear_lead(lead: float, own_noise: float, spread: float) -> bool:
    """Whether a ``lead`` (the faster window's speed over the slower's) is a large gain
    (:data:`LARGE_GAIN`) beyond twice the windows' own noise (``own_noise``, the larger
    relative standard error) and twice the window-to-window ``spread``: one window a side
    tells the two apart, as rounds would."""
    return lead >= LARGE_GAIN * (1 + (2 * own_noise + 2 * spread))


def compile_outweighs_confirmation(factor: float, shown: bool) -> bool:
    """Whether compile, able to gain ``factor``, may take the confirmation's reserve for its
    first compiled trial: for a large gain (:data:`LARGE_GAIN`), and only where the change
    found is ``shown`` beyond noise of the defaults by the search's runs (the claim the
    confirmation would check is made, and compile is decided against the eager incumbent
    on its own windows). With nothing shown, the confirmation is what the pick rests on:
    letting compile take it there too lowered the replay's 60 s median (.964 -> .959,
    seed 1). The report then gives the search's own runs' interval."""
    return shown and factor >= LARGE_GAIN


def host_bound(result: TrialResult | None, launch_s: float | None = None) -> bool:
    """Whether the device idles for the step's launches (:func:`launches`) long enough
    (:data:`HOST_SHARE` of the step) for CUDA graphs (compile's reduce-overhead mode) to
    be worth a compile."""
    parts = split(result)
    return parts["step"] > 0 and launches(parts, launch_s) >= HOST_SHARE * parts["step"]


def graphs_first(result: TrialResult | None, launch_s: float | None = None) -> bool:
    """Whether CUDA graphs are the compile mode to try first: the step's launches take
    :data:`GRAPHS_FIRST` of the step or more, time graphs remove and the default mode only
    shortens (a budget often holds one cold compile)."""
    parts = split(result)
    return parts["step"] > 0 and launches(parts, launch_s) >= GRAPHS_FIRST * parts["step"]


def worth_trying(ceiling_: Ceiling, result: TrialResult | None, min_gain: float,
                 spread: float) -> bool:
    """Whether a stage's ceiling clears the measured noise: ``min_gain``, the run's
    window-to-window ``spread`` as the race's rounds the budget holds would see it, and twice
    the result's own standard error (a gain above the noise is what a race can tell apart
    with rounds)."""
    noise = max(min_gain, spread, 2 * (result.noise if result is not None else 0.0))
    return ceiling_.factor > 1 + noise


def order(ceilings: list[Ceiling]) -> list[Ceiling]:
    """Highest ceiling first (ties keep the given order)."""
    return sorted(ceilings, key=lambda c: -c.factor)


def predicted_workers(result: TrialResult | None, facts: ScriptFacts, workers: int) -> list[int]:
    """The worker counts to try, the prediction first: enough workers to hide the measured
    data time behind the rest of the step (bounded by the usable cores), then its
    neighbours (half and twice it). ``result`` ran with ``workers``: without any, the loop
    decodes a batch in its data wait; with n, each worker takes n steps for one."""
    counts = space.worker_counts(facts)
    if not counts:
        return []
    top = counts[-1]
    parts = split(result)
    rest = parts["step"] - parts["data_wait"]
    if parts["data_wait"] <= 0 or rest <= 0:
        return [n for n in (1, 2) if n <= top]
    batch_s = workers * parts["step"] if workers else parts["data_wait"]
    need = min(top, max(1, math.ceil(batch_s / rest * WORKER_HEADROOM)))
    points = [need, min(top, 2 * need), max(1, need // 2)]
    return list(dict.fromkeys(points))


def predicted_ceiling(result: TrialResult | None, incumbent: Knobs, point: Knobs) -> Ceiling:
    """The predicted point's ceiling beside ``incumbent`` (``result``: its latest run): the
    loader's and amp's together, each counted where the point changes it (new workers remove
    the wait, a CUDA dtype the device time's share :data:`AMP_GPU` removes)."""
    parts = split(result)
    removed = parts["data_wait"] if point.num_workers != incumbent.num_workers else 0.0
    if point.amp_dtype != incumbent.amp_dtype:  # predicted only on CUDA
        removed += parts["device"] * (1 - 1 / AMP_GPU)
    return Ceiling("predict", _amdahl(parts["step"], removed), _shares(parts))


def predicted_point(result: TrialResult | None, facts: ScriptFacts, incumbent: Knobs,
                    groups: frozenset[str], min_gain: float) -> Knobs:
    """The settings the breakdown predicts fastest, to measure first: the predicted workers
    (with pinned memory on CUDA) where the loop waits for data, then, on the step they
    would leave, the hardware's fastest autocast dtype on CUDA where its ceiling is large
    (a CPU's bfloat16 may lose: it is left to its stage). Each part is verified after."""
    parts = split(result)
    knobs, step, wait = incumbent, parts["step"], parts["data_wait"]
    rest = step - wait
    dtypes = space.amp_dtypes(facts)
    if "amp" in groups and facts.on_cuda and dtypes and incumbent.amp_dtype is None \
            and "amp_dtype" not in facts.fixed_knobs and \
            _amdahl(rest, parts["device"] * (1 - 1 / AMP_GPU)) >= LARGE_GAIN:
        knobs = knobs.replace(amp_dtype=dtypes[0])
        rest -= parts["device"] * (1 - 1 / AMP_GPU)  # the workers must keep up with it
    if "loader" in groups and not incumbent.num_workers and rest > 0 and \
            _amdahl(step, wait) > 1 + max(min_gain, LARGE_GAIN - 1):
        top = space.worker_counts(facts)[-1:] or [0]
        if top[0]:
            knobs = knobs.replace(num_workers=min(top[0], max(1, math.ceil(
                wait / rest * WORKER_HEADROOM))))
            if may_pin(facts, incumbent):
                knobs = knobs.replace(pin_memory=True)
    return knobs
