"""The snapshot: every fact the doctor knows about one machine, as plain data.

The probe (live machine) and the report readers (collect_env text, tuneup JSON) fill it;
the rules read it. ``None`` always means *unknown* (not collected, not in the report);
an empty list means *known to be none*.

Notes for rule writers:

- ``TorchBuild.build`` says what kind of build torch is: ``"cuda"``, ``"rocm"``, ``"cpu"``
  (``"xpu"`` for Intel GPU builds), ``None`` when unknown. ``TorchBuild.cuda is None`` alone
  does not distinguish "a CPU build" from "the report did not say": use ``build``. A report
  that states ``CUDA used to build PyTorch: None`` / ``Could not collect`` next to a torch
  version, a ``+cpu`` suffix or a conda ``cpu`` build string gives ``build == "cpu"``.
- ``TorchBuild.cuda`` is always ``MAJOR.MINOR`` ("10.1", not "10.1.243").
- ``TorchBuild.importable`` is ``False`` when torch is installed (or its state unknown) but
  ``import torch`` failed: collect_env then prints ``PyTorch version: N/A``.
- ``env`` from a collect_env report holds only the variables the text states (lines such as
  ``CUDA_VISIBLE_DEVICES=2`` added by the user): a variable missing from it is unknown, not unset.
  From the live probe it holds every selected variable that is set.
- ``cudnn_libraries`` / ``nccl_libraries`` are the entries as found or reported (paths, or a
  bare version when a hand-written report gives only that); ``cudnn_versions`` /
  ``nccl_versions`` are the distinct versions read from them ("8.9.2", or "8" from a soname).
  ``cudnn_library_versions`` holds the full version a found library states (its
  ``cudnnGetVersion``, its real file name, or its header), where the name is only a soname.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints


@dataclass
class GPU:
    """One GPU as NVML, torch.cuda or a report describes it."""

    index: int | None = None
    name: str | None = None
    vendor: str | None = None  # "nvidia", "amd" (or "intel")
    arch: str | None = None  # AMD gfx target ("gfx90a"), when a ROCm report names it
    compute_capability: str | None = None  # "8.6"
    memory_total_mib: int | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    persistence_mode: bool | None = None
    throttle_reasons: list[str] | None = None  # active clock-throttle reasons, NVML names
    ecc_enabled: bool | None = None
    ecc_uncorrected_errors: int | None = None


@dataclass
class Driver:
    """The NVIDIA kernel driver and the CUDA API level it provides."""

    version: str | None = None  # "570.124.04"
    cuda_version: str | None = None  # highest CUDA API the driver supports, "12.8"
    proc_version: str | None = None  # first line of /proc/driver/nvidia/version
    nvml_timeout_s: float | None = None  # NVML did not answer within this many seconds


@dataclass
class TorchBuild:
    """The installed PyTorch and what it was built with."""

    installed: bool | None = None
    importable: bool | None = None  # False: installed or unknown, but `import torch` failed
    version: str | None = None  # "2.6.0+cu126"
    build: str | None = None  # "cuda", "rocm", "cpu", "xpu"; None = unknown (module docstring)
    debug_build: bool | None = None
    cuda: str | None = None  # torch.version.cuda, "12.6"; None on CPU/ROCm builds when installed
    hip: str | None = None  # torch.version.hip
    arch_list: list[str] | None = None  # torch.cuda.get_arch_list(), ["sm_50", ..., "compute_90"]
    cudnn_compiled: str | None = None  # "9.1.0"
    cudnn_runtime: str | None = None  # cuDNN actually loaded, "9.1.0"
    nccl: str | None = None  # "2.21.5"
    cuda_available: bool | None = None
    device_count: int | None = None
    init_error: str | None = None  # why CUDA failed to initialise, as torch said it


@dataclass
class CPU:
    """Host CPU, memory and shared memory."""

    model: str | None = None
    architecture: str | None = None  # "x86_64"
    flags: list[str] | None = None  # the flags that matter: avx2, avx512f, avx512_bf16, amx_bf16, ...
    logical_cores: int | None = None  # os.cpu_count()
    usable_cores: float | None = None  # after affinity mask and cgroup quota
    cgroup_quota_cores: float | None = None
    ram_total_bytes: int | None = None
    shm_total_bytes: int | None = None  # size of /dev/shm


@dataclass
class Platform:
    """Python, operating system and where the process runs."""

    python_version: str | None = None  # "3.12.9"
    python_implementation: str | None = None
    python_bits: int | None = None  # 64 or 32: no PyTorch wheel was ever built for 32
    python_built: str | None = None  # day sys.version says it was built, "2023-10-03"
    os: str | None = None  # "Ubuntu 24.04.4 LTS (x86_64)" or "Windows 10"
    os_family: str | None = None  # "linux", "windows", "darwin"
    kernel: str | None = None
    is_wsl: bool | None = None
    in_container: bool | None = None
    libc: str | None = None


@dataclass
class LibraryVersion:
    """The version one shared library states, and where it was read."""

    path: str | None = None
    version: str | None = None  # "9.1.0"
    read_from: str | None = None  # "cudnnGetVersion", "file name", "cudnn_version.h"


@dataclass
class Snapshot:
    """Everything known about one environment. See module docstring for ``None``."""

    source: str = "live"  # "live", "collect_env", "json"
    platform: Platform = field(default_factory=Platform)
    torch: TorchBuild = field(default_factory=TorchBuild)
    driver: Driver = field(default_factory=Driver)
    gpus: list[GPU] | None = None
    cuda_toolkit: str | None = None  # nvcc on PATH ("CUDA runtime version" in collect_env)
    cudnn_libraries: list[str] | None = None  # cuDNN shared libraries found on the system
    cudnn_versions: list[str] | None = None  # distinct versions of those libraries ("8.9.2")
    cudnn_library_versions: list[LibraryVersion] | None = None  # as each library states it
    nccl_libraries: list[str] | None = None  # libnccl shared libraries found on the library path
    nccl_versions: list[str] | None = None  # distinct versions of those libraries ("2.21.5")
    env: dict[str, str] | None = None  # CUDA_VISIBLE_DEVICES, NCCL_*, LD_LIBRARY_PATH, NVIDIA_*
    pip_packages: dict[str, str] | None = None  # name (normalised, lower-case) -> version
    conda_packages: dict[str, str] | None = None
    cpu: CPU = field(default_factory=CPU)
    messages: list[str] = field(default_factory=list)  # warnings/errors printed in a report
    notes: list[str] = field(default_factory=list)  # what could not be read, and why

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (the ``environment`` object of ``--format json``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Snapshot:
        """Inverse of :meth:`to_dict`; unknown keys are ignored, missing ones stay unknown."""
        return _build(cls, data)


def _build(kind: type, data: Any) -> Any:
    if not isinstance(data, dict):
        raise ValueError(f"expected an object for {kind.__name__}, got {type(data).__name__}")
    hints = get_type_hints(kind)
    values = {}
    for f in fields(kind):
        if f.name not in data:
            continue
        values[f.name] = _convert(hints[f.name], data[f.name])
    return kind(**values)


def _convert(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    options = get_args(hint) if get_origin(hint) in (Union, UnionType) else (hint,)
    for option in options:
        if is_dataclass(option):
            return _build(option, value)
        if get_origin(option) is list:
            (item,) = get_args(option)
            if not isinstance(value, list):
                raise ValueError(f"expected a list, got {type(value).__name__}")
            return [_convert(item, v) for v in value]
    scalars = tuple(o for o in options if o in (bool, int, float, str))
    return _scalar(scalars, value) if scalars else value


def _scalar(kinds: tuple[type, ...], value: Any) -> Any:
    """A fact of one of ``kinds``: numbers finite and not negative (counts, sizes, versions
    of hardware), text printable; anything else is a malformed report."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(value, bool) and bool not in kinds or not (
            isinstance(value, kinds) or number and float in kinds):
        raise ValueError(f"expected {' or '.join(k.__name__ for k in kinds)}, "
                         f"got {type(value).__name__} {str(value)[:40]!r}")
    if number and (not math.isfinite(value) or value < 0):
        raise ValueError(f"{value!r} is not a count or size")
    return printable(value) if isinstance(value, str) else value


_STRING_END = r"[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC, DCS, APC... up to BEL or ST
_ESCAPES = re.compile(  # 7-bit ESC sequences (CSI, strings, the rest) and their 8-bit C1 forms
    r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[\]PX^_]" + _STRING_END + r"|[ -/]*[0-~])"
    r"|\x9b[0-?]*[ -/]*[@-~]|[\x90\x98\x9d-\x9f]" + _STRING_END)
# C0 and C1 controls, and the format characters that reorder or hide text (bidi overrides
# and isolates, zero-width characters, line and paragraph separators)
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e"
                       "\u2060-\u206f\ufeff\ufff9-\ufffb]")
_SURROGATES = re.compile("[\ud800-\udfff]")  # bytes no encoding held (os.fsdecode's escapes)
MAX_TEXT = 1000  # characters of one fact: a version, a name, a path, one message


def printable(text: str, limit: int = MAX_TEXT, *, one_line: bool = False) -> str:
    """``text`` without terminal escape sequences, control or bidi characters (they would act
    on the reader's terminal, or hide text, when it is printed), bytes that were no UTF-8 as
    U+FFFD, cut to ``limit`` characters; with ``one_line``, tabs and newlines become spaces.
    The one such filter: the doctor's pasted reports and the watcher's processes use it."""
    text = _SURROGATES.sub("\ufffd", _CONTROLS.sub("", _ESCAPES.sub("", text)))
    if one_line:
        text = text.replace("\n", " ").replace("\t", " ")
    return text if len(text) <= limit else text[:limit - 1] + "…"
