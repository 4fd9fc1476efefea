"""Why a micro-batch can never apply to the script's loop, said on every trial (the
baseline's too), so the search leaves the micro-batch alone with that reason instead of
trying it, or of saying "batch: skipped, budget too small" when the budget is short."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from tuneup.runtime.loop import _PLAIN_FORM, _batch_statistics

if TYPE_CHECKING:
    from tuneup.runtime.loop import TunedLoop

_PLAIN: weakref.WeakSet[Any] = weakref.WeakSet()  # loops the script steps through backward()


def watch_plain_form(loop: TunedLoop) -> None:
    """Remember when the script trains ``loop`` through ``loop.backward(loss)`` (the loss
    computed outside tuneup: no micro-batch can split it). The child wraps the instance's
    method, as it wraps ``torch.set_num_threads``; the loop itself is unchanged."""
    backward = loop.backward

    def plain_backward(*args: Any, **kwargs: Any) -> None:
        _PLAIN.add(loop)
        backward(*args, **kwargs)

    loop.backward = plain_backward  # type: ignore[method-assign]


def micro_batch_blocked(loop: TunedLoop) -> str | None:
    """Why micro-batching does not apply to ``loop``: what the loop said when one was set,
    else what would stop any (the plain form, a closure optimizer, a BatchNorm in training
    mode); None when a micro-batch could apply."""
    if loop.micro_batch_blocked is not None:
        return loop.micro_batch_blocked
    if loop.needs_closure:
        return f"{type(loop.optimizer).__name__} steps with a closure"
    if loop in _PLAIN:
        return _PLAIN_FORM
    return _batch_statistics(loop._norm_layers)
