"""``tuned_loop``: autocast, accumulation, loss scaling and the optimizer step, from the settings.

The user's loop body runs once per batch the loader yields, tuned or not: a micro-batch
setting is applied *inside* :meth:`TunedLoop.train_step`, which cuts the batch, runs the
user's loss function on each piece and steps the optimizer once. So ``len(loader)``,
schedulers, step counters, logging and eval loops see what they see without tuneup.
"""

from __future__ import annotations

import contextlib
import dis
import functools
import inspect
import types
from collections.abc import Callable
from typing import Any, ContextManager

import torch

from tuneup.runtime import apply, hooks
from tuneup.runtime.batches import UnsplittableBatch, split_plan
from tuneup.runtime.telemetry import Stats, Telemetry
from tuneup.settings import Knobs, SettingsError, store

REDUCTIONS = ("mean", "sum")


class TunedLoop:
    """Wraps a model and its optimizer; see :func:`tuned_loop` and docs/runtime.md."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                 knobs: Knobs, scheduler: Any = None, strict: bool = False) -> None:
        self.eager_model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.device = _device_of(model)
        self.telemetry = Telemetry()
        self.stepped = False  # True once backward()/train_step() stepped the optimizer
        self.strict = strict  # knobs that cannot apply raise instead of warning (autotune)
        self.needs_closure = _step_needs_closure(optimizer)
        self._no_autocast = contextlib.nullcontext()
        self._warned = False  # the settings' micro-batch was said not to apply
        self._split_failure: str | None = None  # why splitting was given up, if it was
        self.configure(knobs)

    def configure(self, knobs: Knobs) -> None:
        """Apply ``knobs``: AMP, compile, process-wide switches (again between autotune trials)."""
        self.knobs = knobs
        self.micro_batch_size = knobs.micro_batch_size
        self.amp_dtype = apply.resolve_amp(knobs.amp_dtype, self.device, self.strict)
        self.scaler = apply.make_scaler(self.amp_dtype, self.device)
        self._model = (apply.compile_model(self.eager_model, knobs.compile_mode, self.strict)
                       if knobs.compile_mode else self.eager_model)
        # looked up once: a failed nn.Module attribute lookup costs microseconds a step
        self._no_sync = getattr(self._model, "no_sync", None)
        if self.scaler is not None and self.needs_closure:
            self._refuse(f"amp_dtype {knobs.amp_dtype}: a GradScaler cannot step "
                         f"{type(self.optimizer).__name__}'s closure; training in float32")
            self.amp_dtype = self.scaler = None
        apply.apply_process_knobs(knobs)
        self.applied_micro_batch: int | None = None  # what the last train_step used
        self.micro_batch_blocked: str | None = None  # why micro-batching cannot apply here
        self._told: tuple[int | None, str | None] | None = None

    def reset_scaler(self) -> None:
        """A fresh GradScaler (float16 on CUDA), as after :meth:`configure`."""
        if self.scaler is not None:
            self.scaler = apply.make_scaler(self.amp_dtype, self.device)

    def _refuse(self, message: str) -> None:
        if self.strict:
            raise SettingsError(message)
        store.warn(message)

    @property
    def model(self) -> torch.nn.Module:
        """The module to call for the forward pass (compiled when the settings say so)."""
        return self._model

    def autocast(self) -> ContextManager[Any]:
        """``torch.autocast`` for the tuned AMP dtype, or nothing."""
        if self.amp_dtype is None:
            return self._no_autocast
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def step(self) -> ContextManager[Any]:
        """Context for one batch's forward pass and loss: autocast when AMP is on."""
        observers = hooks.current()
        if observers is hooks.NOBODY:
            return self.autocast()
        stack = contextlib.ExitStack()
        stack.enter_context(observers.guard(self))
        stack.enter_context(self.autocast())
        return stack

    # -- the plain form: the user computes the loss of the whole batch -------------------
    def backward(self, loss: torch.Tensor, *, num_items: int | torch.Tensor | None = None,
                 max_grad_norm: float | None = None) -> None:
        """``loss.backward()``, then clipping, the optimizer step, ``zero_grad`` and the scheduler.

        Exactly the plain loop, one optimizer step per call. ``loss`` is what you would call
        ``.backward()`` on; with ``num_items`` it is a *sum* over that many items and the
        loop backpropagates ``loss / num_items``. Micro-batching needs :meth:`train_step`.
        """
        if self.needs_closure:
            raise TypeError(f"{type(self.optimizer).__name__}.step() needs a closure: use "
                            "loop.train_step(batch, loss_fn), which builds it")
        observers = hooks.current()
        self._note_micro_batching(None, _PLAIN_FORM if self.micro_batch_size else None)
        with _NOTHING if observers is hooks.NOBODY else observers.guard(self):
            weight = 1.0 if num_items is None else 1.0 / num_items
            self._backpropagate(loss, weight, observers, keep=False)
            self._optimizer_step(max_grad_norm, observers)

    # -- the splittable form: the loop runs the user's loss function -------------------
    def train_step(self, batch: Any, loss_fn: Callable[[Any], torch.Tensor], *,
                   reduction: str = "mean", num_items: int | torch.Tensor | None = None,
                   max_grad_norm: float | None = None) -> torch.Tensor:
        """One optimizer step on ``batch``: ``loss_fn(batch)`` under autocast, backward, step.

        Args:
            batch: what the loader yielded (moved to the device or not: your ``loss_fn`` sees
                it as you pass it, or a piece of it along dimension 0).
            loss_fn: returns the loss of the batch (or piece) it is given.
            reduction: ``"mean"`` when ``loss_fn`` averages over samples (most losses),
                ``"sum"`` when it sums (``reduction="sum"``).
            num_items: with a ``loss_fn`` that sums over items (tokens), their count in the
                whole ``batch``: the loop backpropagates ``sum / num_items``.
            max_grad_norm: clip the gradient's norm before the step.

        Returns:
            The batch's loss as the plain loop backpropagates it (detached): the mean, the
            sum, or ``sum / num_items``.

        With a tuned micro-batch the batch is cut into pieces whose gradients add up to the
        whole batch's (each mean weighted by its share of the samples), so the result is
        the same as without tuneup, up to float rounding. Without one this is exactly
        ``loss_fn(batch).backward()`` and the step. Example::

            loss = loop.train_step((x, y), lambda b: F.cross_entropy(loop.model(b[0]), b[1]))
        """
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, not {reduction!r}")
        observers = hooks.current()
        with _NOTHING if observers is hooks.NOBODY else observers.guard(self):
            pieces = self._pieces(batch, loss_fn)
            if self.needs_closure:
                return self._closure_step(pieces, loss_fn, reduction, num_items,
                                          max_grad_norm, observers)
            try:
                total = self._accumulate(pieces, loss_fn, reduction, num_items, observers)
            except BaseException as exc:
                self.optimizer.zero_grad()  # as in the plain loop: no half-batch gradient left
                if not self._falls_back(pieces, exc):
                    raise
                total = self.train_step(batch, loss_fn, reduction=reduction,
                                        num_items=num_items, max_grad_norm=max_grad_norm)
                return total
            self._optimizer_step(max_grad_norm, observers)
        return total

    def _falls_back(self, pieces: list[tuple[Any, float]], exc: BaseException) -> bool:
        """After ``loss_fn`` failed on a piece: train whole batches from now on when the
        failure may come from the split itself (state sized for the whole batch, e.g. a
        carried hidden state), so the whole batch is tried once more. Never under autotune,
        where the failure must show, and never for out-of-memory or interrupts."""
        if (len(pieces) == 1 or self.strict or not isinstance(exc, Exception)
                or apply.is_out_of_memory(exc)):
            return False
        self._split_failure = (f"loss_fn failed on a micro-batch ({apply.one_line(exc)}); "
                               "it may hold state sized for the whole batch")
        return True

    def _pieces(self, batch: Any, loss_fn: Callable[[Any], Any]) -> list[tuple[Any, float]]:
        """``batch`` as (piece, share of its samples) pairs, and why not split when it is not."""
        micro, blocked = self.micro_batch_size, None
        if micro is None:
            return self._whole(batch, None)
        if self.needs_closure:
            blocked = f"{type(self.optimizer).__name__} steps with a closure"
        elif self._split_failure is not None:
            blocked = self._split_failure
        elif (kept := _kept_state(loss_fn)) is not None:
            blocked = f"loss_fn keeps state between calls ({kept}), which pieces would change"
        else:
            try:
                plan = split_plan(batch, micro)
            except UnsplittableBatch as exc:
                blocked = str(exc)
            else:
                self._note_micro_batching(micro if len(plan) > 1 else None, None)
                return plan
        return self._whole(batch, blocked)

    def _whole(self, batch: Any, blocked: str | None) -> list[tuple[Any, float]]:
        self._note_micro_batching(None, blocked)
        return [(batch, 1.0)]

    def _note_micro_batching(self, applied: int | None, blocked: str | None) -> None:
        """Record what micro-batching did; tell observers of a change, and warn once when the
        settings' value cannot apply here."""
        self.applied_micro_batch, self.micro_batch_blocked = applied, blocked
        if self._told == (applied, blocked):
            return
        if blocked is not None and not self.strict and not self._warned:
            self._warned = True
            store.warn(f"micro_batch_size={self.micro_batch_size} from the settings is not "
                       f"applied: {blocked}; training on whole batches")
        self._told = (applied, blocked)
        observers = hooks.current()
        if observers is not hooks.NOBODY:
            observers.micro_batching(self, applied, blocked)

    def _accumulate(self, pieces: list[tuple[Any, float]], loss_fn: Callable[[Any], Any],
                    reduction: str, num_items: Any, observers: hooks.Observer) -> torch.Tensor:
        total: Any = None
        last = len(pieces) - 1
        for index, (piece, share) in enumerate(pieces):
            with self._sync_gradients(index == last):
                with self.autocast():
                    loss = loss_fn(piece)
                if num_items is not None:
                    weight: Any = 1.0 / num_items
                else:
                    weight = share if reduction == "mean" else 1.0
                part = self._backpropagate(loss, weight, observers)
            total = part if total is None else total + part
        return total

    def _sync_gradients(self, sync: bool) -> ContextManager[Any]:
        """DDP (and FSDP) all-reduce gradients in every backward: on all pieces but the last,
        ``no_sync()`` skips it, so a split batch costs one all-reduce per optimizer step. The
        gradients the optimizer sees are the same; only the communication is less."""
        no_sync = self._no_sync
        return _NOTHING if sync or no_sync is None else no_sync()

    def _closure_step(self, pieces: list[tuple[Any, float]], loss_fn: Callable[[Any], Any],
                      reduction: str, num_items: Any, max_grad_norm: float | None,
                      observers: hooks.Observer) -> torch.Tensor:
        """Optimizers that re-evaluate the loss (LBFGS): the closure runs the whole batch."""
        def closure() -> torch.Tensor:
            self.optimizer.zero_grad()
            total = self._accumulate(pieces, loss_fn, reduction, num_items, observers)
            if max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(self._parameters(), max_grad_norm)
            return total

        total = self.optimizer.step(closure)
        self._after_step(observers)
        return total

    def _backpropagate(self, loss: torch.Tensor, weight: Any, observers: hooks.Observer,
                       keep: bool = True) -> torch.Tensor | None:
        """Backward of ``loss * weight`` (just ``loss`` for weight 1: bit-identical to plain);
        the detached loss when ``keep`` (``train_step`` returns it; ``backward`` does not)."""
        if observers is not hooks.NOBODY:
            observers.loss(self, loss, weight)
        scaled = loss if _is_one(weight) else loss * weight
        (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
        return scaled.detach() if keep else None

    def _optimizer_step(self, max_grad_norm: float | None, observers: hooks.Observer) -> None:
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
        self._after_step(observers)

    def _after_step(self, observers: hooks.Observer) -> None:
        if self.scheduler is not None:
            self.scheduler.step()
        self.stepped = True
        self.telemetry.steps += 1
        if observers is not hooks.NOBODY:
            observers.optimizer_stepped(self)

    def _parameters(self) -> list[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def stats(self) -> Stats:
        """Input-stall share, samples/s and steps so far (fed by the linked loader)."""
        return self.telemetry.stats()


_PLAIN_FORM = "the script computes its loss outside loop.train_step"
_NOTHING = contextlib.nullcontext()  # reusable: one per step would cost an allocation


_STORES = {"STORE_DEREF": "nonlocal", "STORE_GLOBAL": "global", "STORE_ATTR": "attribute"}


@functools.lru_cache(maxsize=64)
def _stored_names(code: types.CodeType) -> str | None:
    for instruction in dis.get_instructions(code):
        kind = _STORES.get(instruction.opname)
        if kind is not None and (kind != "nonlocal" or instruction.argval in code.co_freevars):
            return f"it assigns {kind} {instruction.argval!r}"
    return None


def _kept_state(loss_fn: Callable[[Any], Any]) -> str | None:
    """How ``loss_fn`` carries state from one call to the next (a carried RNN state, a
    counter), read from its code; None when it assigns nothing outside itself."""
    code = getattr(getattr(loss_fn, "__func__", loss_fn), "__code__", None)
    return None if code is None else _stored_names(code)


def _is_one(weight: Any) -> bool:
    return isinstance(weight, float) and weight == 1.0


def _step_needs_closure(optimizer: torch.optim.Optimizer) -> bool:
    """True for optimizers whose ``step`` requires a closure (LBFGS)."""
    try:
        parameter = inspect.signature(optimizer.step).parameters.get("closure")
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.default is inspect.Parameter.empty


def _device_of(model: torch.nn.Module) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    for tensor in model.buffers():
        return tensor.device
    return torch.device("cpu")


def tuned_loop(model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
               scheduler: Any = None, adapt: bool = False) -> TunedLoop:
    """Wrap ``model`` and ``optimizer`` with the tuned compile mode, AMP dtype, threads and
    micro-batch size.

    Args:
        model: your module, already on its device.
        optimizer: its optimizer.
        scheduler: a per-step LR scheduler, stepped once per optimizer step (= once per
            batch). Step per-epoch schedulers yourself, as before.
        adapt: when the loop waits for data more than 20 % of an epoch, give the next epoch
            one more DataLoader worker (up to the usable cores), then a deeper prefetch; said
            once per change, never changing which samples come in which order. Off by default.

    Without a settings file (or with ``TUNEUP_DISABLE=1``) this is plain PyTorch:
    ``loop.backward(loss)`` is ``loss.backward(); optimizer.step(); optimizer.zero_grad()``.
    Example::

        loop = tuned_loop(model, optimizer)
        for batch in tuned_loader(dataset, batch_size=256, shuffle=True):
            loop.train_step(batch, lambda b: F.cross_entropy(loop.model(b[0]), b[1]))
    """
    hooks.install_from_environment()
    observers = hooks.current()
    knobs = apply.settings_knobs()
    if observers is not hooks.NOBODY:
        knobs = observers.initial_knobs(knobs)
    loop = TunedLoop(model, optimizer, knobs=knobs, scheduler=scheduler)
    if observers is not hooks.NOBODY:
        observers.loop_created(loop)
    if adapt and not store.disabled():
        from tuneup.runtime import adapt as adaptation  # only scripts that ask pay its import

        adaptation.install(loop)
    return loop
