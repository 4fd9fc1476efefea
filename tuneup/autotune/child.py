"""The autotune child: runs a trial plan inside the user's own training loop.

Active when ``TUNEUP_PROBE=plan.json`` is set (the parent, ``tuneup autotune``, sets it).
The wrappers hand control here: the loop-linked ``tuned_loader`` iterates through
:meth:`Driver.iterate`, which switches knobs between windows of the user's steps, times
them and streams one JSON line per event. See docs/probe-protocol.md.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import importlib.util
import json
import math
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ContextManager, NoReturn

import psutil
import torch

from tuneup.doctor import probe
from tuneup.runtime import apply
from tuneup.settings import AMP_DTYPES, Knobs

if TYPE_CHECKING:
    from tuneup.runtime.loader import TunedLoader
    from tuneup.runtime.loop import TunedLoop

ENV_PROBE = "TUNEUP_PROBE"
PROTOCOL = 1
EXIT_DONE = 0
EXIT_BAD_PLAN = 2
EXIT_TRIAL_FAILED = 3

_driver: Driver | None = None


def driver() -> Driver | None:
    """The process's trial driver when ``TUNEUP_PROBE`` is set, else None."""
    global _driver
    if _driver is None and os.environ.get(ENV_PROBE):
        _driver = Driver(read_plan(Path(os.environ[ENV_PROBE])))
    return _driver


@dataclass
class Plan:
    """The parent's trial plan (docs/probe-protocol.md)."""

    results: Path
    trials: list[dict[str, Any]]
    warmup_steps: int = 2
    measure_steps: int = 6
    min_measure_seconds: float = 1.0
    max_measure_steps: int = 50
    check_steps: int = 3
    reference: Path | None = None

    @property
    def reference_path(self) -> Path:
        return self.reference or self.results.with_name(self.results.name + ".reference.pt")


def read_plan(path: Path) -> Plan:
    """Parse the plan; a bad one ends the process with exit code 2 and a one-line message."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("protocol") != PROTOCOL:
            raise ValueError(f"protocol {data.get('protocol')!r} is not {PROTOCOL}")
        trials = data["trials"]
        if not isinstance(trials, list) or not all(
                isinstance(t, dict) and isinstance(t.get("id"), str) for t in trials):
            raise ValueError("'trials' must be a list of objects with a string 'id'")
        known = {"results", "trials", "warmup_steps", "measure_steps", "min_measure_seconds",
                 "max_measure_steps", "check_steps", "reference"}
        plan = Plan(**{k: v for k, v in data.items() if k in known})
        plan.results = Path(plan.results)
        plan.reference = Path(plan.reference) if plan.reference else None
        plan.warmup_steps = max(1, int(plan.warmup_steps))
        for name in ("measure_steps", "max_measure_steps", "check_steps"):
            setattr(plan, name, max(0 if name == "check_steps" else 1, int(getattr(plan, name))))
        plan.min_measure_seconds = float(plan.min_measure_seconds)
        return plan
    except Exception as exc:
        print(f"tuneup: bad probe plan {path}: {apply.one_line(exc)}", file=sys.stderr, flush=True)
        os._exit(EXIT_BAD_PLAN)


class Driver:
    """Runs the plan's trials, one window of the user's steps after another."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        try:
            self.out = open(plan.results, "a", encoding="utf-8")  # noqa: SIM115 (process-long)
        except OSError as exc:
            print(f"tuneup: cannot write probe results: {apply.one_line(exc)}", file=sys.stderr,
                  flush=True)
            os._exit(EXIT_BAD_PLAN)
        self.defaults = apply.process_defaults()
        self.loop: TunedLoop | None = None
        self.loader: TunedLoader | None = None
        self.started = False
        self.phase = "idle"  # idle -> (warmup -> measure -> check) per trial
        self.trial_running = False
        self.finite: Any = True
        self.step_loss: Any = 0.0
        self.step_weight: Any = 0
        self.finished = False
        self.exit_reason = "script-ended"
        self.discontinuity = True  # the next step spans something that is not training
        self.index = 0
        self.generation = 0  # bumped whenever the batch source must be reopened
        self.process_steps = 0
        self.reference: dict[str, Any] = {}
        self.process = psutil.Process()
        self._previous_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        atexit.register(self._at_exit)

    # -- wiring from the runtime -------------------------------------------------------
    def attach_loop(self, loop: TunedLoop) -> None:
        if self.loop is None:
            self.loop = loop

    @contextlib.contextmanager
    def guard(self, context: ContextManager[Any]) -> Iterator[None]:
        """``context``, turning any exception of the user's step into a failed trial."""
        try:
            with context:
                yield
        except Exception as exc:
            self.fail(exc)

    def run(self, function: Callable[..., None], *args: Any) -> None:
        try:
            function(*args)
        except Exception as exc:
            self.fail(exc)

    def record_loss(self, contribution: torch.Tensor, weight: Any) -> None:
        """Called by the loop for every micro-step: the loss it backpropagates and its weight
        (share of samples, or item count); a step's loss = sum of these / sum of weights."""
        detached = contribution.detach()
        self.finite = self.finite & torch.isfinite(detached).all()
        if self.phase == "check":
            self.step_loss = self.step_loss + detached.float()
            self.step_weight = self.step_weight + weight

    def optimizer_stepped(self) -> None:
        self.process_steps += 1
        if self.phase == "check":
            self.check_losses.append(float(self.step_loss / self.step_weight))
            self.step_loss, self.step_weight = 0.0, 0

    # -- the batch stream --------------------------------------------------------------
    def iterate(self, loader: TunedLoader) -> Iterator[Any]:
        """The loop-linked loader's batches, while the plan's trials run on them."""
        if self.loader is not None and loader is not self.loader:
            yield from loader._iterate()  # a second loader (validation): plain
            return
        self.loader = loader
        try:
            if not self.started:
                self._begin()
            self.discontinuity = True  # the first step of this iteration spans the user's gap
            while True:
                generation = self.generation
                source, fresh = self._open_source(), True
                while generation == self.generation:
                    requested = time.perf_counter()
                    batch = next(source, _END)
                    if batch is _END:  # the dataset ran out: start it again
                        if fresh:
                            raise RuntimeError("the loader yields no batch (a dataset smaller "
                                               "than batch_size with drop_last=True?)")
                        source, fresh = self._open_source(), True
                        self.discontinuity = True
                        continue
                    fresh = False
                    wait = time.perf_counter() - requested
                    samples = loader.samples_in(batch)
                    yield from loader.micro_batches(batch, loader.micro_batch_size)
                    self._step_done(wait, samples)
        except Exception as exc:
            self.fail(exc)

    def _open_source(self) -> Iterator[Any]:
        if self.phase == "check":
            return iter(self.reference["batches"])
        return iter(self.loader.dataloader)

    # -- trials ------------------------------------------------------------------------
    def _begin(self) -> None:
        self.started = True
        self.phase = "warmup"
        self._hello()
        if not self.plan.trials:
            self.emit({"event": "done"})
            self._exit(EXIT_DONE)
        self._load_reference()
        self._start_trial()

    def _hello(self) -> None:
        loop, loader = self.loop, self.loader
        bf16 = loop.device.type != "cuda" or torch.cuda.is_bf16_supported()
        self.emit({
            "event": "hello", "protocol": PROTOCOL, "pid": os.getpid(),
            "device": loop.device.type, "effective_batch": loader.dataloader.batch_size,
            "dataset_size": _length(loader.dataset),
            "amp_dtypes": [d for d in AMP_DTYPES if apply.amp_problem(d, loop.device.type, bf16) is None],
            "compile_available": _compile_available(loop.device),
            "cpu_threads": self.defaults.cpu_threads, "usable_cores": _usable_cores(),
            "fixed_knobs": sorted(k for k in Knobs.LOADER if k in loader.user_kwargs),
        })

    def _load_reference(self) -> None:
        """The state every trial starts from and the batches check losses are computed on,
        shared by every process of one autotune run through the reference file."""
        path = self.plan.reference_path
        if not path.exists():
            loop = self.loop
            batches = []
            if self.plan.check_steps:
                plain = torch.utils.data.DataLoader(
                    self.loader.dataset, **self.loader.dataloader_kwargs(Knobs()))
                batches = [batch for batch, _ in zip(plain, range(self.plan.check_steps))]
                del plain
            state = {"model": loop.eager_model.state_dict(),
                     "optimizer": loop.optimizer.state_dict(),
                     "scheduler": loop.scheduler.state_dict() if loop.scheduler else None,
                     "batches": batches}
            temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            torch.save(state, temporary)
            os.replace(temporary, path)
        self.reference = torch.load(path, map_location="cpu", weights_only=False)

    def _restore(self) -> None:
        loop = self.loop
        loop.eager_model.load_state_dict(self.reference["model"])
        loop.optimizer.load_state_dict(copy.deepcopy(self.reference["optimizer"]))
        if loop.scheduler is not None and self.reference["scheduler"] is not None:
            loop.scheduler.load_state_dict(copy.deepcopy(self.reference["scheduler"]))
        loop.optimizer.zero_grad(set_to_none=True)
        loop.eager_model.zero_grad(set_to_none=True)
        loop.scaler = apply.make_scaler(loop.amp_dtype, loop.device)

    def _start_trial(self) -> None:
        trial = self.plan.trials[self.index]
        self.trial_started = time.perf_counter()
        self.phase = "warmup"
        self.trial_running = True
        self.emit({"event": "trial_start", "id": trial["id"], "t": time.time()})
        knobs = Knobs.from_dict(trial.get("knobs") or {})
        loop = self.loop
        if loop.knobs.compile_mode or knobs.compile_mode:
            torch._dynamo.reset()
        if loop.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(loop.device)
        loop.configure(apply.filled(knobs, self.defaults))
        self.loader.configure(knobs)
        self._restore()
        self.finite = torch.ones((), dtype=torch.bool, device=loop.device)
        self.step_loss, self.step_weight = 0.0, 0
        self.steps = 0
        self.warmup_s: float | None = None
        self.step_times: list[float] = []
        self.step_waits: list[float] = []
        self.step_samples: list[int] = []
        self.check_losses: list[float] = []
        self.peak_rss = 0
        self.generation += 1

    def _step_done(self, wait: float, samples: int) -> None:
        now = time.perf_counter()
        self.steps += 1
        if self.loop.device.type == "cpu":
            self.peak_rss = max(self.peak_rss, self.process.memory_info().rss)
        if self.phase == "warmup":
            if self.warmup_s is None:
                self.warmup_s = now - self.trial_started
            if self.steps >= self.plan.warmup_steps:
                self.phase = "measure"
                self.last = self._synchronized_time()
        elif self.phase == "measure":
            if not self.discontinuity:
                self.step_times.append(now - self.last)
                self.step_waits.append(wait)
                self.step_samples.append(samples)
            self.last = now
            if self._measured_enough():
                self.step_times[-1] += self._synchronized_time() - now
                self._finish_measure()
        elif len(self.check_losses) >= self.plan.check_steps:
            self._end_trial()
        self.discontinuity = False

    def _measured_enough(self) -> bool:
        count = len(self.step_times)
        return count >= self.plan.measure_steps and (
            sum(self.step_times) >= self.plan.min_measure_seconds
            or count >= self.plan.max_measure_steps)

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
            "event": "trial_end", "id": trial["id"], "status": "ok" if finite else "nonfinite",
            "samples_per_s": sum(self.step_samples) / measured if measured else None,
            "step_s": measured / len(self.step_times) if self.step_times else None,
            "step_s_all": [round(t, 6) for t in self.step_times],
            "data_wait_share": sum(self.step_waits) / measured if measured else None,
            "warmup_s": self.warmup_s, "steps": self.plan.warmup_steps + len(self.step_times),
            "check_losses": self.check_losses if trial.get("check") else None,
            "peak_memory_bytes": (torch.cuda.max_memory_allocated(loop.device)
                                  if loop.device.type == "cuda" else self.peak_rss),
            "micro_batch_size": self.loader.micro_batch_size,
        })
        self.trial_running = False
        self.index += 1
        if self.index >= len(self.plan.trials):
            self.emit({"event": "done"})
            self._exit(EXIT_DONE)
        self._start_trial()

    # -- ending --------------------------------------------------------------------------
    def fail(self, exc: BaseException) -> NoReturn:
        """Record ``exc`` as the running trial's failure and end the process (exit code 3)."""
        traceback.print_exception(exc, file=sys.stderr)
        self._record_failure(exc)
        self._exit(EXIT_TRIAL_FAILED)

    def _record_failure(self, exc: BaseException) -> None:
        message = apply.one_line(exc)
        if self.trial_running:
            status = "oom" if apply.is_out_of_memory(exc) else "error"
            self.emit({"event": "trial_end", "id": self.plan.trials[self.index]["id"],
                       "status": status, "message": message, "phase": self.phase})
        else:
            self.emit({"event": "exit", "reason": "error", "message": message})
        self.finished = True

    def _excepthook(self, kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        if not self.finished and isinstance(exc, Exception):
            self._record_failure(exc)
        elif isinstance(exc, KeyboardInterrupt):
            self.exit_reason = "interrupted"
        self._previous_excepthook(kind, exc, tb)

    def _at_exit(self) -> None:
        if self.finished:
            return
        event: dict[str, Any] = {
            "event": "exit", "reason": self.exit_reason, "steps": self.process_steps,
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
        if self.loop is None:
            return "the script called tuned_loader but never tuned_loop; autotune needs " \
                   "tuned_loader(..., loop=tuned_loop(model, optimizer))"
        return "the script never iterated a tuned_loader(..., loop=loop)"

    def emit(self, event: dict[str, Any]) -> None:
        self.out.write(json.dumps(event) + "\n")
        self.out.flush()

    def _exit(self, code: int) -> NoReturn:
        self.finished = True
        self.out.flush()
        os.fsync(self.out.fileno())
        sys.stderr.flush()
        os._exit(code)


_END = object()


def _length(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except TypeError:
        return None


def _usable_cores() -> int:
    """Whole cores the trials may use: the probe's affinity mask capped by the cgroup quota."""
    cores = probe.probe_cpu().usable_cores
    return max(1, int(cores)) if cores else (os.cpu_count() or 1)


def _compile_available(device: torch.device) -> bool:
    """torch.compile can work here: dynamo supports this Python and the backend has its tools."""
    if not torch._dynamo.is_dynamo_supported():
        return False
    if device.type == "cuda":
        return importlib.util.find_spec("triton") is not None
    return any(shutil.which(name) for name in ("c++", "g++", "clang++"))
