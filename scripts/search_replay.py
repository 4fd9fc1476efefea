"""Replay the real search (tuneup/autotune/search) against landscapes instead of a script.

A landscape is a machine and a workload in a few numbers: data time per batch, the main
process's copy of a batch (pinned or not), compute time per precision, host time per step
(Python, launches, syncs: the device idles), compile's gain and cost, cudnn's gain, the
memory limit for a micro-batch, usable cores, start-up, and the noise of a window. The
replay's executor answers the search's trials from it on a simulated clock (as
tests/autotune/test_search.py's ``Recorded`` does): one process from plan to plan until a
trial fails, a compile paid once per process and from the run's cache after the first.

Landscapes come in three kinds:

* ``gpu``: modelled, GPU-like (amp 1.5-6x, the loader up to 10x, host time, pin_memory;
  a fifth with inputs whose shape changes, where cudnn_benchmark loses);
* ``cpu``: modelled, CPU-like (bfloat16 may lose, workers and threads share the cores);
* ``recorded``: fitted to measured trials, the measured speeds kept where there is one:
  the H200 runs of 2026-11-28 (tests/data/landscapes/h200-*.json, which name their source).

For each landscape and budget the search runs once (seeded noise) and the pick's true
speed is set against the landscape's best over every knob combination (compile's cost
amortised over the search's expected steps, 5,000 by default, in both). Printed: pick/best
by budget and kind, the median, the worst 5 % (their mean), the 5th percentile and the
count under 0.85, and the picks slower than PyTorch's defaults by more than 0.1 % (compile's
cost spread in both). The reachable best is the best point a search that knew it could measure
once beside the defaults within the budget (start-up, two trials and, for a compiled point,
its cold compile): the worst 5 % of pick/reachable is the search's own gap, and the worst
5 % of reachable/best the bound, the part of the gap no search could close.
``--noise-scale 0`` makes every window exact: the part of the gap the noise does not make;
``--compile-known`` tells the search each cold compile's cost: what a perfect predictor of
it would close.

    .venv/bin/python scripts/search_replay.py                 # 300 modelled + recorded
    .venv/bin/python scripts/search_replay.py --count 40 --budgets 60
    .venv/bin/python scripts/search_replay.py --noise-scale 0 # exact windows
    .venv/bin/python scripts/search_replay.py --compile-known # a perfect compile predictor
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from tuneup.autotune import protocol
from tuneup.autotune.search import Options, Search, SearchError, describe
from tuneup.autotune.search import budget as search_budget
from tuneup.autotune.search import run as search_run
from tuneup.autotune.search import stages as search_stages
from tuneup.autotune.space import ScriptFacts
from tuneup.autotune.trials import Trial, TrialResult
from tuneup.settings import Knobs

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "tests" / "data" / "landscapes"
LOSSES = [2.30, 2.25, 2.20]
WINDOW_S = protocol.WINDOW_DEFAULTS["min_measure_seconds"]
MIN_STEPS = protocol.WINDOW_DEFAULTS["measure_steps"]
MAX_STEPS = protocol.WINDOW_DEFAULTS["max_measure_steps"]
WARMUP_STEPS = protocol.WINDOW_DEFAULTS["warmup_steps"]
# compute with cudnn_benchmark where the input's shape keeps changing: an assumption (a
# search of the algorithms every step), not a measurement
VARYING_CUDNN = 1.15
CHECK_STEPS = protocol.WINDOW_DEFAULTS["check_steps"]


@dataclass(frozen=True)
class Landscape:
    """One machine and workload. Times are seconds per optimizer step of the whole batch."""

    name: str
    kind: str  # gpu, cpu or recorded
    device: str = "cuda"
    batch: int = 256
    data_s: float = 0.0  # decoding a batch in one process
    copy_s: float = 0.0  # the main process receiving a batch from workers (and to the device)
    pin_factor: float = 1.0  # copy_s's share left with pin_memory (CUDA)
    compute_s: dict[str, float] = field(default_factory=lambda: {"float32": 0.05})
    host_s: float = 0.0  # per step and micro-batch: the device idles (CUDA)
    compile_factor: float = 1.0  # compute under compile's default mode
    compile_host: float = 0.6  # host time left under compile (fewer, fused kernels)
    graphs_host: float = 0.1  # host time left under CUDA graphs (reduce-overhead)
    compile_s: float = 20.0  # a cold compile
    warm_compile_share: float = 0.2  # a compile from the run's cache
    cudnn_factor: float = 1.0  # compute with cudnn_benchmark (convolutions, fixed shapes)
    shapes: int = 1  # distinct input shapes a window sees (more: cudnn searches again)
    micro_cost: float = 0.03  # compute added per extra micro-batch (smaller kernels)
    memory_limit: int | None = None  # largest micro-batch that fits
    cores: int = 16
    thread_alpha: float = 0.8  # CPU compute scales as threads ** alpha
    noise: float = 0.03  # sigma of a window's log step time
    startup_s: float = 4.0
    warmup_s: float = 0.5
    worker_start_s: float = 0.05  # per worker, each trial (non-persistent workers)
    measured: dict[str, float] = field(default_factory=dict)  # describe(knobs) -> samples/s

    @property
    def dtypes(self) -> tuple[str, ...]:
        return tuple(d for d in ("bfloat16", "float16") if d in self.compute_s)

    def facts(self) -> ScriptFacts:
        return ScriptFacts(device=self.device, effective_batch=self.batch, dataset_size=None,
                           amp_dtypes=self.dtypes, compile_available=True,
                           cpu_threads=self.cores, usable_cores=self.cores)

    def fits(self, knobs: Knobs) -> bool:
        return self.memory_limit is None or (knobs.micro_batch_size or self.batch) \
            <= self.memory_limit

    def step(self, knobs: Knobs) -> tuple[float, float, float]:
        """The true step time of ``knobs``, its data-wait share and the device's busy time
        a step (CUDA: the compute; CPU: the step less its wait), without noise."""
        precision = knobs.amp_dtype or ("high" if knobs.float32_matmul_precision == "high"
                                        else "float32")
        compute = self.compute_s.get(precision, self.compute_s["float32"])
        host = self.host_s
        if knobs.compile_mode:
            compute *= self.compile_factor
            host *= self.graphs_host if knobs.compile_mode == "reduce-overhead" \
                else self.compile_host
        if knobs.cudnn_benchmark:  # a new shape is a new search of the algorithms
            compute *= self.cudnn_factor if self.shapes == 1 else VARYING_CUDNN
        splits = self.batch // (knobs.micro_batch_size or self.batch)
        compute *= 1 + self.micro_cost * (splits - 1)
        host *= splits
        workers = knobs.num_workers or 0
        copy = self.copy_s * (self.pin_factor if knobs.pin_memory else 1.0)
        crowd = 1.0
        if self.device == "cpu":  # threads scale sub-linearly; busy workers take their cores
            threads = knobs.cpu_threads or self.cores
            compute *= (self.cores / threads) ** self.thread_alpha
            if workers:
                busy = min(1.0, self.data_s / (workers * (compute + copy)))
                crowd = max(1.0, (threads + min(workers, self.cores) * busy) / self.cores)
                compute *= crowd
        main = compute + host + copy
        if not workers:
            step = self.data_s + main
            wait = self.data_s
        else:
            usable = max(1, self.cores - (0 if self.device == "cpu" else 1))
            decoders = min(workers, usable) + 0.25 * max(0, workers - usable)
            supply = self.data_s / decoders * (1 + 0.02 * workers) * crowd
            step = max(supply, main)
            near = math.exp(-5 * abs(math.log(supply / main))) if supply > 0 else 0.0
            step *= 1 + near * (0.03 if knobs.prefetch_factor else 0.08)
            wait = max(0.0, step - main)
        device = compute if self.device == "cuda" else step - wait
        if self.measured and describe(knobs) in self.measured:  # the parts scaled alike
            measured = self.batch / self.measured[describe(knobs)]
            wait, device, step = (wait * measured / step, device * measured / step, measured)
        return step, min(1.0, wait / step), device

    def value(self, knobs: Knobs, expected_steps: int) -> float:
        """Step time with compile's cost spread over the run: what the pick is judged on."""
        step = self.step(knobs)[0]
        return step + (self.compile_s / expected_steps if knobs.compile_mode else 0.0)

    def trial_s(self, knobs: Knobs) -> float:
        """The least one trial of ``knobs`` takes in a live process (no compile)."""
        step = self.step(knobs)[0]
        return (self.warmup_s + self.worker_start_s * (knobs.num_workers or 0)
                + WARMUP_STEPS * step + max(WINDOW_S, MIN_STEPS * step) + 0.2)

    def least_cost(self, knobs: Knobs) -> float:
        """The least any search spends to measure ``knobs`` once beside the defaults: the
        start-up, a trial of each, and a cold compile where ``knobs`` compiles."""
        compile_s = self.compile_s if knobs.compile_mode else 0.0
        return self.startup_s + self.trial_s(Knobs()) + self.trial_s(knobs) + compile_s

    def grid(self) -> list[Knobs]:
        """Every combination the search could pick."""
        cuda = self.device == "cuda"
        precisions = [(None, None)] + [(d, None) for d in self.dtypes]
        if cuda:
            precisions.append((None, "high"))
        micro = [None] + [self.batch // p for p in (2, 4, 8) if self.batch % p == 0]
        workers = [0, *range(1, min(self.cores, 32) + 1)]
        points = []
        for (amp, matmul), n, mb, mode in itertools.product(
                precisions, workers, micro, [None, "default"] +
                (["reduce-overhead"] if cuda else [])):
            pins = [None, True] if cuda and n else [None]
            fetch = [None, 4] if n else [None]
            threads = [None] + ([t for t in range(1, self.cores)] if not cuda else [])
            cudnn = [None, True] if cuda else [None]
            for pin, pf, th, cb in itertools.product(pins, fetch, threads, cudnn):
                knobs = Knobs(amp_dtype=amp, float32_matmul_precision=matmul,
                              num_workers=n or None, micro_batch_size=mb, compile_mode=mode,
                              pin_memory=pin, prefetch_factor=pf, cpu_threads=th,
                              cudnn_benchmark=cb)
                if self.fits(knobs):
                    points.append(knobs)
        return points


class Replay:
    """An executor answering trials from a landscape on a simulated clock."""

    def __init__(self, land: Landscape, budget: float, seed: int, trace: bool = False) -> None:
        self.trace = trace
        self.land = land
        self.facts = land.facts()
        self.startup_s = land.startup_s
        self.budget = budget
        self.clock = land.startup_s  # the hello: the runner's clock starts with the script
        self.rng = random.Random(seed)
        self.alive = False
        self.compiled: Knobs | None = None
        self.cache: set[Knobs] = set()
        self.trials = 0

    def time_left(self) -> float:
        return self.budget - self.clock

    def live_process(self) -> bool:
        return self.alive

    def held_graphs(self) -> Knobs | None:
        return self.compiled if self.alive else None

    def run(self, trials: list[Trial], stop: Callable[[TrialResult], bool] | None = None
            ) -> list[TrialResult]:
        if not self.alive:
            self.clock += self.startup_s if self.trials else 0.0
            self.alive, self.compiled = True, None
        results: list[TrialResult] = []
        for trial in trials:
            if (results and stop and stop(results[-1])) or not self.alive:
                results.append(TrialResult(trial, protocol.SKIPPED))
                continue
            if self.clock >= self.budget:
                results.append(TrialResult(trial, protocol.BUDGET, message="budget"))
                continue
            results.append(self._one(trial))
            if self.trace:
                result = results[-1]
                speed = self.land.batch / result.step_time if result.ok else 0.0
                print(f"  {trial.id:<45} {result.status:<7} {speed:9.0f}/s "
                      f"wait {result.data_wait_share or 0:.0%}  ({self.time_left():.0f} s left)")
        return results

    def _one(self, trial: Trial) -> TrialResult:
        land, knobs = self.land, trial.knobs
        self.trials += 1
        if not land.fits(knobs):
            self.clock += land.warmup_s
            self.alive = False  # an out-of-memory trial ends the process
            return TrialResult(trial, protocol.OOM, message="CUDA out of memory")
        step, wait, device = land.step(knobs)
        warmup = land.warmup_s + land.worker_start_s * (knobs.num_workers or 0) + \
            WARMUP_STEPS * step
        if knobs.compile_mode:
            graphs = knobs.without_loader()
            if graphs != self.compiled:
                warmup += land.compile_s * (land.warm_compile_share if graphs in self.cache
                                            else 1.0)
            self.compiled = graphs
            self.cache.add(graphs)
        shift = math.exp(self.rng.gauss(0, land.noise))  # the window's share of the machine
        window = step * shift
        steps = min(MAX_STEPS, max(MIN_STEPS, math.ceil(WINDOW_S / window)))
        times = [window * math.exp(self.rng.gauss(0, land.noise / 2)) for _ in range(steps)]
        checks = CHECK_STEPS + 1 if trial.check else 0
        self.clock += warmup + sum(times) + checks * step + 0.2
        if self.clock > self.budget + 1e-9 and self.trials > 1:
            return TrialResult(trial, protocol.BUDGET, message="budget")
        return TrialResult.from_event(trial, {
            "status": protocol.OK, "step_s_all": times, "step_s": statistics.fmean(times),
            "warmup_s": warmup, "data_wait_share": wait, "peak_memory_bytes": 2**30,
            "device_s": device * shift, "input_shapes": land.shapes,
            "check_losses": LOSSES if trial.check else None})


# ---- landscapes -----------------------------------------------------------------------


def log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def gpu_like(rng: random.Random, i: int) -> Landscape:
    """A GPU workload: bf16 1.5-6x faster than fp32, input from nothing to 10x the compute,
    host time up to the bf16 compute, a copy that pinning shrinks; the defaults' step 20-350
    ms (a window of the defaults fits a 60 s budget beside the start-up)."""
    fp32 = log_uniform(rng, 0.005, 0.2)
    amp = rng.uniform(1.5, 6.0)
    input_bound = rng.random() < 0.5
    data = fp32 * (log_uniform(rng, 1.0, 10.0) if input_bound else log_uniform(rng, 0.01, 0.5))
    scale = min(1.0, 0.35 / (fp32 + data))
    fp32, data = fp32 * scale, data * scale
    compute = {"float32": fp32, "high": fp32 / rng.uniform(1.0, max(1.0, amp * 0.6)),
               "bfloat16": fp32 / amp, "float16": fp32 / amp * rng.uniform(0.95, 1.15)}
    batch = rng.choice([32, 64, 128, 256, 512])
    return Landscape(
        name=f"gpu-{i:03d}", kind="gpu", device="cuda", batch=batch, data_s=data,
        copy_s=fp32 / amp * rng.uniform(0.0, 1.0) if input_bound else fp32 * 0.02,
        pin_factor=rng.uniform(0.3, 0.9), compute_s=compute,
        host_s=fp32 / amp * log_uniform(rng, 0.02, 1.0),
        compile_factor=rng.uniform(0.6, 1.05), compile_s=rng.uniform(15, 60),
        warm_compile_share=rng.uniform(0.1, 0.4),
        cudnn_factor=rng.choice([1.0, 1.0, rng.uniform(0.8, 1.0)]),
        micro_cost=rng.uniform(0.01, 0.08),
        memory_limit=batch // 2 if rng.random() < 0.1 else None,
        cores=rng.choice([8, 16, 32]), noise=rng.uniform(0.01, 0.10),
        startup_s=rng.uniform(3, 15), warmup_s=rng.uniform(0.3, 2.0),
        # a fifth with inputs of changing shape (variable-length sequences), drawn apart
        # so that the other parameters stay those of earlier replays
        shapes=rng_apart(i).choice([1, 1, 1, 1, 8]))


def rng_apart(i: int) -> random.Random:
    """A generator of its own for landscape ``i``'s newer parameters."""
    return random.Random(f"landscape-{i}")


def cpu_like(rng: random.Random, i: int) -> Landscape:
    """A CPU workload on 2-16 cores: bf16 from 2.5x faster to 1.6x slower (or not offered),
    threads that scale sub-linearly, workers that take cores from them, micro-batches at
    most 4 % faster (cache effects: in 12 measured grids of four workloads never 3 % ahead;
    until 2026-11-28 the model let them gain up to 21 %); the defaults' step at most
    350 ms."""
    fp32 = log_uniform(rng, 0.02, 0.3)
    input_bound = rng.random() < 0.5
    data = fp32 * (log_uniform(rng, 0.5, 4.0) if input_bound else log_uniform(rng, 0.01, 0.3))
    scale = min(1.0, 0.35 / (fp32 + data))
    fp32, data = fp32 * scale, data * scale
    compute = {"float32": fp32}
    if rng.random() < 0.8:
        compute["bfloat16"] = fp32 * rng.uniform(0.4, 1.6)
    cores = rng.choice([2, 2, 4, 8, 16])
    return Landscape(
        name=f"cpu-{i:03d}", kind="cpu", device="cpu", batch=rng.choice([32, 64, 128, 256]),
        data_s=data, copy_s=fp32 * 0.01, compute_s=compute, host_s=0.0,
        compile_factor=rng.uniform(0.7, 1.1), compile_s=rng.uniform(8, 40),
        warm_compile_share=rng.uniform(0.1, 0.3), micro_cost=rng.uniform(-0.006, 0.1),
        cores=cores, thread_alpha=rng.uniform(0.5, 0.95), noise=rng.uniform(0.02, 0.12),
        startup_s=rng.uniform(2, 8), warmup_s=rng.uniform(0.2, 1.5),
        worker_start_s=rng.uniform(0.05, 0.3))


def modelled(count: int, seed: int) -> list[Landscape]:
    rng = random.Random(seed)
    return [(gpu_like if i % 2 == 0 else cpu_like)(rng, i) for i in range(count)]


def recorded() -> list[Landscape]:
    """The landscapes fitted to measured trials, from tests/data/landscapes/*.json."""
    lands = []
    for path in sorted(RECORDED.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        lands.append(Landscape(name=path.stem, kind="recorded",
                               measured=dict(data.get("measured", {})), **data["model"]))
    return lands


# ---- the replay -----------------------------------------------------------------------


@dataclass
class Replayed:
    land: Landscape
    budget: float
    ratio: float  # true best step / true pick step (1: the best)
    pick: Knobs
    used_s: float
    reachable: float = 1.0  # the best a search could measure in the budget / the pick
    bound: float = 1.0  # the best / the best a search could measure in the budget
    vs_defaults: float = 1.0  # PyTorch defaults' step (compile's cost spread) / the pick's


def replay(land: Landscape, budget: float, seed: int = 0,
           options: Options | None = None, trace: bool = False,
           compile_known: bool = False) -> Replayed:
    """One search of ``land``; ``compile_known``: the search's compile guess is the
    landscape's own cold compile (a perfect predictor of it)."""
    options = options or Options()
    executor = Replay(land, budget, seed, trace)
    on_stage = (lambda name: print(f"[{name}]")) if trace else None
    try:
        with compile_guess(land.compile_s if compile_known else None):
            outcome = Search(executor, options, on_stage=on_stage).run()
        pick = outcome.knobs
        if trace:
            print("\n".join(["notes:", *outcome.notes]))
    except SearchError as error:
        pick = Knobs()
        if trace:
            print(f"error: {error}")
    best = best_value(land, options.expected_steps)
    value = land.value(pick, options.expected_steps)
    reachable = reachable_value(land, budget, options.expected_steps)
    return Replayed(land, budget, best / value, pick, executor.clock,
                    min(1.0, reachable / value), best / reachable,
                    land.value(Knobs(), options.expected_steps) / value)


# the modules of the search that read COMPILE_GUESS_S (imported by name from budget)
GUESS_READERS = (search_budget, search_run, search_stages)


@contextmanager
def compile_guess(seconds: float | None) -> Iterator[None]:
    """The search's guess of a cold compile (``COMPILE_GUESS_S`` in each of
    :data:`GUESS_READERS`) set to ``seconds`` for the block; None leaves it as it is."""
    if seconds is None:
        yield
        return
    saved = [module.COMPILE_GUESS_S for module in GUESS_READERS]
    try:
        for module in GUESS_READERS:
            module.COMPILE_GUESS_S = seconds
        yield
    finally:
        for module, value in zip(GUESS_READERS, saved):
            module.COMPILE_GUESS_S = value


# Cached per landscape object; each entry keeps its landscape alive, so that no later
# landscape can be given the same id() and read another's entry.
BEST: dict[tuple[int, int], tuple[Landscape, Knobs]] = {}


def best_point(land: Landscape, expected_steps: int) -> Knobs:
    """The landscape's best point (compile's cost spread), once per landscape."""
    key = (id(land), expected_steps)
    if key not in BEST:
        BEST[key] = (land, min(land.grid(), key=lambda k: land.value(k, expected_steps)))
    return BEST[key][1]


def best_value(land: Landscape, expected_steps: int) -> float:
    """The landscape's best step time (compile's cost spread)."""
    return land.value(best_point(land, expected_steps), expected_steps)


REACHABLE: dict[tuple[int, float, int], tuple[Landscape, float]] = {}


def reachable_value(land: Landscape, budget: float, expected_steps: int) -> float:
    """The best step time (compile's cost spread) among the points whose least cost to
    measure (:meth:`Landscape.least_cost`) fits ``budget``: what no search could beat."""
    key = (id(land), budget, expected_steps)
    if key not in REACHABLE:
        points = [k for k in land.grid() if land.least_cost(k) <= budget] or [Knobs()]
        REACHABLE[key] = (land, min(land.value(k, expected_steps) for k in points))
    return REACHABLE[key][1]


def worst_share(values: list[float], share: float = 0.05) -> float:
    """The mean of the worst ``share`` of ``values`` (at least one)."""
    ordered = sorted(values)
    return statistics.fmean(ordered[:max(1, math.ceil(len(ordered) * share))])


def percentile(values: list[float], share: float = 0.05) -> float:
    """The value below which ``share`` of ``values`` lie (the lowest of the rest)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.floor(len(ordered) * share))]


def exact_windows(lands: list[Landscape], scale: float) -> list[Landscape]:
    """``lands`` with their window noise times ``scale``: at 0 every window measures the
    true step, and what is left of the gap is the budget and the search's order, not the
    noise."""
    return [replace(land, noise=land.noise * scale) for land in lands]


def table(results: list[Replayed]) -> str:
    lines = [("| budget | kind | landscapes | median pick/best | worst 5 % | 5th percentile | "
              "under 0.85 | worst 5 % pick/reachable | bound: worst 5 % reachable/best | "
              "slower than the defaults |"),
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for budget in sorted({r.budget for r in results}):
        for kind in ("gpu", "cpu", "recorded", "all"):
            chosen = [r for r in results if r.budget == budget
                      and (kind == "all" or r.land.kind == kind)]
            if not chosen:
                continue
            ratios = [r.ratio for r in chosen]
            lines.append(f"| {budget:.0f} s | {kind} | {len(ratios)} | "
                         f"{statistics.median(ratios):.3f} | {worst_share(ratios):.3f} | "
                         f"{percentile(ratios):.3f} | {sum(r < 0.85 for r in ratios)} | "
                         f"{worst_share([r.reachable for r in chosen]):.3f} | "
                         f"{worst_share([r.bound for r in chosen]):.3f} | "
                         f"{sum(r.vs_defaults < 1 - 1e-3 for r in chosen)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=300, help="modelled landscapes")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--budgets", default="60,120")
    parser.add_argument("--only", default="", help="landscape names, comma-separated")
    parser.add_argument("--show", action="store_true", help="each landscape's pick")
    parser.add_argument("--trace", action="store_true", help="every trial (with --only)")
    parser.add_argument("--compile-known", action="store_true",
                        help="tell the search each landscape's cold compile (a perfect "
                             "predictor of it) instead of its guess")
    parser.add_argument("--noise-scale", type=float, default=1.0,
                        help="times each landscape's window noise (0: exact windows, the "
                             "gap the budget and the order leave)")
    args = parser.parse_args(argv)
    if not math.isfinite(args.noise_scale) or args.noise_scale < 0:
        parser.error("--noise-scale must be a finite number >= 0")
    lands = exact_windows(modelled(args.count, args.seed) + recorded(), args.noise_scale)
    if args.only:
        lands = [land for land in lands if land.name in args.only.split(",")]
    started = time.perf_counter()
    results = [replay(land, float(budget), seed=args.seed + i, trace=args.trace,
                      compile_known=args.compile_known)
               for budget in args.budgets.split(",") for i, land in enumerate(lands)]
    print(table(results))
    if args.show:
        for r in sorted(results, key=lambda r: r.ratio):
            best = best_point(r.land, Options().expected_steps)
            print(f"{r.land.name:>14} {r.budget:>4.0f} s {r.ratio:.3f} {describe(r.pick):<40} "
                  f"best: {describe(best)}")
    print(f"{len(results)} replays in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
