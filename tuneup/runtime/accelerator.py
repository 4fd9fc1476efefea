"""What the loop must know of an ``accelerate.Accelerator`` it was given, read from the
object's attributes alone: the runtime never imports accelerate (nor tuneup's integration
of it, which imports the runtime)."""

from __future__ import annotations

from typing import Any


def steps_in_backward(accelerator: Any) -> bool:
    """Whether ``accelerator.backward`` also steps the optimizer (DeepSpeed's engine does,
    on every syncing step): each micro-batch piece would then be an optimizer step."""
    kind = getattr(accelerator, "distributed_type", None)
    return str(getattr(kind, "value", kind)).upper() == "DEEPSPEED"


def amp_refused(accelerator: Any, scaler: Any) -> str | None:
    """Why the settings' AMP cannot apply beside ``accelerator``, or None: its own mixed
    precision decides, or float16's GradScaler would step between its accumulated steps."""
    if accelerator is None:
        return None
    mixed = getattr(accelerator, "mixed_precision", "no")
    if mixed != "no":
        return f"the accelerator's mixed_precision={mixed!r} decides"
    if scaler is not None:
        return ("a GradScaler beside the accelerator would step between its accumulated "
                "steps; set Accelerator(mixed_precision='fp16')")
    return None
