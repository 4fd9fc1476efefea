"""The knobs' candidate values for one script on one machine, from the child's ``hello``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuneup.settings import AMP_DTYPES, Knobs, SettingsError
from tuneup.settings.schema import knob_facts

# Names accepted by --only / --skip, in the order a compute-bound search visits them.
GROUPS = ("amp", "batch", "loader", "threads", "compile")
# Compile modes that capture CUDA graphs (unsafe with gradient accumulation unless checked).
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
MAX_WORKERS = 32
MIN_MICRO_BATCH = 8


@dataclass(frozen=True)
class ScriptFacts:
    """What the child reported about the script (its loader and batch) and its device."""

    device: str = "cpu"
    effective_batch: int = 1  # per rank: the batch_size one process's loader gives
    ranks: int = 1  # processes training together (torchrun's world), each with that batch
    dataset_size: int | None = None
    amp_dtypes: tuple[str, ...] = ()
    compile_available: bool = False
    every_trial: Knobs = Knobs()  # knobs of no search the child set before its first trial
    cpu_threads: int = 1  # torch's default intra-op thread count in the child
    usable_cores: int = 1
    # cores other processes kept busy when the child started (a loaded machine): the
    # threads stage's ceiling and candidates count only the cores left over
    busy_cores: float = 0.0
    fixed_knobs: tuple[str, ...] = ()  # knobs the tuner must leave alone
    fixed_reasons: tuple[tuple[str, str], ...] = ()  # (knob, why), for the result's notes
    shuffles: bool = True  # the loader's order depends on a random generator
    trials_per_process: int | None = None  # a trainer runs one (None: as many as a plan has)
    step_batch: int | None = None  # per rank and optimizer step, where a trainer accumulates
    convolutions: bool | None = None  # the model has convolution layers (None: not said)

    @classmethod
    def from_hello(cls, event: dict[str, Any]) -> ScriptFacts:
        """Build from a ``hello`` event, tolerating missing or odd fields."""
        cores = _positive_int(event.get("usable_cores")) or 1
        reasons = event.get("fixed_reasons")
        reasons = reasons if isinstance(reasons, dict) else {}
        return cls(
            device=str(event.get("device") or "cpu").split(":")[0],
            effective_batch=_positive_int(event.get("effective_batch")) or 1,
            ranks=_positive_int(event.get("ranks")) or 1,
            dataset_size=_positive_int(event.get("dataset_size")),
            amp_dtypes=tuple(d for d in event.get("amp_dtypes") or () if d in AMP_DTYPES),
            compile_available=bool(event.get("compile_available")),
            every_trial=_knobs_or_empty(event.get("every_trial")),
            cpu_threads=_positive_int(event.get("cpu_threads")) or cores,
            usable_cores=cores,
            busy_cores=_share_of(event.get("busy_cores"), cores),
            fixed_knobs=tuple(str(k) for k in event.get("fixed_knobs") or ()),
            fixed_reasons=tuple((str(k), str(v)) for k, v in reasons.items()),
            shuffles=event.get("shuffles") is not False,
            trials_per_process=_positive_int(event.get("trials_per_process")),
            step_batch=_positive_int(event.get("samples_per_step")),
            convolutions=(bool(event["convolutions"]) if isinstance(event.get("convolutions"), bool)
                          else None),
        )

    @property
    def samples_per_step(self) -> int:
        """The job's samples per optimizer step: every rank's effective batch (times a
        trainer's gradient accumulation)."""
        return (self.step_batch or self.effective_batch) * self.ranks

    @property
    def on_cuda(self) -> bool:
        return self.device == "cuda"

    def as_run(self, knobs: Knobs) -> Knobs:
        """``knobs`` as the trials ran them: with what every trial had (a settings file of
        them makes the run what was measured)."""
        return knobs.replace(**self.every_trial.changed())


def _knobs_or_empty(value: Any) -> Knobs:
    """Knobs from a hello field; an odd one reads as none (the trials still ran)."""
    try:
        return Knobs.from_dict(value) if value else Knobs()
    except (SettingsError, TypeError):
        return Knobs()


def _positive_int(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def _share_of(value: Any, cores: int) -> float:
    """A hello's busy cores, between none and all ``cores`` (an odd value reads as none)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return min(float(cores), number) if number > 0 else 0.0


def free_cores(hw: ScriptFacts) -> int:
    """The usable cores other processes left idle (at least one)."""
    return max(1, round(hw.usable_cores - hw.busy_cores))


def amp_dtypes(hw: ScriptFacts) -> list[str]:
    """Autocast dtypes worth a trial: those the device supports (never float16 on a CPU)."""
    return [d for d in AMP_DTYPES if d in hw.amp_dtypes and (hw.on_cuda or d != "float16")]


def matmul_precisions(hw: ScriptFacts) -> list[str]:
    """TF32 for float32 matmuls: a CUDA-only knob."""
    return ["high"] if hw.on_cuda else []


def micro_batches(hw: ScriptFacts) -> list[int]:
    """Micro-batch sizes that divide the effective batch, largest first (halving, up to /8)."""
    sizes = []
    for parts in (2, 4, 8):
        size, rest = divmod(hw.effective_batch, parts)
        if rest == 0 and size >= min(MIN_MICRO_BATCH, hw.effective_batch // 2):
            sizes.append(size)
    return sizes


def worker_counts(hw: ScriptFacts) -> list[int]:
    """``num_workers`` values above 0, ascending: each count up to 4 cores, then doubling."""
    cores = min(hw.usable_cores, MAX_WORKERS)
    return list(range(1, cores + 1)) if cores <= 4 else _doublings(cores)


def _doublings(limit: int) -> list[int]:
    counts, n = [], 1
    while n < limit:
        counts.append(n)
        n *= 2
    return counts + [limit]


def thread_counts(hw: ScriptFacts, workers: int) -> list[int]:
    """Intra-op thread counts to try besides torch's default, given the loader's workers.

    On a CPU run the workers and the main process share the cores, so the candidates are
    the cores left over by the workers (and by other processes' load), half the cores and
    one thread.
    """
    cores, free = hw.usable_cores, free_cores(hw)
    options = [max(1, free - workers), max(1, cores // 2), 1, cores]
    return [n for n in dict.fromkeys(options) if n != hw.cpu_threads]


def compile_modes(hw: ScriptFacts) -> list[str]:
    """Compile modes worth their compile time here (CUDA graphs only on CUDA)."""
    if not hw.compile_available:
        return []
    return ["default", "reduce-overhead"] if hw.on_cuda else ["default"]


def default_value(name: str, hw: ScriptFacts) -> Any:
    """What PyTorch does when a knob is left at ``None`` (for the report): this machine's or
    this script's value, or a name, where the knob's declared default says ``None``; the
    declared default otherwise."""
    shown = {
        "prefetch_factor": None,  # only with workers
        "micro_batch_size": hw.effective_batch,
        "amp_dtype": "float32",
        "compile_mode": "eager",
        "cpu_threads": hw.cpu_threads,
    }
    return shown[name] if name in shown else knob_facts(name).pytorch_default
