"""``tuned_loop``: autocast, accumulation, loss scaling and the optimizer step, from the settings.

The user's loop body runs once per batch the loader yields, tuned or not: a micro-batch
setting is applied *inside* :meth:`TunedLoop.train_step`, which cuts the batch, runs the
user's loss function on each piece and steps the optimizer once. So ``len(loader)``,
schedulers, step counters, logging and eval loops see what they see without tuneup.

A split must not change what is trained, so it is refused where it would: a model with a
layer that normalises with batch statistics (BatchNorm in training mode) is never split, and
autotune's child has each trial's first split checked against the whole batch's gradient
(:func:`split_gradient_change`), which catches losses and layers that mix samples.
"""

from __future__ import annotations

import contextlib
import dis
import functools
import inspect
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ContextManager

import torch
from torch.nn.modules.batchnorm import _BatchNorm, _NormBase
from torch.nn.modules.dropout import _DropoutNd

from tuneup.runtime import apply, hooks
from tuneup.runtime.accelerator import amp_refused, steps_in_backward
from tuneup.runtime.batches import UnsplittableBatch, split_plan
from tuneup.runtime.telemetry import Stats, Telemetry
from tuneup.settings import Knobs, SettingsError, store

REDUCTIONS = ("mean", "sum")
# the split's gradient may differ from the whole batch's by float32 rounding only: summing
# pieces reorders the batch's reductions (about 1e-7 relative on an MLP, see the tests);
# a loss or layer mixing samples differs by percents
GRADIENT_TOLERANCE = 1e-4


class TunedLoop:
    """Wraps a model and its optimizer; see :func:`tuned_loop` and docs/runtime.md."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                 knobs: Knobs, scheduler: Any = None, strict: bool = False,
                 accelerator: Any = None) -> None:
        self.eager_model = model
        self.accelerator = accelerator  # accelerate's: backward, clipping and AMP go through it
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
        self._clip_order: tuple[tuple[int, int], list[torch.Tensor]] | None = None
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
        if self.amp_dtype is not None and (owner := amp_refused(self.accelerator, self.scaler)):
            self._refuse(f"amp_dtype {knobs.amp_dtype} from the settings is not applied: "
                         f"{owner}")
            self.amp_dtype = self.scaler = None
        apply.apply_process_knobs(knobs)
        self.applied_micro_batch: int | None = None  # what the last train_step used
        self.micro_batch_blocked: str | None = None  # why micro-batching cannot apply here
        self._told: tuple[int | None, str | None] | None = None
        self._norm_layers = _norm_layers(self.eager_model)
        self._plain_form = False  # whether the script steps through backward(loss)
        self._check_split = False  # compare the next split's gradient with the whole batch's
        self._split_changes: str | None = None  # why that comparison refused the split

    def check_next_split(self) -> None:
        """Compare the next split's gradient with the whole batch's before training on it
        (:func:`split_gradient_change`); if they differ, micro-batching is blocked until the
        next :meth:`configure`, and with ``strict`` the step raises :class:`SettingsError`.

        Autotune's child calls this in every trial that applies a micro-batch: a loss or a
        layer that mixes the samples of a batch (an in-batch contrastive loss) trains
        something else when split, and no speed is worth that.
        """
        self._check_split = True

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
                 max_grad_norm: float | None = None,
                 clip_parameters: Iterable[torch.Tensor] | None = None) -> None:
        """``loss.backward()``, then clipping, the optimizer step, ``zero_grad`` and the scheduler.

        Exactly the plain loop, one optimizer step per call. ``loss`` is what you would call
        ``.backward()`` on; with ``num_items`` it is a *sum* over that many items and the
        loop backpropagates ``loss / num_items``. Micro-batching needs :meth:`train_step`.
        ``max_grad_norm`` and ``clip_parameters`` are as in :meth:`train_step`.
        """
        if self.needs_closure:
            raise TypeError(f"{type(self.optimizer).__name__}.step() needs a closure: use "
                            "loop.train_step(batch, loss_fn), which builds it")
        observers = hooks.current()
        clip_parameters = None if clip_parameters is None else list(clip_parameters)  # reused
        self._plain_form = True
        self._note_micro_batching(None, _PLAIN_FORM if self.micro_batch_size else None)
        with _NOTHING if observers is hooks.NOBODY else observers.guard(self):
            weight = 1.0 if num_items is None else 1.0 / num_items
            self._backpropagate(loss, weight, observers, keep=False)
            self._optimizer_step(max_grad_norm, observers, clip_parameters)

    # -- the splittable form: the loop runs the user's loss function -------------------
    def train_step(self, batch: Any, loss_fn: Callable[[Any], torch.Tensor], *,
                   reduction: str = "mean", num_items: int | torch.Tensor | None = None,
                   max_grad_norm: float | None = None,
                   clip_parameters: Iterable[torch.Tensor] | None = None) -> torch.Tensor:
        """One optimizer step on ``batch``: ``loss_fn(batch)`` under autocast, backward, step.

        Args:
            batch: what the loader yielded (moved to the device or not: your ``loss_fn`` sees
                it as you pass it, or a piece of it along dimension 0).
            loss_fn: returns the loss of the batch (or piece) it is given.
            reduction: ``"mean"`` when ``loss_fn`` averages over samples (most losses),
                ``"sum"`` when it sums (``reduction="sum"``).
            num_items: with a ``loss_fn`` that sums over items (tokens), their count in the
                whole ``batch``: the loop backpropagates ``sum / num_items``.
            max_grad_norm: clip the gradient's norm before the step, summed in the order of
                ``clip_parameters``, by default the optimizer's parameters in the model's order
                (``model.parameters()``, whatever order the optimizer's groups list them in):
                bit-identical to ``clip_grad_norm_(model.parameters(), max_grad_norm)``.
            clip_parameters: the parameters to clip, in the order your plain loop names them.

        Returns:
            The batch's loss as the plain loop backpropagates it (detached): the mean, the
            sum, or ``sum / num_items``.

        With a tuned micro-batch the batch is cut into pieces whose gradients add up to the
        whole batch's (each mean weighted by its share of the samples), so the result is
        the same as without tuneup, up to float rounding; a model with a layer that
        normalises with batch statistics (BatchNorm in training mode) is never split, and
        ``micro_batch_blocked`` says so (docs/runtime.md). Without a micro-batch this is exactly
        ``loss_fn(batch).backward()`` and the step. Example::

            loss = loop.train_step((x, y), lambda b: F.cross_entropy(loop.model(b[0]), b[1]))
        """
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, not {reduction!r}")
        observers = hooks.current()
        clip_parameters = None if clip_parameters is None else list(clip_parameters)  # reused
        with _NOTHING if observers is hooks.NOBODY else observers.guard(self):
            pieces = self._pieces(batch, loss_fn, reduction, num_items)
            if self.needs_closure:
                return self._closure_step(pieces, loss_fn, reduction, num_items,
                                          max_grad_norm, observers, clip_parameters)
            try:
                total = self._accumulate(pieces, loss_fn, reduction, num_items, observers)
            except BaseException as exc:
                self.optimizer.zero_grad()  # as in the plain loop: no half-batch gradient left
                if not self._falls_back(pieces, exc):
                    raise
                total = self.train_step(batch, loss_fn, reduction=reduction,
                                        num_items=num_items, max_grad_norm=max_grad_norm,
                                        clip_parameters=clip_parameters)
                return total
            self._optimizer_step(max_grad_norm, observers, clip_parameters)
        return total

    def micro_batch_blocker(self) -> str | None:
        """Why no micro-batch could apply to this loop as the script drives it, or None: what
        the loop said when one was set, else the plain form, a closure optimizer, a BatchNorm
        in training mode (autotune says it on every trial, without trying one)."""
        if self.micro_batch_blocked is not None:
            return self.micro_batch_blocked
        if self.needs_closure:
            return f"{type(self.optimizer).__name__} steps with a closure"
        return _PLAIN_FORM if self._plain_form else _batch_statistics(self._norm_layers)

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

    def _pieces(self, batch: Any, loss_fn: Callable[[Any], Any], reduction: str,
                num_items: Any) -> list[tuple[Any, float]]:
        """``batch`` as (piece, share of its samples) pairs, and why not split when it is not."""
        micro, blocked = self.micro_batch_size, None
        if micro is None:
            return self._whole(batch, None)
        if self.needs_closure:
            blocked = f"{type(self.optimizer).__name__} steps with a closure"
        elif steps_in_backward(self.accelerator):
            blocked = "DeepSpeed steps the optimizer inside each accelerator.backward"
        elif self._split_failure is not None:
            blocked = self._split_failure
        elif self._split_changes is not None:
            blocked = self._split_changes
        elif (layer := _batch_statistics(self._norm_layers)) is not None:
            blocked = layer
        elif (kept := _kept_state(loss_fn)) is not None:
            blocked = f"loss_fn keeps state between calls ({kept}), which pieces would change"
        else:
            try:
                plan = split_plan(batch, micro)
            except UnsplittableBatch as exc:
                blocked = str(exc)
            else:
                fits = True
                if self._check_split and len(plan) > 1:
                    self._check_split = False
                    blocked, fits = self._gradient_check(batch, loss_fn, plan, reduction,
                                                         num_items)
                    self._split_changes = blocked
                if blocked is None:
                    self._note_micro_batching(micro if len(plan) > 1 else None, None)
                    return plan
                # autotune: the trial fails, so the search never keeps the micro-batch; when
                # the whole batch does not fit, it fails training it, as out of memory that
                # micro-batches cannot help (the search's words for that)
                if self.strict and fits:
                    self._note_micro_batching(None, blocked)
                    raise SettingsError(f"micro_batch_size={micro} is not applied: {blocked}")
        return self._whole(batch, blocked)

    def _gradient_check(self, batch: Any, loss_fn: Callable[[Any], Any],
                        plan: list[tuple[Any, float]], reduction: str,
                        num_items: Any) -> tuple[str | None, bool]:
        """Why ``plan`` may not be trained (its gradient is not the whole batch's), or None;
        and whether the whole batch fits in memory.

        When the whole batch does not fit in memory (the reason a micro-batch may be
        needed), the split is compared with one into pieces half as large instead: a split
        that does not mix samples gives the same gradient however the batch is cut.
        """
        change, finer = None, False
        try:
            change = self._compare(loss_fn, [(batch, 1.0)], plan, reduction, num_items)
        except Exception as exc:
            if not apply.is_out_of_memory(exc):
                raise
            finer = True  # outside the handler: its traceback holds the failed pass's tensors
        if finer and (smaller := (self.micro_batch_size or 0) // 2):
            change = self._compare(loss_fn, split_plan(batch, smaller), plan, reduction, num_items)
        if change is None or change <= GRADIENT_TOLERANCE:
            return None, not finer
        return (f"the split changes the gradient ({change * 100:.3g} % relative): the loss or "
                "a layer mixes samples"), not finer

    def _compare(self, loss_fn: Callable[[Any], Any], reference: list[tuple[Any, float]],
                 pieces: list[tuple[Any, float]], reduction: str,
                 num_items: Any) -> float | None:
        """:func:`split_gradient_change` on this loop's model, parameters and ``no_sync``.
        ``loop.model`` is the eager model meanwhile: the check asks about the math, and
        compiling for its shapes and float32 would add graphs and their time to the trial."""
        compiled, self._model = self._model, self.eager_model
        try:
            return split_gradient_change(self.eager_model, self._parameters(), loss_fn,
                                         reference, pieces, reduction=reduction,
                                         num_items=num_items, no_sync=self._no_sync)
        finally:
            self._model = compiled

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
                part = self._backpropagate(loss, _weight(share, reduction, num_items), observers)
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
                      observers: hooks.Observer,
                      clip_parameters: Iterable[torch.Tensor] | None) -> torch.Tensor:
        """Optimizers that re-evaluate the loss (LBFGS): the closure runs the whole batch."""
        def closure() -> torch.Tensor:
            self.optimizer.zero_grad()
            total = self._accumulate(pieces, loss_fn, reduction, num_items, observers)
            if max_grad_norm is not None:
                self._clip(clip_parameters, max_grad_norm)
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
        target = self.scaler.scale(scaled) if self.scaler is not None else scaled
        if self.accelerator is None:
            target.backward()
        else:  # its gradient accumulation, loss scaling, DeepSpeed
            self.accelerator.backward(target)
        return scaled.detach() if keep else None

    def _optimizer_step(self, max_grad_norm: float | None, observers: hooks.Observer,
                        clip_parameters: Iterable[torch.Tensor] | None = None) -> None:
        if max_grad_norm is not None:
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            self._clip(clip_parameters, max_grad_norm)
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

    def _clip(self, named: Iterable[torch.Tensor] | None, max_norm: float) -> None:
        """Clip the gradient's norm; through the accelerator, and only on the steps where it
        syncs gradients (as accelerate's examples do), when there is one."""
        if self.accelerator is None:
            torch.nn.utils.clip_grad_norm_(self._clipped(named), max_norm)
        elif self.accelerator.sync_gradients:
            self.accelerator.clip_grad_norm_(self._clipped(named), max_norm)

    def _clipped(self, named: Iterable[torch.Tensor] | None) -> list[torch.Tensor]:
        """What ``max_grad_norm`` clips, in the order the norm is summed: the parameters the
        user names, else the optimizer's in the model's order (then any the model does not
        hold, in the optimizer's). The norm's float sum depends on the order, and scripts
        with weight-decay groups list the optimizer's in another one than the model's."""
        if named is not None:
            return list(named)
        groups = self.optimizer.param_groups
        key = (len(groups), sum(len(group["params"]) for group in groups))
        if self._clip_order is None or self._clip_order[0] != key:
            stepped = {id(p): p for p in self._parameters()}
            ordered = [p for p in self.eager_model.parameters()
                       if stepped.pop(id(p), None) is not None]
            self._clip_order = (key, ordered + list(stepped.values()))
        return self._clip_order[1]

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


def _weight(share: float, reduction: str, num_items: Any) -> Any:
    """What a piece's loss is multiplied by so that the pieces' gradients add up to the
    whole batch's: its share of the samples for a mean, 1 for a sum, 1/count for items."""
    if num_items is not None:
        return 1.0 / num_items
    return share if reduction == "mean" else 1.0


def _norm_layers(model: torch.nn.Module) -> list[tuple[str, _NormBase]]:
    """The model's layers with running statistics or batch statistics (BatchNorm*,
    SyncBatchNorm, InstanceNorm*), read once per configure: their modes are read each step."""
    return [(name, module) for name, module in model.named_modules()
            if isinstance(module, _NormBase)]


def _batch_statistics(layers: list[tuple[str, _NormBase]]) -> str | None:
    """Why a split would train another model, or None: a BatchNorm normalising with the
    statistics of the samples it is given (training mode, or no running statistics) sees a
    piece's; a layer updating running statistics in training mode updates them once per piece.
    Per-sample norms (GroupNorm, LayerNorm, InstanceNorm without running statistics) pass."""
    for name, layer in layers:
        kind = f"{type(layer).__name__} {name!r}"
        if isinstance(layer, _BatchNorm) and (layer.training or layer.running_mean is None):
            return (f"{kind} normalises with the statistics of the batch it is given, which "
                    "a piece would change (and its running statistics with them)")
        if layer.training and layer.track_running_stats:
            return f"{kind} updates its running statistics once per forward, so once per piece"
    return None


def split_gradient_change(model: torch.nn.Module, parameters: list[torch.Tensor],
                          loss_fn: Callable[[Any], Any], reference: list[tuple[Any, float]],
                          pieces: list[tuple[Any, float]], *, reduction: str = "mean",
                          num_items: Any = None,
                          no_sync: Callable[[], ContextManager[Any]] | None = None
                          ) -> float | None:
    """How far the gradient of ``pieces`` is from that of ``reference`` (the whole batch as
    one piece, usually), relative: ``|g_pieces - g_reference| / |g_reference|``.

    A split is only worth its speed if it trains the same model; a loss or layer that mixes
    the samples of a batch (an in-batch contrastive loss, a hand-written batch norm) gives
    another gradient when the batch is cut. Computed in float32 without autocast or TF32
    (the question is the math, not the dtype), with ``nn.Dropout`` layers off, under
    ``no_sync`` (DDP: local gradients, no collective). Nothing the step will see changes:
    the parameters' gradients, the model's buffers, the RNG states and the layers' modes
    are restored. None when the difference is the model's own random draws (outside
    ``nn.Dropout``): the whole batch's gradient then changes with the RNG state alone, so
    the split cannot be judged by it.

    Args:
        model: the module whose buffers and dropout layers are saved and restored.
        parameters: the tensors whose gradients are compared (the optimizer's).
        loss_fn: the user's loss function, called on each piece.
        reference, pieces: (piece, share of the batch's samples) pairs, as ``split_plan``.
        reduction, num_items: as :meth:`TunedLoop.train_step`.
        no_sync: the model's ``no_sync`` (DDP, FSDP), or None.
    """
    grads = [p.grad for p in parameters]
    buffers = [(b, b.detach().clone()) for b in model.buffers()
               if not torch.nn.parameter.is_lazy(b)]
    dropouts = [m for m in model.modules() if isinstance(m, _DropoutNd) and m.training]
    devices = sorted({p.device.index or 0 for p in parameters if p.device.type == "cuda"})
    device_type = parameters[0].device.type if parameters else "cpu"

    def gradient(plan: list[tuple[Any, float]], reseed: bool = False) -> list[Any]:
        with torch.random.fork_rng(devices=devices):  # every pass starts from the step's RNG
            if reseed:  # another state than the step's, the same on every run
                for generator in (torch.default_generator,
                                  *(torch.cuda.default_generators[i] for i in devices)):
                    generator.manual_seed(generator.initial_seed() + 1)
            try:
                for p in parameters:
                    p.grad = None
                for piece, share in plan:
                    loss = loss_fn(piece)
                    weight = _weight(share, reduction, num_items)
                    (loss if _is_one(weight) else loss * weight).backward()
                return [p.grad for p in parameters]
            finally:
                with torch.no_grad():
                    for buffer, saved in buffers:
                        buffer.copy_(saved)

    try:
        for module in dropouts:
            module.train(False)
        with _full_float32(), torch.autocast(device_type, enabled=False), \
                no_sync() if no_sync is not None else _NOTHING:
            whole = gradient(reference)
            change = _relative_distance(gradient(pieces), whole)
            if change > GRADIENT_TOLERANCE and _relative_distance(
                    gradient(reference, reseed=True), whole) > GRADIENT_TOLERANCE:
                return None
    finally:
        for module in dropouts:
            module.train(True)
        for p, grad in zip(parameters, grads):
            p.grad = grad
    return change


def _relative_distance(gradient: list[Any], reference: list[Any]) -> float:
    """``|gradient - reference| / |reference|`` over all tensors (None: zero); each tensor's
    norm in its own dtype (float64 is not everywhere: MPS), their squares summed in Python."""
    difference, size = 0.0, 0.0
    for a, b in zip(gradient, reference):
        if a is None and b is None:
            continue
        a = torch.zeros_like(b) if a is None else a
        b = torch.zeros_like(a) if b is None else b
        difference += float(torch.linalg.vector_norm(a - b)) ** 2
        size += float(torch.linalg.vector_norm(b)) ** 2
    if size == 0.0:
        return 0.0 if difference == 0.0 else float("inf")
    return (difference / size) ** 0.5


@contextlib.contextmanager
def _full_float32() -> Iterator[None]:
    """float32 matmuls and convolutions without TF32 or bfloat16 passes, restored after."""
    precision, cudnn_tf32 = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(precision)
        torch.backends.cudnn.allow_tf32 = cudnn_tf32


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
               scheduler: Any = None, adapt: bool = False, accelerator: Any = None) -> TunedLoop:
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
        accelerator: an ``accelerate.Accelerator`` that prepared ``model`` and ``optimizer``:
            backward goes through ``accelerator.backward``, clipping through its
            ``clip_grad_norm_`` on the steps where it syncs; its mixed precision wins over the
            settings' (docs/integrations.md).

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
    loop = TunedLoop(model, optimizer, knobs=knobs, scheduler=scheduler, accelerator=accelerator)
    if observers is not hooks.NOBODY:
        observers.loop_created(loop)
    if adapt and not store.disabled():
        from tuneup.runtime import adapt as adaptation  # only scripts that ask pay its import

        adaptation.install(loop)
    return loop
