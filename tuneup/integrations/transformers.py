"""The settings file applied to a ``transformers.Trainer``: one line after it is built.

The Trainer owns its loop, its DataLoader (sampler, data order) and its accelerator, so
tuneup changes only its ``TrainingArguments`` and rebuilds what ``Trainer.__init__`` already
derived from them (the accelerator: mixed precision, the compile plugin; the train batch
size), the way ``Trainer`` itself does between hyperparameter-search trials. Values the user
set in ``TrainingArguments`` win over the settings file, as keywords passed to
``tuned_loader`` do.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sized
from typing import TYPE_CHECKING, Any

from tuneup.integrations import knobs_as, require
from tuneup.settings import Knobs, store

if TYPE_CHECKING:
    from transformers import Trainer, TrainingArguments

# TrainingArguments fields per group: a value other than the field's default is the user's
_LOADER = tuple(knobs_as.HF_LOADER_FIELDS.values())
_AMP = ("bf16", "fp16")
_COMPILE = ("torch_compile", "torch_compile_mode")
_BATCH = ("per_device_train_batch_size", "gradient_accumulation_steps")


def tuned_trainer(trainer: Trainer) -> Trainer:
    """Apply the settings ``tuneup autotune`` wrote to ``trainer`` and return it.

    Reads the settings file as ``tuned_loop`` does (``TUNEUP_SETTINGS``, else
    ``<script>.tuneup.json``); without one the trainer is returned unchanged. Applied:
    the loader knobs as ``dataloader_*`` fields (never ``persistent_workers``: see
    :data:`~tuneup.integrations.knobs_as.HF_PERSISTENT_WORKERS`), ``amp_dtype`` as ``bf16`` / ``fp16``,
    ``compile_mode`` as ``torch_compile_mode``, threads / cuDNN / matmul precision for the
    process, and ``micro_batch_size`` as a smaller per-device batch with more gradient
    accumulation (same samples per optimizer step) when it splits the batch exactly and
    the split cannot change the gradient. The Trainer's sampler and data order are kept.
    Under ``tuneup autotune`` it also reports the trainer's steps, which the trials time.

    Args:
        trainer: a built ``transformers.Trainer`` (or subclass), before ``train()``.

    Example:
        >>> trainer = Trainer(model=model, args=args, train_dataset=train_set)
        >>> trainer = tuned_trainer(trainer)
        >>> trainer.train()
    """
    require("transformers", "hf")
    from tuneup.runtime import apply, hooks

    hooks.install_from_environment()
    observer = hooks.current()
    knobs = apply.settings_knobs()
    run = None
    if observer is not hooks.NOBODY:  # unobserved, nothing but the settings is read
        run = _run_of(trainer)
        knobs = observer.trainer_knobs(run, knobs)
    trial = run is not None and not run.saves
    if knobs.changed() or trial:
        apply.apply_process_knobs(knobs)
        unapplied = _apply(trainer, knobs, NO_SAVING if trial else {})
        if run is not None:
            run.unapplied = unapplied
    if run is not None:
        _report_steps(trainer, observer, run)
    return trainer


# an autotune trial's arguments: its weights would land among the run's checkpoints, or be
# published on the Hub
NO_SAVING = {"save_strategy": "no", "push_to_hub": False, "load_best_model_at_end": False}


def _apply(trainer: Trainer, knobs: Knobs, also: dict[str, Any]) -> dict[str, str]:
    """Apply ``knobs`` to ``trainer``'s arguments, and ``also`` (fields set whatever the user
    set); returns each knob left unapplied, with why (each also said in one warning where
    the reason is not the user's own value). One new TrainingArguments, one rebuild."""
    args = trainer.args
    usable = _usable_here(knobs, trainer)
    spelled = knobs_as.as_hf(usable, args.per_device_train_batch_size,
                             args.gradient_accumulation_steps)
    changes = dict(spelled.arguments)
    problem = spelled.left_out.get("micro_batch_size")
    if usable.micro_batch_size is not None and problem is None:
        problem = _split_problem(trainer, usable.micro_batch_size)
    if problem is not None:
        store.warn(f"micro_batch_size={usable.micro_batch_size} from the settings is not "
                   f"applied: {problem}; training on whole batches")
        for name in _BATCH:
            changes.pop(name, None)
    changes = {**_without_users_values(changes, args), **also}
    tuned = _replaced(args, changes) if changes else None
    if tuned is not None:
        trainer.args = tuned
        _rebuild(trainer)
    return _unapplied(knobs, usable, trainer.args, problem)


def _unapplied(wanted: Knobs, usable: Knobs, args: TrainingArguments,
               micro_problem: str | None) -> dict[str, str]:
    """The knobs of ``wanted`` that ``args`` do not hold now, each with why."""
    missing: dict[str, str] = {}
    for knob, name in knobs_as.HF_LOADER_FIELDS.items():
        value = getattr(wanted, knob)
        if value is not None and getattr(args, name) != value and (
                name != "dataloader_prefetch_factor" or args.dataloader_num_workers):
            missing[knob] = f"{name} stays {getattr(args, name)!r}"
    if wanted.amp_dtype is not None and not getattr(args, knobs_as.HF_AMP_FIELDS[
            wanted.amp_dtype]):
        chosen = [name for name in _AMP if getattr(args, name)]
        missing["amp_dtype"] = (
            f"{wanted.amp_dtype} cannot be used here" if usable.amp_dtype is None
            else f"TrainingArguments keep {chosen[0]}=True" if chosen
            else _amp_refused(args) or "TrainingArguments refused it")
    if wanted.compile_mode is not None and args.torch_compile_mode != wanted.compile_mode:
        missing["compile_mode"] = f"torch_compile_mode stays {args.torch_compile_mode!r}"
    if wanted.micro_batch_size is not None and (
            args.per_device_train_batch_size > wanted.micro_batch_size):
        missing["micro_batch_size"] = micro_problem or "the per-device batch stays whole"
    return missing


def _run_of(trainer: Trainer) -> Any:
    """The trainer as observers see it: what it trains, and the knobs its arguments decide."""
    from tuneup.runtime.hooks import TrainerRun

    args = trainer.args
    dataset = trainer.train_dataset
    return TrainerRun(
        framework="transformers", device_type=args.device.type, model=trainer.model,
        effective_batch=args.per_device_train_batch_size,  # what a micro-batch splits
        samples_per_step=args.per_device_train_batch_size * args.gradient_accumulation_steps,
        dataset_size=len(dataset) if isinstance(dataset, Sized) else None,
        fixed_reasons=_fixed_reasons(trainer))


def _fixed_reasons(trainer: Trainer) -> dict[str, str]:
    """The knobs the user's TrainingArguments (or the trainer's set-up) decide: not tuned."""
    args = trainer.args
    defaults = {f.name: f.default for f in dataclasses.fields(args)}
    reasons = {knob: f"you set {name}={getattr(args, name)!r} in TrainingArguments"
               for knob, name in knobs_as.HF_LOADER_FIELDS.items()
               if getattr(args, name) != defaults[name]}
    chosen = [name for name in _AMP if getattr(args, name)]
    mixed = getattr(args, "mixed_precision", "no")
    if chosen or mixed != "no":
        reasons["amp_dtype"] = (f"you set {chosen[0]}=True" if chosen
                                else f"ACCELERATE_MIXED_PRECISION is {mixed}")
    if args.torch_compile:
        reasons["compile_mode"] = "you set torch_compile=True"
    if getattr(trainer, "is_deepspeed_enabled", False) or getattr(trainer, "is_fsdp_enabled",
                                                                   False):
        for knob in ("amp_dtype", "compile_mode", "micro_batch_size"):
            reasons[knob] = "DeepSpeed / FSDP configure it themselves"
    if args.device.type != "cuda":
        reasons["pin_memory"] = "batches stay on the CPU"
    refused = _amp_refused(args)
    if refused is not None and "amp_dtype" not in reasons:
        reasons["amp_dtype"] = refused
    split = _split_problem(trainer, None)
    if split is not None:
        reasons["micro_batch_size"] = split
    reasons.setdefault("persistent_workers", knobs_as.HF_PERSISTENT_WORKERS)
    stream = _stream_problem(trainer)
    if stream is not None:
        for knob in ("num_workers", "prefetch_factor", "persistent_workers"):
            reasons.setdefault(knob, stream)
    return reasons


def _report_steps(trainer: Trainer, observer: Any, run: Any) -> None:
    """Tell ``observer`` when training starts and each optimizer step with its loss (the sum
    of ``training_step``'s returns, which the Trainer scales for accumulation: the step's
    loss), through a ``TrainerCallback``; the loss stays a tensor (no device sync here)."""
    from transformers import TrainerCallback

    losses: list[Any] = []
    training_step = trainer.training_step

    def counted(*args: Any, **kwargs: Any) -> Any:
        loss = training_step(*args, **kwargs)
        losses.append(loss)
        return loss

    class _Steps(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
            losses.clear()
            run.model = kwargs.get("model") or run.model  # a model_init builds it in train()
            observer.trainer_ready(run)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            loss = sum(losses[1:], losses[0]) if losses else None
            losses.clear()
            observer.trainer_step(run, loss)

        def on_evaluate(self, *args: Any, **kwargs: Any) -> None:
            observer.trainer_paused(run)

        def on_save(self, *args: Any, **kwargs: Any) -> None:
            observer.trainer_paused(run)

    trainer.training_step = counted
    trainer.add_callback(_Steps())


def _usable_here(knobs: Knobs, trainer: Trainer) -> Knobs:
    """The knobs that can apply to this trainer on this device: AMP the device supports,
    pinning only for batches that go to CUDA, persistent workers only where they cannot
    change the data order, and under DeepSpeed or FSDP (which own precision and
    accumulation in their configs) no AMP, compile or micro-batch."""
    from tuneup.runtime import apply

    device = trainer.args.device
    if getattr(trainer, "is_deepspeed_enabled", False) or getattr(trainer, "is_fsdp_enabled",
                                                                   False):
        owned = {k: None for k in ("amp_dtype", "compile_mode", "micro_batch_size")
                 if getattr(knobs, k) is not None}
        if owned:
            store.warn(f"{', '.join(owned)} from the settings not applied: DeepSpeed / FSDP "
                       f"configure precision, compilation and accumulation themselves")
        knobs = knobs.replace(**owned)
    if apply.resolve_amp(knobs.amp_dtype, device, strict=False) is None:
        knobs = knobs.replace(amp_dtype=None)
    if device.type != "cuda":
        knobs = knobs.replace(pin_memory=None)
    if knobs.persistent_workers:
        store.warn(f"persistent_workers=True from the settings is not applied: "
                   f"{knobs_as.HF_PERSISTENT_WORKERS}")
    knobs = knobs.replace(persistent_workers=None)
    stream = _stream_problem(trainer)
    if stream is not None and knobs.num_workers:
        store.warn(f"num_workers={knobs.num_workers} from the settings is not applied: "
                   f"{stream}")
    if stream is not None:
        knobs = knobs.replace(num_workers=None, prefetch_factor=None)
    return knobs


def _stream_problem(trainer: Trainer) -> str | None:
    """Why workers cannot be given to this trainer's training loader, or None: over an
    ``IterableDataset`` each worker would yield the whole stream unless it splits it."""
    from torch.utils.data import IterableDataset

    if isinstance(trainer.train_dataset, IterableDataset):
        return ("the training set is an IterableDataset: each worker would yield the whole "
                "stream unless it splits it (set dataloader_num_workers yourself if it does)")
    return None


def _amp_refused(args: TrainingArguments) -> str | None:
    """Why ``TrainingArguments`` would refuse ``bf16=True`` here, or None (transformers' own
    check: on a machine without a bf16 GPU it wants ``use_cpu=True``)."""
    if args.device.type == "cpu" and not args.use_cpu and not args.bf16:
        return ("transformers accepts bf16=True on the CPU only with use_cpu=True in "
                "TrainingArguments")
    return None


def _split_problem(trainer: Trainer, micro: int | None) -> str | None:
    """Why training ``micro`` samples at a time with accumulation would not give each
    optimizer step the whole batch's gradient, or None when it does (``micro`` None: the
    reasons that hold for every micro-batch)."""
    from torch.nn.modules.batchnorm import _BatchNorm

    for name, module in trainer.model.named_modules():
        if isinstance(module, _BatchNorm):
            return (f"{type(module).__name__} '{name}' normalises with the statistics of the "
                    f"batch it is given, which a piece would change")
    if trainer.args.auto_find_batch_size:
        return "auto_find_batch_size changes the batch itself"
    dataset = trainer.train_dataset
    if micro is not None and trainer.args.dataloader_drop_last and isinstance(dataset, Sized):
        # the loader drops what is left over after the last whole piece, not after the last
        # whole batch: left-over pieces would train as an extra, smaller optimizer step
        batch = trainer.args.per_device_train_batch_size
        left = len(dataset) % batch
        if left >= micro:
            return (f"with dataloader_drop_last the {left} samples after the last whole batch "
                    f"of {batch} would train in pieces of {micro} (an extra optimizer step "
                    f"each epoch) instead of being dropped")
    if _loss_scaled_by_model(trainer):
        if _loss_divides_by_items(trainer):
            return None  # a token sum over the accumulated batch's token count: exact
        return ("the Trainer leaves scaling the loss for accumulation to this model (its "
                "forward takes loss keywords) and tuneup cannot tell that its loss divides by "
                "the accumulated batch's item count")
    # the Trainer divides each piece's loss by the number of pieces: exact for equal pieces
    if getattr(trainer.args, "train_sampling_strategy", None) == "batch_rebalance":
        return ("train_sampling_strategy='batch_rebalance' cuts each batch into pieces of "
                "different sizes, which the Trainer weighs equally")
    if micro is not None and not trainer.args.dataloader_drop_last and isinstance(dataset, Sized):
        last = len(dataset) % (micro * trainer.args.world_size)
        if last:
            return (f"the last batch would split into unequal pieces ({last} samples left over), "
                    f"which the Trainer weighs equally")
    return None


def _loss_scaled_by_model(trainer: Trainer) -> bool:
    """The Trainer's own rule for "the loss is already scaled for accumulation"."""
    scaled = getattr(trainer, "loss_is_scaled_for_ga", None)
    if scaled is not None:
        return scaled
    return (getattr(trainer, "model_accepts_loss_kwargs", False)
            or getattr(trainer, "compute_loss_func", None) is not None)


def _loss_divides_by_items(trainer: Trainer) -> bool:
    """True when the loss the Trainer backpropagates is a token sum divided by
    ``num_items_in_batch``: the Trainer's own ``compute_loss`` with its label smoother (which
    divides by it), or a model whose forward calls a transformers loss that does. Every
    ``PreTrainedModel`` has a ``loss_function`` (``ForCausalLMLoss`` by default), so the
    forward must be seen to call it: many (T5, BART, BERT's masked LM) take ``**kwargs`` but
    compute their own mean, which the Trainer then leaves unscaled for accumulation."""
    try:
        from transformers import Trainer as BaseTrainer
        from transformers.loss.loss_utils import ForCausalLMLoss, ForMaskedLMLoss
    except ImportError:  # transformers before 4.46 counts no items
        return False
    if getattr(trainer, "compute_loss_func", None) is not None:
        return False
    if getattr(type(trainer), "compute_loss", None) is not BaseTrainer.compute_loss:
        return False  # a subclass's own loss: tuneup cannot see how it is weighed
    if not getattr(trainer, "model_accepts_loss_kwargs", False):
        return False  # the Trainer passes num_items_in_batch to no loss
    smoother = getattr(trainer, "label_smoother", None)
    if smoother is not None:  # it divides by num_items_in_batch only where it takes it
        return "num_items_in_batch" in inspect.signature(type(smoother).__call__).parameters
    model = trainer.accelerator.unwrap_model(trainer.model)
    base = getattr(model, "get_base_model", None)  # a PEFT model: the transformers model inside
    model = base() if callable(base) else model
    loss = getattr(model, "loss_function", None)
    return loss in (ForCausalLMLoss, ForMaskedLMLoss) and _forward_calls_loss_function(model)


def _forward_calls_loss_function(model: Any) -> bool:
    """Whether ``model``'s class computes its loss with ``self.loss_function`` (read from
    the forward's source; False when the source cannot be read)."""
    try:
        source = inspect.getsource(inspect.unwrap(type(model).forward))
    except (OSError, TypeError, AttributeError):
        return False
    return "self.loss_function(" in source


def _without_users_values(changes: dict[str, Any], args: TrainingArguments) -> dict[str, Any]:
    """``changes`` minus the fields the user set, with one warning naming what was kept."""
    defaults = {f.name: f.default for f in dataclasses.fields(args)}
    set_by_user = {name for name in _LOADER
                   if name in changes and getattr(args, name) != defaults[name]}
    users = {name: getattr(args, name) for name in set_by_user
             if getattr(args, name) != changes[name]}  # the same value needs no word
    skip = set(set_by_user)
    if any(name in changes for name in _AMP):
        # a precision chosen by a flag, or by ACCELERATE_MIXED_PRECISION (whose values
        # "bf16" / "fp16" are the flags' names)
        chosen = [name for name in _AMP if getattr(args, name)]
        mixed = getattr(args, "mixed_precision", "no")
        if chosen or mixed != "no":
            skip |= set(_AMP)
            if (chosen or [mixed]) != [name for name in _AMP if name in changes]:
                users.update(dict.fromkeys(chosen, True) or {"mixed_precision": mixed})
    if "torch_compile" in changes and args.torch_compile:
        skip |= set(_COMPILE)
        if args.torch_compile_mode != changes["torch_compile_mode"]:
            users.update(torch_compile=True, torch_compile_mode=args.torch_compile_mode)
    if users:
        store.warn("kept your TrainingArguments " + ", ".join(
            f"{name}={value!r}" for name, value in users.items())
            + " over the settings file (values you set are never overridden)")
    kept = {name: value for name, value in changes.items() if name not in skip}
    workers = kept.get("dataloader_num_workers", args.dataloader_num_workers)
    if not workers:  # prefetch and persistent workers mean nothing without workers
        kept.pop("dataloader_prefetch_factor", None)
        kept.pop("dataloader_persistent_workers", None)
    return kept


def _replaced(args: TrainingArguments, changes: dict[str, Any]) -> TrainingArguments | None:
    """A copy of ``args`` with ``changes``, validated and derived by TrainingArguments itself
    (``mixed_precision``, the compile backend). AMP it refuses is dropped with a warning."""
    try:
        return dataclasses.replace(args, **changes)
    except ValueError as exc:
        amp = [name for name in _AMP if name in changes]
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if not amp:
            store.warn(f"settings not applied: TrainingArguments refused them ({reason})")
            return None
        store.warn(f"amp_dtype ignored: TrainingArguments refused {amp[0]}=True ({reason}); "
                   f"training in float32")
        return _replaced(args, {k: v for k, v in changes.items() if k not in amp})


def _rebuild(trainer: Trainer) -> None:
    """Rebuild what ``Trainer.__init__`` derived from its arguments, as the Trainer does for
    a hyperparameter-search trial: the train batch size, and the accelerator, which holds
    mixed precision and the compile plugin. Needed for every new TrainingArguments, even
    one that changes only loader fields: building one resets accelerate's process-wide
    state (``TrainingArguments._setup_devices``), which the old accelerator reads."""
    trainer._train_batch_size = trainer.args.train_batch_size
    trainer.create_accelerator_and_postprocess()
