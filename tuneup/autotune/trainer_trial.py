"""One trial inside a trainer that owns its loop (transformers, Lightning): a process a trial.

Such a trainer builds its loader, precision, accumulation and compiled model once, when
``train()`` / ``fit()`` starts, so its knobs cannot change between windows of one run as
``tuned_loop``'s do. The child therefore applies the plan's first trial when the trainer is
built (``trainer_knobs``), times the optimizer steps its integration's callback reports
(``trainer_step``), and ends the process after that one trial; the runner runs the plan's
other trials each in a fresh process, and the budget prices each a start-up
(``hello.trials_per_process``). Every trial starts from the same weights (the run's
reference file, as for ``tuned_loop``) and sees the same first batches (the order is seeded:
transformers by ``args.seed``, Lightning's sampler by torch's generator, seeded here), so the
first steps' losses are compared across trials like the plain loop's check losses.
"""

from __future__ import annotations

import math
import random
import sys
import time
from typing import TYPE_CHECKING, Any, NoReturn

import torch

from tuneup.autotune import protocol
from tuneup.autotune.child_facts import (
    amp_dtypes_here,
    save_atomically,
    usable_cores,
)
from tuneup.runtime.hooks import TrainerRun
from tuneup.settings import Knobs

if TYPE_CHECKING:
    from tuneup.autotune.child import TrialSession

SEED = 0  # the global generators' seed in every trial: the same first batches and dropout


class TrainerTrial:
    """The plan's first trial, run on a trainer's optimizer steps."""

    def __init__(self, session: TrialSession, run: TrainerRun) -> None:
        self.session = session
        self.run = run
        run.saves = False  # a trial's checkpoints are not the run's
        plan = session.plan
        self.entry = plan.trials[0] if plan.trials else None
        self.knobs = Knobs.from_dict(self.entry.get("knobs") or {}) if self.entry else Knobs()
        self.steps = 0
        self.started = time.perf_counter()
        self.last = self.started
        self.warmup_s: float | None = None
        self.step_times: list[float] = []
        self.losses: list[float | None] = []
        self.finite: Any = True  # every step's loss so far (a device flag: read once, at the end)
        self.first_of_run = True  # no earlier trial of this autotune run wrote the reference
        self.paused = False  # evaluation or a checkpoint since the last step: not timed

    # -- the hooks, as the session passes them on ---------------------------------------
    def ready(self) -> None:
        """The trainer is about to load its first batch (its loaders may not be built yet):
        start from the reference weights with seeded generators, and start the clock."""
        self._same_start()
        if self.run.device_type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        self.started = self.last = time.perf_counter()

    def step(self, loss: Any) -> None:
        """One optimizer step of the trainer (``loss``: a tensor or number, or None): warm-up,
        then the measured window. Only the checked steps read the loss (a device sync)."""
        session = self.session
        now = time.perf_counter()
        if self.steps == 0:
            self._begin()
        self.steps += 1
        session.process_steps = self.steps
        plan = session.plan
        if session.parent_gone():
            session.exit_reason = "parent-died"
            self._finish(protocol.EXIT_TRIAL_FAILED)
        if isinstance(loss, torch.Tensor):
            self.finite = self.finite & torch.isfinite(loss.detach()).all()
        if len(self.losses) < plan.check_steps:
            self.losses.append(float(loss) if loss is not None else None)
        if self.steps <= plan.warmup_steps:
            if self.warmup_s is None:
                self.warmup_s = now - self.started
            if self.steps == plan.warmup_steps:
                self.last = self._synchronized(now)
            self.paused = False  # a sanity check or a first evaluation is the warm-up's
            return
        if not self.paused:
            self.step_times.append(now - self.last)
        self.last, self.paused = now, False
        if self._measured_enough() and len(self.losses) >= plan.check_steps:
            self.step_times[-1] += self._synchronized(now) - now
            self._end()

    # -- the trial ------------------------------------------------------------------------
    def announce(self) -> None:
        """Say hello and start the trial (once): at the first step, or when the script fails
        before it, so the failure counts as the trial's (an OOM there is the trial's OOM)."""
        session = self.session
        if session.started:
            return
        session.started = True
        self._hello()
        if self.entry is None:
            self._finish(protocol.EXIT_DONE)
        session.trial_running = True
        session.index = 0
        session.emit({"event": protocol.EVENT_TRIAL_START, "id": self.entry["id"],
                      "t": time.time()})

    def _begin(self) -> None:
        """The first step is done, so the trainer's loaders are known: say hello and start
        the trial, or fail it when a knob it asks for could not apply (no silent fallback)
        or the script runs under torchrun (each rank would end its window at another step)."""
        session = self.session
        self.announce()
        if session.plan.ranks > 1:
            self.run.unapplied.setdefault(
                "nproc_per_node", "autotune runs a trainer's trials in one process: tune it "
                "without --nproc-per-node")
        if self.run.unapplied:
            knob, why = next(iter(self.run.unapplied.items()))
            session.emit({"event": protocol.EVENT_TRIAL_END, "id": self.entry["id"],
                          "status": protocol.ERROR, "phase": "start",
                          "message": f"{knob} cannot apply to this {self.run.framework} "
                                     f"trainer: {why}"})
            self._finish(protocol.EXIT_TRIAL_FAILED)

    def _hello(self) -> None:
        session, run = self.session, self.run
        reasons = {**run.fixed_reasons, **session.script_pins()}
        # measured once a run (only the first hello is read)
        dtypes = amp_dtypes_here(run.device_type, reasons, measure=self.first_of_run)
        session.say_hello(
            torch.device(run.device_type), reasons, dtypes, effective_batch=run.effective_batch,
            samples_per_step=run.samples_per_step, dataset_size=run.dataset_size,
            usable_cores=usable_cores(), ranks=1, shuffles=True,
            waits_for_next_plan=False, trials_per_process=1, trainer=run.framework)

    def _same_start(self) -> None:
        """The run's reference weights (the first trial's process writes them), and seeded
        global generators, so every trial's first steps see the same model and batches."""
        model = self.run.model
        path = self.session.plan.reference_paths()[0]
        self.first_of_run = not path.exists()
        if model is not None:
            if path.exists():
                state = torch.load(path, map_location="cpu", weights_only=True)
                model.load_state_dict(state["model"])
            else:
                save_atomically({"model": model.state_dict()}, path)
        torch.manual_seed(SEED)
        random.seed(SEED)
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed(SEED)

    def _measured_enough(self) -> bool:
        plan, count = self.session.plan, len(self.step_times)
        return count >= plan.measure_steps and (
            sum(self.step_times) >= plan.min_measure_seconds or count >= plan.max_measure_steps)

    def _synchronized(self, now: float) -> float:
        if self.run.device_type == "cuda":
            torch.cuda.synchronize()
            return time.perf_counter()
        return now

    def _end(self) -> NoReturn:
        measured = sum(self.step_times)
        losses = [v for v in self.losses if v is not None]
        checked = bool(self.entry.get("check")) and len(losses) == len(self.losses) > 0
        finite = bool(self.finite) and all(map(math.isfinite, losses))
        batch = self.run.samples_per_step
        self.session.emit({
            "event": protocol.EVENT_TRIAL_END, "id": self.entry["id"],
            "status": protocol.OK if finite else protocol.NONFINITE,
            "samples_per_s": (batch * len(self.step_times) / measured
                              if measured and batch else None),
            "step_s": measured / len(self.step_times),
            "step_s_all": [round(t, 6) for t in self.step_times],
            "data_wait_share": None,  # the trainer fetches its batches inside its own step
            "warmup_s": self.warmup_s, "steps": self.steps,
            "check_losses": losses if checked else None,
            "peak_memory_bytes": (torch.cuda.max_memory_allocated()
                                  if self.run.device_type == "cuda"
                                  else self.session.process.memory_info().rss),
            "micro_batch_size": self.knobs.micro_batch_size,
        })
        self._finish(protocol.EXIT_DONE)

    def _finish(self, code: int) -> NoReturn:
        """End the process: the trainer's remaining steps, evaluation and saving are not
        the trial's (the runner starts the next trial in a fresh process)."""
        self.session.emit({"event": protocol.EVENT_DONE})
        self.session.exit(code)
