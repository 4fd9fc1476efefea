"""The settings file applied to a ``lightning.Trainer``: ``L.Trainer(**tuned_trainer_kwargs(...))``.

Lightning builds the training DataLoader inside ``fit`` from the user's own hook, so the
loader knobs are applied by a callback, the way Lightning's own tuner works: as Lightning
requests the training loaders, before it iterates them, the callback rebuilds each plain
``DataLoader`` with the same dataset, sampler and batch sampler objects, batch size,
``collate_fn`` and generator, changing only workers, pinning and prefetch. Precision is a
Trainer argument; ``compile_mode`` compiles the module's parts at ``fit``. Not applied:
``micro_batch_size`` (see :func:`tuned_trainer_kwargs`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

from tuneup.integrations import knobs_as, require
from tuneup.runtime import apply
from tuneup.runtime.loader import loading_draws_from_torch
from tuneup.settings import Knobs, store
from tuneup.settings.schema import knob_facts

pl = require("lightning.pytorch", "lightning")

# PyTorch's DataLoader defaults: another value is the user's (prefetch_factor: 2 with
# workers, None without)
# a loader attribute still at PyTorch's default is the user's to leave, not a choice; the
# defaults are the knobs' declared facts (prefetch_factor is None without workers, too)
_PYTORCH_DEFAULTS = {name: (knob_facts(name).pytorch_default,) + (
    (None,) if name == "prefetch_factor" else ()) for name in Knobs.LOADER}
# the DataLoader attributes a rebuild carries over unchanged (those this torch has)
_CARRIED = ("collate_fn", "worker_init_fn", "generator", "multiprocessing_context", "timeout",
            "pin_memory_device", "in_order")


def tuned_trainer_kwargs(**kwargs: Any) -> dict[str, Any]:
    """The ``lightning.Trainer`` keyword arguments ``kwargs`` with the settings applied.

    Adds ``precision`` ("bf16-mixed" / "16-mixed") from ``amp_dtype`` unless you pass one,
    and a :class:`TunedLoaders` callback after your own ``callbacks`` that sets threads,
    cuDNN and matmul precision at ``fit``, compiles the LightningModule's submodules with
    ``compile_mode``, and sets the loader knobs on the training loaders. The data order,
    batch size and number of steps are those of your loaders. Without a settings file
    ``kwargs`` come back unchanged. Under ``tuneup autotune`` the callback also reports the
    trainer's steps, which the trials time.

    Not applied, with one warning: ``micro_batch_size`` (Lightning accumulates whole loader
    batches, so a micro-batch would need a smaller loader batch, and every argument that
    counts batches — ``val_check_interval``, ``log_every_n_steps``, ``limit_*`` — would
    count other batches).

    Example:
        >>> trainer = L.Trainer(**tuned_trainer_kwargs(max_epochs=3, accelerator="auto"))
    """
    from tuneup.runtime import hooks

    hooks.install_from_environment()
    observer = hooks.current()
    observed = observer is not hooks.NOBODY
    knobs = apply.settings_knobs()
    if not knobs.changed() and not observed:
        return kwargs
    # unobserved, what the trainer is trained on is not read (it may touch CUDA)
    run = hooks.TrainerRun("lightning")
    if observed:
        run = hooks.TrainerRun("lightning", device_type=_device_type(kwargs),
                               fixed_reasons=_fixed_reasons(kwargs))
        knobs = observer.trainer_knobs(run, knobs)
    tuned = dict(kwargs)
    spelled = knobs_as.as_lightning(knobs)
    if "precision" in spelled.arguments:
        problem = _amp_problem(knobs.amp_dtype, _device_type(kwargs))
        yours = _users_precision(kwargs)
        if yours is not None:
            run.unapplied["amp_dtype"] = f"you set {yours}"
            store.warn(f"kept your {yours} over the settings file's "
                       f"amp_dtype {knobs.amp_dtype} (values you set are never overridden)")
        elif problem is None:
            tuned["precision"] = spelled.arguments["precision"]
        else:
            run.unapplied["amp_dtype"] = problem
            store.warn(f"amp_dtype {knobs.amp_dtype} ignored: {problem}; training in float32")
    if "micro_batch_size" in spelled.left_out:
        run.unapplied["micro_batch_size"] = spelled.left_out["micro_batch_size"]
        store.warn(f"micro_batch_size={knobs.micro_batch_size} from the settings is not applied: "
                   f"{spelled.left_out['micro_batch_size']}; training on whole batches")
    mine = kwargs.get("callbacks") or []
    if isinstance(mine, pl.Callback):  # Lightning takes one callback as well as a list
        mine = [mine]
    tuned["callbacks"] = [*mine, TunedLoaders(knobs, run if observed else None,
                                              observer if observed else None)]
    return tuned


def _fixed_reasons(kwargs: dict[str, Any]) -> dict[str, str]:
    """The knobs the user's Trainer arguments decide, or that Lightning cannot take."""
    reasons = {"micro_batch_size": knobs_as.as_lightning(Knobs(micro_batch_size=1))
               .left_out["micro_batch_size"]}
    yours = _users_precision(kwargs)
    if yours is not None:
        reasons["amp_dtype"] = f"you set {yours}"
    if _device_type(kwargs) != "cuda":
        reasons["pin_memory"] = "batches stay on the CPU"
    return reasons


def _users_precision(kwargs: dict[str, Any]) -> str | None:
    """The Trainer argument that chooses the precision, spelled for a message, or None when
    Lightning's default decides (``precision`` absent or None, no precision plugin). A
    precision plugin in ``plugins`` or on a ``strategy`` instance decides it too: Lightning
    refuses ``precision`` beside the first and ignores it beside the second."""
    if kwargs.get("precision") is not None:
        return f"precision={kwargs['precision']!r}"
    plugins = kwargs.get("plugins")
    for plugin in plugins if isinstance(plugins, (list, tuple)) else [plugins]:
        if isinstance(plugin, pl.plugins.Precision):
            return f"precision plugin {type(plugin).__name__} (plugins=)"
    plugin = getattr(kwargs.get("strategy"), "_precision_plugin", None)
    if isinstance(plugin, pl.plugins.Precision):
        return f"precision plugin {type(plugin).__name__} (on the strategy)"
    return None


def _amp_problem(dtype: str | None, device_type: str) -> str | None:
    bf16 = device_type != "cuda" or torch.cuda.is_bf16_supported()
    return apply.amp_problem(dtype, device_type, bf16) if dtype else None


def _device_type(kwargs: dict[str, Any]) -> str:
    """The device type the Trainer will train on, as far as its ``accelerator`` says."""
    accelerator = kwargs.get("accelerator", "auto")
    if not isinstance(accelerator, str):  # an Accelerator instance: CUDAAccelerator -> "cuda"
        accelerator = type(accelerator).__name__.lower().removesuffix("accelerator")
    if accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available():
        return "cuda"
    return "cpu" if accelerator in ("auto", "cpu") else accelerator


class TunedLoaders(pl.Callback):
    """Applies the process-wide knobs when ``fit`` starts, and the loader knobs to the
    training loaders as Lightning requests them from your hook (at the first epoch, and
    again at each ``reload_dataloaders_every_n_epochs``), before it iterates them.

    A loader is rebuilt only when it is exactly ``torch.utils.data.DataLoader`` over a
    map-style dataset (a subclass may hold state a rebuild would lose; an iterable dataset
    would be duplicated by workers that do not split it); a value you gave the DataLoader
    other than PyTorch's default is kept; persistent workers only where they change no
    random draw (see :func:`_persistent_problem`).
    """

    def __init__(self, knobs: Knobs, run: Any = None, observer: Any = None) -> None:
        self.knobs = knobs
        self.run = run  # the trainer as an observer sees it (hooks.TrainerRun)
        self.observer = observer  # told of training's start and each step (autotune)
        self.step_losses: list[Any] = []
        self.global_step = 0
        self.accumulate = 1  # the trainer's accumulate_grad_batches, read at setup

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        apply.apply_process_knobs(self.knobs)
        self.accumulate = trainer.accumulate_grad_batches
        if self.run is not None and getattr(pl_module, "_compiler_ctx", None) is not None:
            # decided by the script: not tuned (a compile trial would only fail)
            self.run.fixed_reasons.setdefault("compile_mode", COMPILED_BY_YOU)
        if self.knobs.compile_mode is not None:
            _compile_parts(pl_module, self.knobs.compile_mode, self.run)
        if self.observer is not None:
            self.run.model = pl_module
            self.observer.trainer_ready(self.run)  # before Lightning draws its first order
        if not self.knobs.loader_kwargs() and self.observer is None:
            return
        source = getattr(trainer.fit_loop, "_data_source", None)
        if not (callable(getattr(source, "dataloader", None)) and hasattr(source, "__dict__")):
            store.warn("loader knobs not applied: this Lightning version requests its training "
                       "loaders in a way tuneup does not know")
            self._loader_knobs_fixed("this Lightning version requests its loaders in a way "
                                     "tuneup does not know")
            return
        vars(source).pop("dataloader", None)  # a fit that failed before teardown left one
        device = trainer.strategy.root_device
        reloads = trainer.reload_dataloaders_every_n_epochs > 0
        requested = source.dataloader

        def tuned() -> Any:  # called inside Lightning's _request_dataloader, like your hook
            return self._tuned_all(requested(), device, reloads)

        source.dataloader = tuned  # this fit's source only; teardown puts the method back

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.global_step = trainer.global_step  # a resumed fit starts past 0

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        """An optimizer step is done when ``global_step`` moved (after every
        ``accumulate_grad_batches`` batches): its loss is the sum of its batches' (each
        already divided by the accumulation, as Lightning reports them)."""
        if self.observer is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            self.step_losses.append(loss.detach())
        if trainer.global_step == self.global_step:
            return
        self.global_step = trainer.global_step
        losses, self.step_losses = self.step_losses, []
        self.observer.trainer_step(self.run, sum(losses[1:], losses[0]) if losses else None)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.observer is not None:  # a validation pass inside the epoch: not a step's time
            self.observer.trainer_paused(self.run)

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        if self.observer is not None:
            self.observer.trainer_paused(self.run)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            vars(trainer.fit_loop._data_source).pop("dataloader", None)

    def _tuned_all(self, loaders: Any, device: torch.device, reloads: bool) -> Any:
        """What the training-loader hook returned, each plain DataLoader in it rebuilt; a
        collection comes back as the CombinedLoader Lightning would wrap it in."""
        from lightning.pytorch.utilities import CombinedLoader

        combined = (loaders if isinstance(loaders, CombinedLoader)
                    else CombinedLoader(loaders, "max_size_cycle"))
        flattened = combined.flattened
        # why workers would change each loader's order (None: they would not); checked only
        # where workers could be added (it loads a sample)
        order = ([_order_problem(flattened, i, combined._mode != "sequential")
                  for i in range(len(flattened))]
                 if self.knobs.num_workers or self.run is not None else [None] * len(flattened))
        if self.run is not None and flattened:
            self._describe(flattened[0], reloads)
            problem = next((why for why in order if why is not None), None)
            if problem is not None:
                self.run.fixed_reasons.setdefault("num_workers", problem)
        combined.flattened = [self._rebuilt(loader, device, reloads, why)
                              for loader, why in zip(flattened, order)]
        return combined

    def _describe(self, loader: Any, reloads: bool) -> None:
        """What observers learn only from the loader: batch, dataset size, and the knobs the
        user's loader decides (values set on it; what its shuffling rules out)."""
        run = self.run
        batch = getattr(loader, "batch_size", None)
        run.effective_batch = batch
        run.samples_per_step = batch * self.accumulate if batch else None
        try:
            run.dataset_size = len(loader.dataset)
        except Exception:  # noqa: BLE001 - an iterable without a dataset, or without a length
            run.dataset_size = None
        if type(loader) is not DataLoader:
            self._loader_knobs_fixed(f"the training loader is a {type(loader).__name__}, which "
                                     "tuneup does not rebuild")
            return
        if isinstance(getattr(loader, "dataset", None), IterableDataset):
            self._loader_knobs_fixed(f"the training loader reads an IterableDataset "
                                     f"({type(loader.dataset).__name__}): workers would each "
                                     "yield the whole stream unless it splits it")
            return
        for knob, defaults in _PYTORCH_DEFAULTS.items():
            value = getattr(loader, knob, None)
            if value not in defaults and not (knob == "prefetch_factor" and not loader.num_workers):
                run.fixed_reasons[knob] = f"you set {knob}={value!r} on the DataLoader"
        persistent = _persistent_problem(loader)
        if persistent is not None:
            run.fixed_reasons.setdefault("persistent_workers", persistent)
        if _shuffles(loader):
            if reloads:
                run.fixed_reasons.setdefault("num_workers", "a shuffling loader reloaded each "
                                             "epoch: workers would change the order")

    def _loader_knobs_fixed(self, why: str) -> None:
        """Under autotune: the loader knobs cannot apply here (not tuned; asked, the trial
        fails rather than measure the defaults)."""
        if self.run is None:
            return
        for knob in Knobs.LOADER:
            self.run.fixed_reasons.setdefault(knob, why)
            if getattr(self.knobs, knob) is not None:
                self.run.unapplied.setdefault(knob, why)

    def _rebuilt(self, loader: Any, device: torch.device, reloads: bool,
                 order_problem: str | None = None) -> Any:
        """``loader`` with the loader knobs, or ``loader`` itself when it cannot be rebuilt
        without changing what it yields (``order_problem``: why workers would change its
        order, see :func:`_order_problem`)."""
        if type(loader) is not DataLoader or isinstance(loader.dataset, IterableDataset):
            if not self.knobs.loader_kwargs():
                return loader
            dataset = type(getattr(loader, "dataset", None)).__name__
            store.warn(f"loader knobs not applied to a training loader of type "
                       f"{type(loader).__name__} over {dataset}: tuneup rebuilds only a plain "
                       f"DataLoader over a map-style dataset")
            return loader
        wanted = self.knobs.loader_kwargs()
        tuned = {k: v for k, v in wanted.items() if getattr(loader, k) in _PYTORCH_DEFAULTS[k]}
        users = {k: getattr(loader, k) for k, v in wanted.items()
                 if k not in tuned and getattr(loader, k) != v}
        if users:
            store.warn("kept your DataLoader " + ", ".join(f"{k}={v!r}" for k, v in users.items())
                       + " over the settings file (values you set are never overridden)")
        if device.type != "cuda":
            tuned.pop("pin_memory", None)
        shuffles = _shuffles(loader)
        if shuffles and reloads and tuned.get("num_workers"):
            # Lightning makes two iterators of a reloaded loader past the first epoch and
            # drops the first; with workers that one already drew the shuffle order
            store.warn(f"num_workers={tuned['num_workers']} from the settings is not applied to "
                       f"a shuffling loader under reload_dataloaders_every_n_epochs: it would "
                       f"change the data order")
            del tuned["num_workers"]
        if tuned.get("num_workers") and order_problem is not None:
            store.warn(f"num_workers={tuned['num_workers']} from the settings is not applied: "
                       f"{order_problem}; set num_workers on your DataLoader yourself if "
                       "another order is fine")
            del tuned["num_workers"]
        if tuned.get("persistent_workers") and _persistent_problem(loader) is not None:
            del tuned["persistent_workers"]
        workers = tuned.get("num_workers", loader.num_workers)
        if not workers:
            tuned.pop("prefetch_factor", None)
            tuned.pop("persistent_workers", None)
        if self.run is not None:
            self.run.unapplied.update({k: f"the DataLoader keeps {k}={getattr(loader, k)!r}"
                                       for k, v in wanted.items()
                                       if k not in tuned and getattr(loader, k) != v})
        if not tuned:
            return loader
        kwargs = {k: getattr(loader, k) for k in (*_PYTORCH_DEFAULTS, *_CARRIED)
                  if hasattr(loader, k)}
        if not loader.num_workers:
            kwargs["prefetch_factor"] = None  # PyTorch's value without workers
        return DataLoader(loader.dataset, **_batching(loader), **{**kwargs, **tuned})


def _persistent_problem(loader: DataLoader) -> str | None:
    """Why persistent workers would change a random draw, or None. Each epoch's new iterator
    draws its workers' base seed from the loader's ``generator``, else torch's global one;
    persistent workers skip that draw. It shifts dropout's draws after it (the global
    generator), or the shuffle order that shares the loader's generator."""
    if _shuffles(loader):
        return "the loader shuffles: they would change the order from the second epoch"
    if loader.generator is None:
        return ("each epoch's new loader iterator draws from torch's global generator: they "
                "would skip that draw and change dropout's from the second epoch (give the "
                "DataLoader a generator= to allow them)")
    return None


def _order_problem(loaders: list[Any], index: int, together: bool) -> str | None:
    """Why workers would change the order of ``loaders[index]``, or None.

    - A ``RandomSampler`` with a generator of its own draws once more from it when it is run
      to its end; Lightning ends an epoch at the loader's length without running it to its
      end, workers' prefetching does: the next epoch's shuffle would change.
    - A shuffle seeded from torch's global generator draws its seed when the iterator first
      yields (without workers) or when it is made (workers prefetch at once); what else
      draws from that generator in between moves the seed: loading a sample in the main
      process (with ``num_workers=0`` only), and, where Lightning makes the iterators of all
      its training loaders before the first batch (``together``: every mode but
      ``"sequential"``), a later loader's iterator drawing its workers' seed or an earlier
      loader's shuffle drawn at its first batch.
    """
    loader = loaders[index]
    if type(loader) is not DataLoader or not _shuffles(loader):
        return None
    sampler = loader.sampler
    if isinstance(sampler, RandomSampler) and sampler.generator is not None:
        return ("the loader shuffles with a generator of its own, and workers run its sampler "
                "to the end of the epoch, where RandomSampler draws from that generator once "
                "more (Lightning stops at the loader's length): the order would change from "
                "the second epoch")
    if not _seeded_globally(loader):
        return None
    if together:
        others = [other for i, other in enumerate(loaders) if i != index and isinstance(
            other, DataLoader) and (_seeded_globally(other) or (
                i > index and other.generator is None))]
        if others:
            return ("several training loaders draw from torch's global generator and this one "
                    "shuffles from it: workers would move its shuffle's draw and change the "
                    "order (a loader that does not shuffle draws from its own generator= "
                    "instead)")
    name = type(loader.dataset).__name__
    try:
        draws = _loading_draws(loader)
    except Exception as exc:  # noqa: BLE001 - the user's dataset; training must run
        return (f"loading sample 0 of {name} to check whether it draws random numbers failed "
                f"({apply.one_line(exc)}), and the shuffle is seeded from torch's global "
                "generator")
    if draws:
        return (f"loading a sample of {name} draws from torch's global random generator, "
                "which with num_workers=0 also seeds the next epoch's shuffle: workers would "
                "change the order from the second epoch")
    return None


def _seeded_globally(loader: DataLoader) -> bool:
    """The loader's order is drawn from torch's global generator at each pass: a shuffle
    without ``generator=`` (a sampler of one's own without a ``generator`` counts as one)."""
    if not _shuffles(loader):
        return False
    batches = loader.batch_sampler
    sampler = loader.sampler if type(batches) in (BatchSampler, type(None)) else batches
    return getattr(sampler, "generator", None) is None


def _loading_draws(loader: DataLoader) -> bool:
    """Whether loading and collating sample 0 in the main process advances torch's global
    CPU generator (the states are put back)."""
    automatic = loader.batch_size is not None or loader.batch_sampler is not None
    return loading_draws_from_torch(loader.dataset, loader.collate_fn, unbatched=not automatic)


def _shuffles(loader: DataLoader) -> bool:
    """The loader's order is drawn at random (a batch sampler of one's own may draw its
    batches at random: counted as shuffling)."""
    return type(loader.batch_sampler) not in (BatchSampler, type(None)) or not isinstance(
        loader.sampler, (SequentialSampler, DistributedSampler))


COMPILED_BY_YOU = "you compiled the module yourself"


def _compile_parts(module: pl.LightningModule, mode: str, run: Any) -> None:
    """Compile ``module``'s direct submodules in place (as ``nn.Module.compile`` does, see
    :func:`_through`): Lightning calls ``training_step``, not the module, so compiling the
    LightningModule itself would reach nothing its step calls; the submodules are what it
    runs. A module you compiled yourself is left as it is, and so is a part you compiled."""
    problem = (COMPILED_BY_YOU
               if getattr(module, "_compiler_ctx", None) is not None
               else None if hasattr(torch.nn.Module, "compile")
               else f"torch {torch.__version__} has no nn.Module.compile (2.2 and later)")
    if problem is not None:
        store.warn(f"compile_mode={mode!r} from the settings not applied: {problem}")
        if run is not None:
            run.unapplied["compile_mode"] = problem
        return
    from torch._dynamo.eval_frame import OptimizedModule

    for part in module.children():
        if part._compiled_call_impl is None and not isinstance(part, OptimizedModule):
            compiled = torch.compile(_through(part), mode=mode)
            # under autotune a failure fails the trial (strict, as tuned_loop's compile)
            part._compiled_call_impl = (compiled if run is not None
                                        else _eager_on_failure(part, compiled, mode))


def _eager_on_failure(part: torch.nn.Module, compiled: Any, mode: str) -> Any:
    """``compiled`` behind a guard for its first call, where ``torch.compile`` fails if it
    fails at all: the part then runs eagerly from there on, with one warning, and training
    goes on (as ``tuned_loop``'s compile does)."""
    def first_call(*args: Any, **kwargs: Any) -> Any:
        try:
            output = compiled(*args, **kwargs)
        except Exception as exc:
            if apply.is_out_of_memory(exc):
                raise
            store.warn(f"torch.compile(mode={mode!r}) of {type(part).__name__} failed at the "
                       f"first call ({apply.one_line(exc)}); running it eager (remove "
                       "compile_mode from the settings file to skip the attempt)")
            part._compiled_call_impl = None
            return part._call_impl(*args, **kwargs)
        part._compiled_call_impl = compiled
        return output

    return first_call


def _through(part: torch.nn.Module) -> Any:
    """A call of ``part`` in a frame of tuneup's, for ``torch.compile``. Dynamo skips the
    frames of torch's own files, so ``part.compile()`` of a ``torch.nn`` module (an
    ``nn.Sequential``, an ``nn.Linear``) compiles nothing; from this frame Dynamo inlines
    the call, hooks and forward included, as it does for ``torch.compile(part)``."""
    call = part._call_impl

    def compiled_call(*args: Any, **kwargs: Any) -> Any:
        return call(*args, **kwargs)

    return compiled_call


def _batching(loader: DataLoader) -> dict[str, Any]:
    """The keywords that make a DataLoader yield ``loader``'s batches in ``loader``'s order:
    the very same sampler (and batch sampler) objects."""
    if loader.batch_size is None and loader.batch_sampler is None:  # no automatic batching
        return {"sampler": loader.sampler, "batch_size": None}
    if type(loader.batch_sampler) is BatchSampler:  # keeps batch_size / drop_last readable
        return {"sampler": loader.batch_sampler.sampler, "batch_size": loader.batch_size,
                "drop_last": loader.drop_last}
    return {"batch_sampler": loader.batch_sampler}

