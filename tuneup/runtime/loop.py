"""``tuned_loop``: autocast, accumulation, loss scaling and the optimizer step, from the settings."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, ContextManager

import torch

from tuneup.runtime import apply
from tuneup.runtime.telemetry import Stats, Telemetry
from tuneup.settings import Knobs

if TYPE_CHECKING:
    from tuneup.autotune.child import Driver


class TunedLoop:
    """Wraps a model and its optimizer; see :func:`tuned_loop` and docs/runtime.md."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                 knobs: Knobs, scheduler: Any = None, probe: Driver | None = None) -> None:
        self.eager_model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.device = _device_of(model)
        self.telemetry = Telemetry()
        self.stepped = False  # True when the last backward() ended with an optimizer step
        self._probe = probe
        self._no_autocast = contextlib.nullcontext()
        # Set by the loader for every micro-batch it yields: this micro-batch's share of the
        # samples of its effective batch, whether it is the last one, and whether it is split.
        self._share = 1.0
        self._boundary = True
        self._split = False
        self._items: Any = 0  # num_items summed over the current effective batch
        self._counting: bool | None = None  # whether the current effective batch passes them
        self.configure(knobs)

    def configure(self, knobs: Knobs) -> None:
        """Apply ``knobs`` (the autotune child calls this again between trials)."""
        strict = self._probe is not None
        self.knobs = knobs
        self.micro_batch_size = knobs.micro_batch_size
        self.amp_dtype = apply.resolve_amp(knobs.amp_dtype, self.device, strict)
        self.scaler = apply.make_scaler(self.amp_dtype, self.device)
        self._model = (apply.compile_model(self.eager_model, knobs.compile_mode, strict)
                       if knobs.compile_mode else self.eager_model)
        apply.apply_process_knobs(knobs)
        self._items, self._counting = 0, None

    @property
    def model(self) -> torch.nn.Module:
        """The module to call for the forward pass (compiled when the settings say so)."""
        return self._model

    def step(self) -> ContextManager[Any]:
        """Context for one micro-step's forward pass and loss: autocast when AMP is on."""
        context = (torch.autocast(self.device.type, dtype=self.amp_dtype)
                   if self.amp_dtype is not None else self._no_autocast)
        return context if self._probe is None else self._probe.guard(context)

    def backward(self, loss: torch.Tensor, *, num_items: int | torch.Tensor | None = None,
                 max_grad_norm: float | None = None) -> None:
        """Backward for one micro-batch; at the end of the effective batch, the optimizer step.

        ``loss`` is a mean over this micro-batch's samples (what most losses return).
        For token-level losses pass the *sum* over this micro-batch's items as ``loss`` and
        their count as ``num_items``: the gradient then is that of the mean over all items
        of the effective batch. ``max_grad_norm`` clips the gradient's norm before the step.
        """
        if self._probe is None:
            self._backward(loss, num_items, max_grad_norm)
        else:
            self._probe.run(self._backward, loss, num_items, max_grad_norm)

    def _backward(self, loss: torch.Tensor, num_items: Any, max_grad_norm: float | None) -> None:
        counting = num_items is not None
        if self._counting is None:
            self._counting = counting
        elif counting != self._counting:
            raise ValueError("pass num_items to every loop.backward() of an effective batch "
                             "or to none of them")
        if counting:
            self._items = self._items + num_items
        elif self._split:
            loss = loss * self._share
        if self._probe is not None:
            self._probe.record_loss(loss, num_items if counting else self._share)
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        self.stepped = self._boundary
        if self._boundary:
            self._optimizer_step(max_grad_norm)

    def _optimizer_step(self, max_grad_norm: float | None) -> None:
        counting, items = self._counting, self._items
        self._counting, self._items = None, 0
        if counting:  # the loss was a sum over items: make it their mean
            grads = [p.grad for p in self._parameters() if p.grad is not None]
            if grads:
                torch._foreach_div_(grads, items)
        if max_grad_norm is not None:
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self._parameters(), max_grad_norm)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad()
        if self.scheduler is not None:
            self.scheduler.step()
        self.telemetry.steps += 1
        if self._probe is not None:
            self._probe.optimizer_stepped()

    def _parameters(self) -> list[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def stats(self) -> Stats:
        """Input-stall share, samples/s and steps so far (fed by the linked loader)."""
        return self.telemetry.stats()


def _device_of(model: torch.nn.Module) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    for tensor in model.buffers():
        return tensor.device
    return torch.device("cpu")


def tuned_loop(model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
               scheduler: Any = None) -> TunedLoop:
    """Wrap ``model`` and ``optimizer`` with the tuned compile mode, AMP dtype and threads.

    Without a settings file (or with ``TUNEUP_DISABLE=1``) this is plain PyTorch:
    ``loop.backward(loss)`` is ``loss.backward(); optimizer.step(); optimizer.zero_grad()``.
    ``scheduler``, when given, steps once per optimizer step.
    """
    from tuneup.autotune import child

    probe = child.driver()
    knobs = Knobs() if probe is not None else apply.settings_knobs()
    loop = TunedLoop(model, optimizer, knobs=knobs, scheduler=scheduler, probe=probe)
    if probe is not None:
        probe.attach_loop(loop)
    return loop
