"""The settings file's schema: the tuned knobs, what was measured, and where.

Every knob defaults to ``None``, which means "leave PyTorch's own default alone".
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, get_args, get_type_hints

SCHEMA_VERSION = 1

AMP_DTYPES = ("bfloat16", "float16")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
MATMUL_PRECISIONS = ("highest", "high", "medium")


class SettingsError(ValueError):
    """A settings file or value that cannot be used; the message names the problem."""


@dataclass(frozen=True)
class KnobFacts:
    """What tuneup knows about one knob, declared once on its field."""

    label: str  # short name in reports and trial ids: "workers=2"
    group: str | None  # the autotune group that tunes it (--only / --skip); None: not searched
    pytorch_default: Any  # what PyTorch does when the knob is None
    complexity: int  # weight in "simpler": fewer and lighter changes win ties
    safe_across_machines: bool = False  # may apply on another machine (settings fingerprint)
    changes_numerics: bool = False  # may change what the model computes (within tolerance)
    changes_data_order: bool = False  # may change the order a sampler gives the samples in
    # the random draws it moves, in words (docs/settings.md): a tuned run is another draw of
    # the same distributions there, never bit-identical to the untuned one; "" for none
    random_streams: str = ""


def _knob(label: str, group: str | None, pytorch_default: Any, complexity: int,
          **facts: Any) -> Any:
    return field(default=None, metadata={"facts": KnobFacts(label, group, pytorch_default,
                                                            complexity, **facts)})


@dataclass(frozen=True)
class Knobs:
    """What the autotuner chose. ``None`` = PyTorch default, untouched. Hashable: equal knobs
    are the same point of the search."""

    # the runtime does not apply it where it would change the sample order: a shuffle seeded
    # from torch's global generator over a dataset whose loading draws from that generator
    num_workers: int | None = _knob(
        "workers", "loader", 0, 1,
        random_streams="draws made while loading come from PyTorch's per-worker seeds and no "
        "longer advance the main process's generators (dropout masks and later draws there "
        "change)")
    pin_memory: bool | None = _knob("pin_memory", "loader", False, 1, safe_across_machines=True)
    # a deeper prefetch costs host (shared) memory for 2 more batches per worker and changes
    # neither what the model computes nor the samples' order: no heavier than the default,
    # so a tie over it is not decided by weight (docs/autotune.md, The method)
    prefetch_factor: int | None = _knob("prefetch", "loader", 2, 0)
    # PyTorch's seeded shuffle order changes from the second epoch on with persistent workers
    persistent_workers: bool | None = _knob(
        "persistent", "loader", False, 1, changes_data_order=True,
        random_streams="workers keep their generators across epochs, and no base seed is drawn "
        "from torch's global generator per epoch: a shuffle seeded from it changes order")
    # samples per forward/backward inside loop.train_step; None = the whole batch
    micro_batch_size: int | None = _knob(
        "micro_batch", "batch", None, 3, changes_numerics=True,
        random_streams="dropout masks and other draws of the forward pass, drawn piece by piece")
    amp_dtype: str | None = _knob("amp", "amp", None, 3, changes_numerics=True)  # AMP_DTYPES
    compile_mode: str | None = _knob(
        "compile", "compile", None, 4, changes_numerics=True,
        random_streams="dropout masks: compiled graphs draw with their own random kernels, "
        "which advance torch's global generator by other amounts (a later draw from it, a "
        "shuffle seeded from it, comes out different)")
    cpu_threads: int | None = _knob("threads", "threads", None, 1)  # torch.set_num_threads
    cudnn_benchmark: bool | None = _knob("cudnn_benchmark", "compile", False, 1,
                                         changes_numerics=True)
    float32_matmul_precision: str | None = _knob("matmul", "amp", "highest", 2,
                                                 changes_numerics=True)
    # glibc malloc's thresholds fixed (tuneup/runtime/malloc_thresholds.py); None: glibc's
    # own, which move with what the process allocated before. Not searched: every trial
    # runs with it, and autotune writes it so the run is what was measured
    fixed_malloc_thresholds: bool | None = _knob("fixed_malloc", None, False, 0)

    LOADER: ClassVar[tuple[str, ...]] = ("num_workers", "pin_memory", "prefetch_factor",
                                         "persistent_workers")

    def loader_kwargs(self) -> dict[str, Any]:
        """The DataLoader keywords this sets (only those not ``None``)."""
        return {k: getattr(self, k) for k in self.LOADER if getattr(self, k) is not None}

    def without_loader(self) -> Knobs:
        """These knobs minus the DataLoader's: what compiled graphs depend on (the loader only
        feeds them), so settings that differ in loader knobs alone share their graphs."""
        return self.replace(**dict.fromkeys(self.LOADER))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def replace(self, **changes: Any) -> Knobs:
        return dataclasses.replace(self, **changes)

    def changed(self) -> dict[str, Any]:
        """The knobs that are set (not None)."""
        return {k: v for k, v in self.to_dict().items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Knobs:
        """Build and validate; raises :class:`SettingsError` naming the first bad knob."""
        if not isinstance(data, dict):
            raise SettingsError("'knobs' must be an object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SettingsError(f"unknown knob(s): {', '.join(unknown)}")
        knobs = cls(**data)
        knobs.validate()
        return knobs

    def validate(self) -> None:
        for name in ("num_workers", "cpu_threads"):
            _check_int(name, getattr(self, name), minimum=0 if name == "num_workers" else 1)
        for name in ("prefetch_factor", "micro_batch_size"):
            _check_int(name, getattr(self, name), minimum=1)
        for name in ("pin_memory", "persistent_workers", "cudnn_benchmark",
                     "fixed_malloc_thresholds"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise SettingsError(f"{name} must be true, false or null, not {value!r}")
        _check_choice("amp_dtype", self.amp_dtype, AMP_DTYPES)
        _check_choice("compile_mode", self.compile_mode, COMPILE_MODES)
        _check_choice("float32_matmul_precision", self.float32_matmul_precision, MATMUL_PRECISIONS)
        if self.num_workers == 0 and (self.prefetch_factor or self.persistent_workers):
            raise SettingsError("prefetch_factor and persistent_workers need num_workers > 0")


def knob_facts(name: str) -> KnobFacts:
    """The facts declared on knob ``name``."""
    return _FACTS[name]


def knob_names(**wanted: Any) -> tuple[str, ...]:
    """Knobs whose facts match, e.g. ``knob_names(safe_across_machines=True)``."""
    return tuple(name for name, facts in _FACTS.items()
                 if all(getattr(facts, key) == value for key, value in wanted.items()))


_FACTS = {f.name: f.metadata["facts"] for f in fields(Knobs)}


def _check_int(name: str, value: Any, minimum: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SettingsError(f"{name} must be an integer >= {minimum} or null, not {value!r}")


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value is not None and value not in choices:
        raise SettingsError(f"{name} must be one of {', '.join(choices)} or null, not {value!r}")


def _check_measured(name: str, value: Any, declared: Any) -> None:
    """``value`` is of its field's declared type: integers are counts of at least one (a
    batch, ranks), other numbers finite and not negative (speeds, shares), or null."""
    kinds = set(get_args(declared)) - {type(None)} or {declared}
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if value is None or (bool in kinds and isinstance(value, bool)) or (
            str in kinds and isinstance(value, str)):
        return
    if int in kinds and number and isinstance(value, int) and value >= 1:
        return
    if float in kinds and number and math.isfinite(value) and value >= 0:
        return
    what = ("an integer >= 1" if int in kinds else "a number >= 0" if float in kinds
            else "true or false" if bool in kinds else "a string")
    raise SettingsError(f"measured.{name} must be {what} or null, not {value!r}")


@dataclass
class Measurement:
    """Throughput the autotuner measured, defaults against the chosen knobs."""

    baseline_samples_per_s: float | None = None
    tuned_samples_per_s: float | None = None
    effective_batch_size: int | None = None  # the batch_size the knobs were tuned for
    device: str | None = None  # "cpu", "cuda"
    confirmed: bool | None = None  # the speed-up's interval excludes 1 (False: not shown)
    local_ranks: int | None = None  # torchrun's ranks per node it was tuned with (None: one)
    # the chosen knobs' share of step time spent waiting for data, over their trials, and its
    # spread (None: one trial): a run compares its own wait with these (runtime/telemetry.py)
    data_wait_share: float | None = None
    data_wait_noise: float | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        """Every declared field checked against its declared type, whatever fields are
        declared (keys it does not declare, e.g. ``speedup``, are left out); raises
        :class:`SettingsError` naming the first bad one."""
        hints = get_type_hints(cls)
        values = {item.name: data.get(item.name) for item in fields(cls)}
        for name, value in values.items():
            _check_measured(name, value, hints[name])
        return cls(**values)

    @property
    def speedup(self) -> float | None:
        if self.baseline_samples_per_s and self.tuned_samples_per_s:
            return self.tuned_samples_per_s / self.baseline_samples_per_s
        return None


@dataclass
class Settings:
    """One settings file."""

    knobs: Knobs = field(default_factory=Knobs)
    measured: Measurement = field(default_factory=Measurement)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    script: str | None = None
    created: str | None = None  # ISO 8601 UTC
    tuneup_version: str | None = None

    def to_dict(self) -> dict[str, Any]:
        measured = asdict(self.measured)
        measured["speedup"] = self.measured.speedup
        return {
            "schema_version": SCHEMA_VERSION,
            "tuneup_version": self.tuneup_version,
            "created": self.created,
            "script": self.script,
            "knobs": self.knobs.to_dict(),
            "measured": measured,
            "fingerprint": self.fingerprint,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Settings:
        if not isinstance(data, dict):
            raise SettingsError("the file does not hold a JSON object")
        version = data.get("schema_version")
        if isinstance(version, bool) or version != SCHEMA_VERSION:  # true == 1 in Python
            raise SettingsError(
                f"schema_version {version!r} is not supported (this tuneup reads {SCHEMA_VERSION})"
            )
        measured = _object_or_empty(data, "measured")
        if not isinstance(measured, dict):
            raise SettingsError("'measured' must be an object")
        fingerprint = _object_or_empty(data, "fingerprint")
        if not isinstance(fingerprint, dict):
            raise SettingsError("'fingerprint' must be an object")
        return cls(
            knobs=Knobs.from_dict(_object_or_empty(data, "knobs")),
            measured=Measurement.from_dict(measured),
            fingerprint=fingerprint,
            script=data.get("script"),
            created=data.get("created"),
            tuneup_version=data.get("tuneup_version"),
        )


def _object_or_empty(data: dict[str, Any], key: str) -> Any:
    """``data[key]``, with a missing key or null read as ``{}`` (other values are validated)."""
    value = data.get(key)
    return {} if value is None else value
