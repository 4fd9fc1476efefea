"""The autotune child: runs a trial plan inside the user's own training loop.

``tuneup autotune`` starts the script with ``TUNEUP_PROBE=plan.json`` and names :func:`install`
in ``TUNEUP_OBSERVERS``; the runtime then calls this observer's hooks. The loader whose batch
is followed by an optimizer step is the training loader (an eval loader iterated first stays
plain); from then on its ``for`` loop runs the plan: knobs switch between windows of the
user's steps, which are timed, and one JSON line per event goes to the results file.
See docs/probe-protocol.md.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import functools
import io
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import psutil
import torch

from tuneup.autotune import protocol, spawned
from tuneup.autotune.child_facts import (
    amp_dtypes_here,
    busy_cores,
    compile_available,
    save_atomically,
    torch_default_threads,
    usable_cores,
)
from tuneup.autotune.child_parent import die_with_parent, parent_gone
from tuneup.autotune.child_timing import DeviceTimer
from tuneup.autotune.reference import load_own
from tuneup.autotune.trainer_trial import TrainerTrial
from tuneup.runtime import apply, distributed, hooks, malloc_thresholds
from tuneup.runtime.batches import batch_shape
from tuneup.settings import Knobs

if TYPE_CHECKING:
    from tuneup.runtime.loader import TunedLoader
    from tuneup.runtime.loop import TunedLoop


def install() -> TrialSession | None:
    """The observer ``TUNEUP_OBSERVERS`` names: a trial session when a plan is given."""
    path = os.environ.get(protocol.ENV_PROBE)
    if not path:
        return None
    plan = read_plan(Path(path))
    die_with_parent(plan.parent_pid)
    return TrialSession(plan)


def read_plan(path: Path) -> protocol.Plan:
    """Parse the plan; a bad one ends the process with exit code 2 and a one-line message."""
    try:
        return protocol.read_plan(path)
    except Exception as exc:
        print(f"tuneup: bad probe plan {path}: {apply.one_line(exc)}", file=sys.stderr, flush=True)
        os._exit(protocol.EXIT_BAD_PLAN)


class TrialSession(hooks.Observer):
    """Runs the plan's trials, one window of the user's steps after another."""

    def __init__(self, plan: protocol.Plan) -> None:
        self.plan = plan
        self.rank = protocol.rank_of(os.environ) if plan.ranks > 1 else 0
        self.direct_parent = os.getppid()
        self.out = self._open_results()
        self.defaults = apply.process_defaults()
        # before the first trial: a trial's speed must not depend on what ran before it
        self.malloc_problem = malloc_thresholds.fix()
        self.loop: TunedLoop | None = None
        self.loops: list[TunedLoop] = []  # a GAN's D and G: every tuned_loop of the script
        self.loader: TunedLoader | None = None
        self.timer = DeviceTimer()  # the device's share of each measured step (CUDA)
        self.pending: TunedLoader | None = None  # the loader whose batch the user holds
        self.started = False
        self.phase = "idle"  # idle -> (warmup -> measure -> check) per trial
        self.trial_running = False
        self.finite: Any = True
        self.step_loss: Any = 0.0
        self.finished = False
        self.exit_reason = "script-ended"
        self.discontinuity = True  # the next step spans something that is not training
        self.index = 0
        self.compiled: Knobs | None = None  # the knobs dynamo's cache holds graphs for
        self.window_steps: int | None = None  # ranks in lockstep: this trial's agreed window
        self.step_ended = time.perf_counter()
        self.generation = 0  # bumped whenever the batch source must be reopened
        self.process_steps = 0
        self.reference: dict[str, Any] = {}
        self.check_losses: list[float] = []
        self.empty_loader = False  # the last loader iterated before training yielded nothing
        self.loaders_created = 0
        self.trainer: TrainerTrial | None = None  # a trainer's one trial in this process
        self.threads_at_install = torch.get_num_threads()
        self.script_threads: int | None = None  # the script's own set_num_threads, before training
        _watch_thread_calls(self)
        self.process = psutil.Process()
        self._previous_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        atexit.register(self._at_exit)

    # -- hooks the runtime calls --------------------------------------------------------
    def initial_knobs(self, knobs: Knobs) -> Knobs:
        return Knobs()  # trials start from PyTorch's defaults, whatever a settings file says

    def loader_created(self, loader: TunedLoader) -> None:
        self.loaders_created += 1

    def loop_created(self, loop: TunedLoop) -> None:
        if spawned.is_spawned_trainer():  # one loop per spawned trainer: refused, one line
            spawned.refuse(self)
        self.loops.append(loop)  # all are restored before each trial; the first is driven
        if self.loop is None:
            self.loop = loop
            loop.strict = True  # a knob that cannot apply fails its trial, not silently

    @contextlib.contextmanager
    def guard(self, loop: TunedLoop) -> Iterator[None]:
        """The first training step on a loader's batch starts the plan, before its forward
        pass, so it already runs under the first trial's knobs (an eval pass under
        ``no_grad`` does not count). Any exception of the user's step fails the trial."""
        try:
            if (not self.started and self.pending is not None and loop is self.loop
                    and torch.is_grad_enabled()):
                self.loader = self.pending
                self._begin()
            yield
        except Exception as exc:
            self.fail(exc)

    def loss(self, loop: TunedLoop, loss: torch.Tensor, weight: Any) -> None:
        """Every backpropagated loss: finiteness, and in the check phase the step's loss
        (the sum of ``loss * weight`` over its pieces is the batch's loss)."""
        if loop is not self.loop:
            return
        detached = loss.detach()
        self.finite = self.finite & torch.isfinite(detached).all()
        if self.phase == "check":
            self.step_loss = self.step_loss + detached.float() * weight

    def optimizer_stepped(self, loop: TunedLoop) -> None:
        if loop is not self.loop:
            return
        self.process_steps += 1
        if self.phase == "check":
            self.check_losses.append(float(self.step_loss))
            self.step_loss = 0.0

    def trainer_knobs(self, run: hooks.TrainerRun, knobs: Knobs) -> Knobs:
        """A trainer that owns its loop runs the plan's first trial, one trial a process
        (:mod:`tuneup.autotune.trainer_trial`): its knobs, whatever a settings file says."""
        if spawned.is_spawned_trainer():
            spawned.refuse(self)
        if self.trainer is None:
            self.trainer = TrainerTrial(self, run)
        return self.trainer.knobs

    def trainer_ready(self, run: hooks.TrainerRun) -> None:
        if self.trainer is not None and not self.started:
            self.trainer.ready()

    def trainer_step(self, run: hooks.TrainerRun, loss: Any) -> None:
        if self.trainer is not None:
            self.trainer.step(loss)

    def trainer_paused(self, run: hooks.TrainerRun) -> None:
        if self.trainer is not None:
            self.trainer.paused = True

    def parent_gone(self) -> bool:
        """``tuneup autotune`` (or the process between it and this one) is gone."""
        return self.plan.parent_pid is not None and parent_gone(self.plan.parent_pid,
                                                                 self.direct_parent)

    def batches(self, loader: TunedLoader, source: Iterator[Any]) -> Iterator[Any]:
        if self.loader is None:
            return self._until_training(loader, source)
        return self._trials() if loader is self.loader else source

    # -- the batch stream --------------------------------------------------------------
    def _until_training(self, loader: TunedLoader, source: Iterator[Any]) -> Iterator[Any]:
        """Plain batches until one is trained on: that loader is the training loader, and
        the rest of this ``for`` loop runs the plan."""
        self.empty_loader = True
        for batch in source:
            self.empty_loader = False
            self.pending = loader
            yield batch
            self.pending = None
            if self.loader is loader:
                source.close()  # type: ignore[attr-defined]
                self._step_done(0.0, loader.samples_in(batch))
                yield from self._trials()
                return

    def _trials(self) -> Iterator[Any]:
        """The training loader's batches, while the plan's trials run on them."""
        try:
            self.discontinuity = True  # the first step of this iteration spans the user's gap
            while True:
                generation = self.generation
                source, fresh = self._open_source(), True
                while generation == self.generation:
                    requested = time.perf_counter()
                    batch = next(source, _END)
                    if batch is _END:  # the dataset ran out: start it again, timed (the
                        # run pays each epoch's restart: on docs/examples/train_mlp.py one
                        # worker's restart costs 0.35-0.42 s a 32-step epoch, 12 % of its time;
                        # untimed, the search once kept that worker: 0.72 of the best)
                        if fresh:
                            raise RuntimeError("the loader yields no batch (a dataset smaller "
                                               "than batch_size with drop_last=True?)")
                        source, fresh = self._open_source(), True
                        continue
                    fresh = False
                    wait = time.perf_counter() - requested
                    samples = self.loader.samples_in(batch)
                    if self.phase == "measure":
                        self.shapes.add(batch_shape(batch))
                    self.timer.step_started()
                    yield batch
                    self._step_done(wait, samples)
        except Exception as exc:
            self.fail(exc)

    def _open_source(self) -> Iterator[Any]:
        if self.phase == "check":
            return self.loader.batches(self.reference["batches"])
        return self.loader.batches()

    # -- trials ------------------------------------------------------------------------
    def _begin(self) -> None:
        # the script's set-up is done: the process-wide switches it set are the baseline's
        # (read when the observer was installed, a set_num_threads(1) after tuned_loop was
        # overridden by every trial: a 9.3x "speed-up" for the one thread it already had)
        if spawned.is_spawned_trainer():  # a loop made before the script forked its trainers
            spawned.refuse(self)
        self.defaults = apply.process_defaults()
        self.started = True
        self.phase = "warmup"
        self._hello()
        if self.plan.trials or self.plan.waits_for_next_plan:
            self._load_reference()
        if not self.plan.trials:
            self._plan_done()
            return
        self._start_trial()

    def _open_results(self) -> io.TextIOWrapper:
        """The current plan's results file, kept open until the next plan's."""
        try:
            return open(protocol.for_rank(self.plan.results, self.rank), "a",  # noqa: SIM115
                        encoding="utf-8")
        except OSError as exc:
            print(f"tuneup: cannot write probe results: {apply.one_line(exc)}", file=sys.stderr,
                  flush=True)
            os._exit(protocol.EXIT_BAD_PLAN)

    def _hello(self) -> None:
        loop, loader = self.loop, self.loader
        reasons = {**loader.fixed_reasons, **self.script_pins(), **self._other_loops()}
        self.say_hello(
            loop.device, reasons, amp_dtypes_here(loop.device.type, reasons),
            effective_batch=loader.dataloader.batch_size, dataset_size=_length(loader.dataset),
            usable_cores=max(1, usable_cores() // (distributed.local_world_size()
                                                   if self.plan.ranks > 1 else 1)),
            ranks=_world_size(), shuffles=loader.shuffles,
            waits_for_next_plan=self.plan.waits_for_next_plan, convolutions=any(
                isinstance(m, torch.nn.modules.conv._ConvNd) for m in loop.eager_model.modules()))

    def say_hello(self, device: torch.device, reasons: dict[str, str], dtypes: list[str],
                  **facts: Any) -> None:
        """The hello event: the script's ``facts`` and the fields every child says the same
        way (the plain loop's child and a trainer's), so the two cannot drift apart."""
        reasons = dict(reasons)
        fixed = sorted(reasons)
        if self.malloc_problem is not None:
            reasons["fixed_malloc_thresholds"] = self.malloc_problem
        self.emit({
            "event": protocol.EVENT_HELLO, "protocol": protocol.PROTOCOL, "pid": os.getpid(),
            "device": device.type, "amp_dtypes": dtypes,
            "compile_available": compile_available(device),
            "every_trial": {} if self.malloc_problem else {"fixed_malloc_thresholds": True},
            "cpu_threads": self.defaults.cpu_threads, "busy_cores": busy_cores() if device.type == "cpu" else 0.0,
            "fixed_knobs": fixed,
            "fixed_reasons": reasons, **facts,
        })

    def _other_loops(self) -> dict[str, str]:
        """With several tuned_loops (a GAN's D and G) only the first is driven and measured:
        the knobs that change a model would be applied to the others unmeasured (bfloat16
        on one side only failed with a dtype mismatch a real run does not have)."""
        if len(self.loops) < 2:
            return {}
        why = (f"the script has {len(self.loops)} tuned_loops and autotune drives and measures "
               "only the first: knobs that change a model are not tuned")
        return {name: why for name in ("amp_dtype", "compile_mode", "micro_batch_size")}

    def script_pins(self) -> dict[str, str]:
        """Process-wide knobs the script set itself, each with how it was seen: the user's
        decision, never tuned (a settings file would override it in the run)."""
        pins: dict[str, str] = {}
        threads = torch.get_num_threads()
        default = torch_default_threads()
        if self.script_threads is not None:
            pins["cpu_threads"] = (f"the script calls torch.set_num_threads"
                                   f"({self.script_threads}) itself")
        elif default is not None and self.threads_at_install != default:
            pins["cpu_threads"] = (f"the script runs {threads} intra-op thread(s) where torch's "
                                   f"default here is {default} (torch.set_num_threads before "
                                   "tuned_loop)")
        if torch.backends.cudnn.benchmark:
            pins["cudnn_benchmark"] = "the script sets torch.backends.cudnn.benchmark itself"
        precision = torch.get_float32_matmul_precision()
        if precision != "highest":
            pins["float32_matmul_precision"] = (f"the script calls torch.set_float32_matmul_"
                                                f"precision({precision!r}) itself")
        return pins

    def _load_reference(self) -> None:
        """The state every trial starts from and the batches check losses are computed on,
        shared by every process of one autotune run through two files (:mod:`.reference`)."""
        state_path, batches_path = self.plan.reference_paths(self.rank)
        if not state_path.exists():
            loop = self.loop
            batches = []
            if self.plan.check_steps:
                plain = torch.utils.data.DataLoader(
                    self.loader.dataset, **self.loader.dataloader_kwargs(Knobs()))
                batches = [batch for batch, _ in zip(plain, range(self.plan.check_steps))]
                del plain
            save_atomically(batches, batches_path)
            save_atomically({**_loop_state(loop),
                              "others": [_loop_state(other) for other in self.loops[1:]]},
                             state_path)
        self.reference = torch.load(state_path, map_location="cpu", weights_only=True)
        self.reference["batches"] = load_own(batches_path) or []  # None: no loss checks

    def _restore(self) -> None:
        """Every loop back to the reference state: the second loop of a GAN kept training
        between trials, and the first loop's check losses drifted with it."""
        states = [self.reference, *self.reference.get("others", [])]
        for loop, state in zip(self.loops, states):
            loop.eager_model.load_state_dict(state["model"])
            loop.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
            if loop.scheduler is not None and state["scheduler"] is not None:
                loop.scheduler.load_state_dict(copy.deepcopy(state["scheduler"]))
            loop.optimizer.zero_grad(set_to_none=True)
            loop.eager_model.zero_grad(set_to_none=True)
            loop.reset_scaler()

    def _start_trial(self) -> None:
        trial = self.plan.trials[self.index]
        self.trial_started = time.perf_counter()
        self.phase = "warmup"
        self.trial_running = True
        self.emit({"event": protocol.EVENT_TRIAL_START, "id": trial["id"], "t": time.time()})
        knobs = Knobs.from_dict(trial.get("knobs") or {})
        loop = self.loop
        if knobs.compile_mode and knobs.without_loader() != self.compiled:
            # Graphs of other knobs would pile up to dynamo's recompile limit, past which it
            # runs eager without a word; a re-run of the same compiled knobs (a race), or of
            # them with other loader knobs, keeps its graphs, so only the first run in a
            # process pays the compile time.
            torch._dynamo.reset()
            self.compiled = knobs.without_loader()
        if loop.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(loop.device)
        loop.configure(apply.filled(knobs, self.defaults))
        if knobs.micro_batch_size:  # a split that changes the gradient fails the trial
            loop.check_next_split()
        self.loader.configure(knobs)
        self._restore()
        self.finite = torch.ones((), dtype=torch.bool, device=loop.device)
        self.step_loss = 0.0
        self.steps = 0
        self.warmup_s: float | None = None
        self.measured_steps = 0
        self.window_steps = None
        self.step_times: list[float] = []
        self.shapes: set[tuple[tuple[int, ...], ...]] = set()  # the measured batches'
        self.step_waits: list[float] = []
        self.step_samples: list[int] = []
        self.check_losses = []
        self.peak_rss = 0
        self.generation += 1
        self.timer.reset(loop.device)
        self.step_ended = time.perf_counter()  # a trial's first step starts now

    def _step_done(self, wait: float, samples: int) -> None:
        self.timer.step_ended(self.phase == "measure" and not self.discontinuity)
        now = time.perf_counter()
        step_s, self.step_ended = now - self.step_ended, now
        self.steps += 1
        if self.plan.parent_pid is not None and parent_gone(self.plan.parent_pid,
                                                             self.direct_parent):
            self.exit_reason = "parent-died"
            self.exit(protocol.EXIT_TRIAL_FAILED)
        if self.loop.device.type == "cpu":
            self.peak_rss = max(self.peak_rss, self.process.memory_info().rss)
        if self.plan.waits_for_next_plan and self.plan.next_plan.exists():
            self._next_plan()  # the parent stopped this plan early: the trial is dropped
        elif self.phase == "warmup":
            if self.warmup_s is None:
                self.warmup_s = now - self.trial_started
            if self.steps >= self.plan.warmup_steps:
                self.phase = "measure"
                if _world_size() > 1:
                    self.window_steps = self._agreed_window(step_s)
                self.last = self._synchronized_time()
        elif self.phase == "measure":
            self.measured_steps += 1
            if not self.discontinuity:
                self.step_times.append(now - self.last)
                self.step_waits.append(wait)
                self.step_samples.append(samples)
            self.last = now
            if self._measured_enough():
                if self.step_times:
                    self.step_times[-1] += self._synchronized_time() - now
                self._finish_measure()
        elif len(self.check_losses) >= self.plan.check_steps:
            self._end_trial()
        self.discontinuity = False

    def _measured_enough(self) -> bool:
        if self.window_steps is not None:  # ranks switch knobs at the same step, or hang
            return self.measured_steps >= self.window_steps
        count = len(self.step_times)
        return count >= self.plan.measure_steps and (
            sum(self.step_times) >= self.plan.min_measure_seconds
            or count >= self.plan.max_measure_steps)

    def _agreed_window(self, step_s: float) -> int:
        """This trial's measured steps, the same on every rank (a rank that ends its window
        early would switch knobs, or start its loss check, while the others still train):
        rank 0 sizes it from its last warm-up step, as a single process sizes its window by
        time, and broadcasts it — one small collective per trial."""
        import torch.distributed as dist

        plan = self.plan
        wanted = math.ceil(plan.min_measure_seconds / max(step_s, 1e-6))
        steps = min(max(wanted, plan.measure_steps), plan.max_measure_steps)
        device = self.loop.device if dist.get_backend() == "nccl" else torch.device("cpu")
        agreed = torch.tensor([steps], dtype=torch.int64, device=device)
        dist.broadcast(agreed, src=0)
        return int(agreed.item())

    def _synchronized_time(self) -> float:
        if self.loop.device.type == "cuda":
            torch.cuda.synchronize(self.loop.device)
        return time.perf_counter()

    def _finish_measure(self) -> None:
        if self.plan.trials[self.index].get("check") and self.reference["batches"]:
            self._restore()
            torch.manual_seed(0)  # the same dropout masks in every trial's check
            self.phase = "check"
            self.generation += 1
        else:
            self._end_trial()

    def _end_trial(self) -> None:
        trial = self.plan.trials[self.index]
        finite = bool(self.finite) and all(math.isfinite(v) for v in self.check_losses)
        measured = sum(self.step_times)
        loop = self.loop
        self.emit({
            "event": protocol.EVENT_TRIAL_END, "id": trial["id"],
            "status": protocol.OK if finite else protocol.NONFINITE,
            "samples_per_s": sum(self.step_samples) / measured if measured else None,
            "step_s": measured / len(self.step_times) if self.step_times else None,
            "step_s_all": [round(t, 6) for t in self.step_times],
            "data_wait_share": sum(self.step_waits) / measured if measured else None,
            "device_s": self.timer.device_s(),
            "warmup_s": self.warmup_s, "steps": self.plan.warmup_steps + len(self.step_times),
            "check_losses": (self.check_losses
                             if trial.get("check") and self.reference["batches"] else None),
            "peak_memory_bytes": (torch.cuda.max_memory_allocated(loop.device)
                                  if loop.device.type == "cuda" else self.peak_rss),
            "micro_batch_size": loop.applied_micro_batch,
            "micro_batch_blocked": loop.micro_batch_blocker(),
            "input_shapes": len(self.shapes) or None,
        })
        self.trial_running = False
        self.index += 1
        if self.index >= len(self.plan.trials):
            self._plan_done()
            return
        self._start_trial()

    def _plan_done(self) -> None:
        self.emit({"event": protocol.EVENT_DONE})
        if not self.plan.waits_for_next_plan:
            self.exit(protocol.EXIT_DONE)
        self._next_plan()

    def _next_plan(self) -> None:
        """Wait for the parent's next plan and run it in this process: the search's next
        comparison pays no second start-up (3.8 s of a 120 s budget a process on
        docs/examples/train_images.py). A plan without trials pauses: its ``done`` tells
        the parent the child took it (so a trial dropped in a failing step cannot be taken
        for the next plan's), and the child waits for the file that plan names. The user's
        loop waits inside its ``next(loader)``."""
        self.trial_running = False
        path = self.plan.next_plan
        while not path.exists():
            if self.plan.parent_pid is not None and parent_gone(self.plan.parent_pid,
                                                                 self.direct_parent):
                self.exit_reason = "parent-died"
                self.exit(protocol.EXIT_TRIAL_FAILED)
            time.sleep(PLAN_POLL_S)
        self.plan = read_plan(path)
        self.out.close()
        self.out = self._open_results()
        if not self.plan.trials:
            self._plan_done()
            return
        self.index = 0
        self._start_trial()

    # -- ending --------------------------------------------------------------------------
    def fail(self, exc: BaseException) -> NoReturn:
        """Record ``exc`` as the running trial's failure and end the process (exit code 3)."""
        traceback.print_exception(exc, file=sys.stderr)
        self._record_failure(exc)
        self.exit(protocol.EXIT_TRIAL_FAILED)

    def _record_failure(self, exc: BaseException) -> None:
        message = apply.one_line(exc)
        if self.trainer is not None:
            self.trainer.announce()  # a trainer's first step failed: its trial failed
        if self.trial_running:
            status = protocol.OOM if apply.is_out_of_memory(exc) else protocol.ERROR
            blocked = self.loop.micro_batch_blocked if self.loop is not None else None
            self.emit({"event": protocol.EVENT_TRIAL_END, "id": self.plan.trials[self.index]["id"],
                       "status": status, "message": message, "phase": self.phase,
                       "micro_batch_blocked": blocked})  # a smaller micro-batch cannot help
        else:
            self.emit({"event": protocol.EVENT_EXIT, "reason": "error", "message": message})
        self.finished = True

    def _excepthook(self, kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        if not self.finished and isinstance(exc, Exception):
            self._record_failure(exc)
        elif isinstance(exc, KeyboardInterrupt):
            self.exit_reason = "interrupted"
        self._previous_excepthook(kind, exc, tb)

    def _at_exit(self) -> None:
        if self.finished or spawned.refused_elsewhere(self.plan):
            return
        event: dict[str, Any] = {
            "event": protocol.EVENT_EXIT, "reason": self.exit_reason, "steps": self.process_steps,
            "trial": self.plan.trials[self.index]["id"] if self.trial_running else None,
        }
        if not self.started:
            event["message"] = self._not_started_reason()
        elif self.trial_running and self.exit_reason == "script-ended":
            event["message"] = (f"the script's loop ended after {self.process_steps} steps, before "
                                f"trial {event['trial']} finished; give it more steps")
        self.emit(event)
        self.finished = True

    def _not_started_reason(self) -> str:
        """What is missing, by what the runtime saw: said as the headline, so it must not
        name a wrapper the script did call."""
        if self.trainer is not None:
            return ("the trainer never started training after tuned_trainer / "
                    "tuned_trainer_kwargs (does the script call train() / fit()?)")
        if self.loop is None:
            also = "" if self.loaders_created else " (nor tuned_loader)"
            return (f"the script never called tuned_loop(model, optimizer){also}, nor "
                    f"tuned_trainer / tuned_trainer_kwargs for a Trainer")
        if not self.loaders_created:
            return "the script never called tuned_loader(dataset, ..., loop=loop)"
        if self.empty_loader:
            return ("a tuned_loader yielded no batch (a dataset smaller than batch_size with "
                    "drop_last=True?)")
        if self.process_steps == 0:
            return ("the script never finished a step through loop.train_step() or "
                    "loop.backward()")
        return "no batch of a tuned_loader was followed by an optimizer step of tuned_loop"

    def emit(self, event: dict[str, Any]) -> None:
        self.out.write(json.dumps(event) + "\n")
        self.out.flush()

    def exit(self, code: int) -> NoReturn:
        self.finished = True
        self.out.flush()
        os.fsync(self.out.fileno())
        sys.stderr.flush()
        os._exit(code)


_END = object()
PLAN_POLL_S = 0.01  # how often an idle child looks for its next plan


def _watch_thread_calls(session: TrialSession) -> None:
    """Note the script's own ``torch.set_num_threads`` calls until training starts (the
    child's own, through :mod:`tuneup.runtime.apply`, come after): a thread count the script
    sets is its decision and the baseline's value."""
    original = torch.set_num_threads

    @functools.wraps(original)
    def set_num_threads(count: int) -> None:
        if not session.started:
            session.script_threads = count
        original(count)

    torch.set_num_threads = set_num_threads


def _loop_state(loop: TunedLoop) -> dict[str, Any]:
    return {"model": loop.eager_model.state_dict(), "optimizer": loop.optimizer.state_dict(),
            "scheduler": loop.scheduler.state_dict() if loop.scheduler else None}


def _length(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except TypeError:
        return None


def _world_size() -> int:
    """Ranks training together (1 without an initialised process group)."""
    import torch.distributed as dist

    return dist.get_world_size() if distributed.initialised() else 1
