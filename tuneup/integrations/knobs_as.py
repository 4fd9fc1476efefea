"""tuneup's knobs spelled as each ecosystem's own arguments, declared once.

``tuned_trainer`` (transformers), ``tuned_trainer_kwargs`` (Lightning) and
``tuneup settings show --as ...`` all read these tables, so what the integrations apply and
what the command prints for pasting cannot drift apart. Pure data: no torch, transformers or
Lightning is imported here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tuneup.runtime.malloc_thresholds import MMAP_THRESHOLD, TRIM_THRESHOLD
from tuneup.settings import Knobs

# Knobs field -> transformers.TrainingArguments field
HF_LOADER_FIELDS = {
    "num_workers": "dataloader_num_workers",
    "pin_memory": "dataloader_pin_memory",
    "prefetch_factor": "dataloader_prefetch_factor",
    "persistent_workers": "dataloader_persistent_workers",
}
HF_AMP_FIELDS = {"bfloat16": "bf16", "float16": "fp16"}  # amp_dtype -> the flag set True
# why a Trainer never gets persistent workers from the settings
HF_PERSISTENT_WORKERS = (
    "the Trainer makes a new loader iterator each epoch and evaluation, which draws from "
    "torch's global generator unless workers persist: persistent workers would change "
    "dropout's draws (set dataloader_persistent_workers=True yourself if that is fine)")
LIGHTNING_PRECISION = {"bfloat16": "bf16-mixed", "float16": "16-mixed"}  # Trainer(precision=)
ACCELERATE_PRECISION = {"bfloat16": "bf16", "float16": "fp16"}  # ACCELERATE_MIXED_PRECISION

# the process-wide switches as the Python statement that sets each
PROCESS_CALLS: dict[str, Callable[[Any], str]] = {
    "cpu_threads": lambda v: f"torch.set_num_threads({v!r})",
    "cudnn_benchmark": lambda v: f"torch.backends.cudnn.benchmark = {v!r}",
    "float32_matmul_precision": lambda v: f"torch.set_float32_matmul_precision({v!r})",
    "fixed_malloc_thresholds": lambda v: "tuneup.runtime.malloc_thresholds.fix()" if v else "",
}

MICRO_BATCH_NEEDS_BATCH = ("needs your batch size: per-device batch = micro_batch_size, "
                           "gradient accumulation × (your batch / micro_batch_size)")


@dataclass(frozen=True)
class Spelled:
    """Knobs in one ecosystem's terms: keyword arguments to paste, statements for the script
    (the process-wide switches, run once; what has no argument), and each knob that has no
    spelling there with the reason."""

    arguments: dict[str, Any] = field(default_factory=dict)
    calls: tuple[str, ...] = ()
    left_out: dict[str, str] = field(default_factory=dict)


def process_calls(knobs: Knobs) -> tuple[str, ...]:
    """The statements that set the process-wide knobs that are not None."""
    calls = (spell(getattr(knobs, name)) for name, spell in PROCESS_CALLS.items()
             if getattr(knobs, name) is not None)
    return tuple(call for call in calls if call)


def micro_batch_split(batch_size: int, micro: int) -> int | None:
    """How many pieces of ``micro`` make ``batch_size``, or None when it does not divide
    exactly (or is no split at all): only an exact split keeps the effective batch."""
    if micro >= batch_size or batch_size % micro:
        return None
    return batch_size // micro


def as_plain(knobs: Knobs) -> Spelled:
    """``DataLoader(**arguments)`` plus the torch calls; AMP and compile as statements."""
    calls = list(process_calls(knobs))
    if knobs.amp_dtype is not None:
        calls.append(f"with torch.autocast(device_type, dtype=torch.{knobs.amp_dtype}): ...")
    if knobs.compile_mode is not None:
        calls.append(f"model = torch.compile(model, mode={knobs.compile_mode!r})")
    left_out = {}
    if knobs.micro_batch_size is not None:
        left_out["micro_batch_size"] = (f"{knobs.micro_batch_size} samples per forward/backward: "
                                        "tuned_loop.train_step splits each batch (docs/runtime.md)")
    return Spelled(knobs.loader_kwargs(), tuple(calls), left_out)


def as_hf(knobs: Knobs, batch_size: int | None = None, accumulation: int = 1) -> Spelled:
    """``transformers.TrainingArguments`` fields. The micro-batch needs the user's
    per-device ``batch_size`` (and gradient accumulation) to keep the effective batch."""
    arguments = {HF_LOADER_FIELDS[k]: v for k, v in knobs.loader_kwargs().items()
                 if k != "persistent_workers"}
    if knobs.amp_dtype is not None:
        arguments[HF_AMP_FIELDS[knobs.amp_dtype]] = True
    if knobs.compile_mode is not None:
        arguments.update(torch_compile=True, torch_compile_mode=knobs.compile_mode)
    left_out = {"persistent_workers": HF_PERSISTENT_WORKERS} if knobs.persistent_workers else {}
    if knobs.micro_batch_size is not None:
        pieces = batch_size and micro_batch_split(batch_size, knobs.micro_batch_size)
        if pieces:
            arguments.update(per_device_train_batch_size=knobs.micro_batch_size,
                             gradient_accumulation_steps=accumulation * pieces)
        elif batch_size is None:
            left_out["micro_batch_size"] = MICRO_BATCH_NEEDS_BATCH
        elif knobs.micro_batch_size < batch_size:  # a batch no larger needs no split
            left_out["micro_batch_size"] = (f"{knobs.micro_batch_size} does not divide the batch "
                                            f"of {batch_size} exactly")
    return Spelled(arguments, process_calls(knobs), left_out)


def as_lightning(knobs: Knobs) -> Spelled:
    """``lightning.Trainer`` keyword arguments; the loader knobs go to your DataLoader."""
    arguments: dict[str, Any] = {}
    if knobs.amp_dtype is not None:
        arguments["precision"] = LIGHTNING_PRECISION[knobs.amp_dtype]
    calls = list(process_calls(knobs))
    if knobs.loader_kwargs():
        kwargs = ", ".join(f"{k}={v!r}" for k, v in knobs.loader_kwargs().items())
        calls.append(f"DataLoader(..., {kwargs})  # your training loader")
    if knobs.compile_mode is not None:
        calls.append(f"model = torch.compile(model, mode={knobs.compile_mode!r})  # before fit")
    left_out = {}
    if knobs.micro_batch_size is not None:
        left_out["micro_batch_size"] = (
            "Lightning's accumulate_grad_batches needs a smaller loader batch, which changes "
            "what every step-counting argument (val_check_interval, log_every_n_steps) counts")
    return Spelled(arguments, tuple(calls), left_out)


def as_env(knobs: Knobs, settings_path: str | None = None) -> Spelled:
    """Environment variables where one exists; ``TUNEUP_SETTINGS`` carries the rest to
    tuned_loader / tuned_loop / tuned_trainer."""
    arguments: dict[str, Any] = {}
    if settings_path is not None:
        arguments["TUNEUP_SETTINGS"] = settings_path
    if knobs.cpu_threads is not None:
        arguments["OMP_NUM_THREADS"] = str(knobs.cpu_threads)
    if knobs.amp_dtype is not None:  # read by accelerate and transformers' TrainingArguments
        arguments["ACCELERATE_MIXED_PRECISION"] = ACCELERATE_PRECISION[knobs.amp_dtype]
    if knobs.compile_mode is not None:  # read by accelerate's TorchDynamoPlugin
        arguments.update(ACCELERATE_DYNAMO_BACKEND="inductor",
                         ACCELERATE_DYNAMO_MODE=knobs.compile_mode)
    if knobs.fixed_malloc_thresholds:
        arguments.update(MALLOC_MMAP_THRESHOLD_=str(MMAP_THRESHOLD),
                         MALLOC_TRIM_THRESHOLD_=str(TRIM_THRESHOLD))
    no_variable = [name for name in (*Knobs.LOADER, "micro_batch_size", "cudnn_benchmark",
                                     "float32_matmul_precision")
                   if getattr(knobs, name) is not None]
    left_out = dict.fromkeys(no_variable, "no environment variable; TUNEUP_SETTINGS applies it "
                                          "through tuneup's wrappers")
    return Spelled(arguments, (), left_out)

