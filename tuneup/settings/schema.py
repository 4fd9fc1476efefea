"""The settings file's schema: the tuned knobs, what was measured, and where.

Every knob defaults to ``None``, which means "leave PyTorch's own default alone".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

SCHEMA_VERSION = 1

AMP_DTYPES = ("bfloat16", "float16")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
MATMUL_PRECISIONS = ("highest", "high", "medium")


class SettingsError(ValueError):
    """A settings file or value that cannot be used; the message names the problem."""


@dataclass
class Knobs:
    """What the autotuner chose. ``None`` = PyTorch default, untouched."""

    num_workers: int | None = None
    pin_memory: bool | None = None
    prefetch_factor: int | None = None
    persistent_workers: bool | None = None
    micro_batch_size: int | None = None  # samples per forward/backward; None = the effective batch
    amp_dtype: str | None = None  # "bfloat16" | "float16"; None = fp32
    compile_mode: str | None = None  # one of COMPILE_MODES; None = eager
    cpu_threads: int | None = None  # torch.set_num_threads
    cudnn_benchmark: bool | None = None
    float32_matmul_precision: str | None = None  # one of MATMUL_PRECISIONS

    LOADER = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers")

    def loader_kwargs(self) -> dict[str, Any]:
        """The DataLoader keywords this sets (only those not ``None``)."""
        return {k: getattr(self, k) for k in self.LOADER if getattr(self, k) is not None}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def replace(self, **changes: Any) -> Knobs:
        return Knobs(**{**self.to_dict(), **changes})

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
        for name in ("pin_memory", "persistent_workers", "cudnn_benchmark"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise SettingsError(f"{name} must be true, false or null, not {value!r}")
        _check_choice("amp_dtype", self.amp_dtype, AMP_DTYPES)
        _check_choice("compile_mode", self.compile_mode, COMPILE_MODES)
        _check_choice("float32_matmul_precision", self.float32_matmul_precision, MATMUL_PRECISIONS)
        if self.num_workers == 0 and (self.prefetch_factor or self.persistent_workers):
            raise SettingsError("prefetch_factor and persistent_workers need num_workers > 0")


def _check_int(name: str, value: Any, minimum: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SettingsError(f"{name} must be an integer >= {minimum} or null, not {value!r}")


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value is not None and value not in choices:
        raise SettingsError(f"{name} must be one of {', '.join(choices)} or null, not {value!r}")


@dataclass
class Measurement:
    """Throughput the autotuner measured, defaults against the chosen knobs."""

    baseline_samples_per_s: float | None = None
    tuned_samples_per_s: float | None = None
    effective_batch_size: int | None = None  # the batch_size the knobs were tuned for
    device: str | None = None  # "cpu", "cuda"

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
        if version != SCHEMA_VERSION:
            raise SettingsError(
                f"schema_version {version!r} is not supported (this tuneup reads {SCHEMA_VERSION})"
            )
        measured = _object_or_empty(data, "measured")
        if not isinstance(measured, dict):
            raise SettingsError("'measured' must be an object")
        known = {f.name for f in fields(Measurement)}
        fingerprint = _object_or_empty(data, "fingerprint")
        if not isinstance(fingerprint, dict):
            raise SettingsError("'fingerprint' must be an object")
        return cls(
            knobs=Knobs.from_dict(_object_or_empty(data, "knobs")),
            measured=Measurement(**{k: v for k, v in measured.items() if k in known}),
            fingerprint=fingerprint,
            script=data.get("script"),
            created=data.get("created"),
            tuneup_version=data.get("tuneup_version"),
        )


def _object_or_empty(data: dict[str, Any], key: str) -> Any:
    """``data[key]``, with a missing key or null read as ``{}`` (other values are validated)."""
    value = data.get(key)
    return {} if value is None else value
