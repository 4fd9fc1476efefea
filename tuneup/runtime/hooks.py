"""The hooks the runtime calls, for whoever observes a training run.

``tuned_loop`` and ``tuned_loader`` declare these calls and make them; they import no observer.
Observers — the autotune child, the watcher's feed, online adaptation — subclass
:class:`Observer`, override what they need, and are installed by whoever starts the script:
in-process with :func:`install`, or from outside through ``TUNEUP_OBSERVERS`` (comma-separated
``module:function`` entries, each function returning an :class:`Observer`), read when the
first loop or loader is created, or a trainer integration runs. This is Lightning's shape: the trainer calls callbacks, the
tuner installs one, and the trainer never imports the tuner.

With no observer installed :func:`current` is :data:`NOBODY`, and the runtime skips every call:
an unobserved run pays one identity check per hook site.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ContextManager

if TYPE_CHECKING:
    import torch

    from tuneup.runtime.loader import TunedLoader
    from tuneup.runtime.loop import TunedLoop
    from tuneup.settings import Knobs

ENV_OBSERVERS = "TUNEUP_OBSERVERS"


@dataclass
class TrainerRun:
    """A trainer that owns its loop (transformers, Lightning), as its integration shows it to
    observers: what it trains and which knobs the user's own arguments decide. The
    integration fills in what it knows when it knows it (a Lightning loader's batch only
    when ``fit`` requests it)."""

    framework: str  # "transformers" | "lightning"
    device_type: str = "cpu"
    model: torch.nn.Module | None = None
    effective_batch: int | None = None  # the batch one forward/backward takes, per process
    samples_per_step: int | None = None  # per optimizer step: the batch x its accumulation
    dataset_size: int | None = None
    fixed_reasons: dict[str, str] = field(default_factory=dict)  # knob -> why it is not tuned
    unapplied: dict[str, str] = field(default_factory=dict)  # knob asked for -> why it is not
    # False once an observer says the run is a timing trial: a trial's checkpoints would pass
    # for the run's, and a push to a hub would publish them (the integration turns them off)
    saves: bool = True


class Observer:
    """One observer of the runtime. Every hook is a no-op here; override what you need."""

    def loop_created(self, loop: TunedLoop) -> None:
        """A ``tuned_loop`` was made (after its knobs were applied)."""

    def loader_created(self, loader: TunedLoader) -> None:
        """A ``tuned_loader`` was made."""

    def initial_knobs(self, knobs: Knobs) -> Knobs:
        """The knobs a new loop or loader starts with; ``knobs`` come from the settings file."""
        return knobs

    def batches(self, loader: TunedLoader, source: Iterator[Any]) -> Iterator[Any]:
        """The batches ``for batch in loader`` gets; ``source`` is the loader's own stream."""
        return source

    def guard(self, loop: TunedLoop) -> ContextManager[Any]:
        """Wraps each piece of the user's step the loop runs (forward, backward, step)."""
        return contextlib.nullcontext()

    def loss(self, loop: TunedLoop, loss: torch.Tensor, weight: float | torch.Tensor) -> None:
        """A loss about to be backpropagated as ``loss * weight`` (weight 1 when unsplit)."""

    def optimizer_stepped(self, loop: TunedLoop) -> None:
        """The optimizer stepped: one of the user's batches is done."""

    def micro_batching(self, loop: TunedLoop, applied: int | None, blocked: str | None) -> None:
        """The micro-batch size now applied (None: whole batches), and why not when blocked."""

    def trainer_knobs(self, run: TrainerRun, knobs: Knobs) -> Knobs:
        """The knobs a trainer is built with; ``knobs`` come from the settings file."""
        return knobs

    def trainer_ready(self, run: TrainerRun) -> None:
        """Training starts: the trainer's knobs are applied (``run.unapplied`` names each knob
        :meth:`trainer_knobs` gave that could not apply); its loaders may come later."""

    def trainer_step(self, run: TrainerRun, loss: Any) -> None:
        """The trainer made an optimizer step; ``loss`` is its loss (a tensor, not synced) or
        None when the step did not report one."""

    def trainer_paused(self, run: TrainerRun) -> None:
        """The trainer did something that is not training (evaluation, a checkpoint): the
        time until its next step is not a step's."""


class _Observers(Observer):
    """Several observers seen as one: calls fan out in install order; streams chain."""

    def __init__(self, members: tuple[Observer, ...]) -> None:
        self.members = members

    def loop_created(self, loop: TunedLoop) -> None:
        for member in self.members:
            member.loop_created(loop)

    def loader_created(self, loader: TunedLoader) -> None:
        for member in self.members:
            member.loader_created(loader)

    def initial_knobs(self, knobs: Knobs) -> Knobs:
        for member in self.members:
            knobs = member.initial_knobs(knobs)
        return knobs

    def batches(self, loader: TunedLoader, source: Iterator[Any]) -> Iterator[Any]:
        for member in self.members:
            source = member.batches(loader, source)
        return source

    @contextlib.contextmanager
    def guard(self, loop: TunedLoop) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for member in self.members:
                stack.enter_context(member.guard(loop))
            yield

    def loss(self, loop: TunedLoop, loss: torch.Tensor, weight: float | torch.Tensor) -> None:
        for member in self.members:
            member.loss(loop, loss, weight)

    def optimizer_stepped(self, loop: TunedLoop) -> None:
        for member in self.members:
            member.optimizer_stepped(loop)

    def micro_batching(self, loop: TunedLoop, applied: int | None, blocked: str | None) -> None:
        for member in self.members:
            member.micro_batching(loop, applied, blocked)

    def trainer_knobs(self, run: TrainerRun, knobs: Knobs) -> Knobs:
        for member in self.members:
            knobs = member.trainer_knobs(run, knobs)
        return knobs

    def trainer_ready(self, run: TrainerRun) -> None:
        for member in self.members:
            member.trainer_ready(run)

    def trainer_step(self, run: TrainerRun, loss: Any) -> None:
        for member in self.members:
            member.trainer_step(run, loss)

    def trainer_paused(self, run: TrainerRun) -> None:
        for member in self.members:
            member.trainer_paused(run)


NOBODY = Observer()
_installed: list[Observer] = []
_current: Observer = NOBODY
_environment_read = False


def current() -> Observer:
    """All installed observers as one, or :data:`NOBODY`."""
    return _current


def install(observer: Observer) -> Callable[[], None]:
    """Add ``observer``; returns the function that removes it again."""
    _installed.append(observer)
    _refresh()
    return lambda: uninstall(observer)


def uninstall(observer: Observer) -> None:
    if observer in _installed:
        _installed.remove(observer)
        _refresh()


def install_from_environment() -> None:
    """Install the observers ``TUNEUP_OBSERVERS`` names, once per process.

    An entry that cannot be loaded (a typo, a module that is not installed, a factory that
    fails) is one warning naming it and the fix; the script trains unobserved, as the
    user's training must run whatever the environment holds.
    """
    global _environment_read
    if _environment_read:
        return
    _environment_read = True
    for entry in filter(None, (e.strip() for e in os.environ.get(ENV_OBSERVERS, "").split(","))):
        module, _, function = entry.partition(":")
        try:
            observer = getattr(importlib.import_module(module), function or "install")()
        except Exception as exc:  # noqa: BLE001 - any failure of someone else's code
            from tuneup.settings.store import warn

            warn(f"{ENV_OBSERVERS} names {entry!r}, which cannot be loaded "
                 f"({type(exc).__name__}: {exc}); training runs without it: fix or unset "
                 f"{ENV_OBSERVERS}")
            continue
        if observer is not None:
            install(observer)


def _refresh() -> None:
    global _current
    members = tuple(_installed)
    _current = NOBODY if not members else members[0] if len(members) == 1 else _Observers(members)
