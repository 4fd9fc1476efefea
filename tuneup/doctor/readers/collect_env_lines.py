"""First pass over a collect_env text: raw field values, multi-line values, packages, messages.

Only splits the text; :mod:`tuneup.doctor.readers.collect_env` interprets the values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tuneup.doctor.messages import recognised
from tuneup.machine.probe.host import ENV_NAMES, ENV_PREFIXES
from tuneup.machine import versions

# collect_env field names (lower case) -> our name. Several spellings across versions and the
# old hand-filled issue template ("- PyTorch Version (e.g., 1.0): 1.6.0").
FIELDS = {
    "pytorch version": "torch_version",
    "is debug build": "debug",
    "cuda used to build pytorch": "cuda_built",
    "rocm used to build pytorch": "rocm_built",
    "xpu used to build pytorch": "xpu_built",
    "os": "os",
    "gcc version": "ignored",
    "clang version": "ignored",
    "cmake version": "ignored",
    "libc version": "libc",
    "python version": "python",
    "python platform": "python_platform",
    "is cuda available": "cuda_available",
    "cuda runtime version": "cuda_runtime",
    "cuda_module_loading set to": "module_loading",
    "gpu models and configuration": "gpus",
    "nvidia driver version": "driver",
    "cudnn version": "cudnn",
    "is xpu available": "ignored",
    "intel gpu driver version": "ignored",
    "intel gpu models onboard": "ignored",
    "intel gpu models detected": "ignored",
    "hip runtime version": "ignored",
    "miopen runtime version": "ignored",
    "is xnnpack available": "ignored",
    "caching allocator config": "alloc_conf",
    "cpu": "cpu_section",
    "versions of relevant libraries": "libraries_section",
    "how you installed pytorch": "ignored",
    "build command you used": "ignored",
    "cuda/cudnn version": "cuda_cudnn",
    "any other relevant information": "ignored",
    # the same facts as other tools' environment dumps name them (SGLang's check_env,
    # Ultralytics' checks, vLLM's banner)
    "python": "python",
    "pytorch": "torch_version",
    "cuda available": "cuda_available",
    "torch.cuda.is_available()": "cuda_available",
    "torch.cuda.device_count()": "ignored",
}
# Fields whose presence marks a text as a collect_env report (OS or Python alone do not).
STRONG_FIELDS = {
    "torch_version",
    "cuda_built",
    "rocm_built",
    "cuda_available",
    "gpus",
    "driver",
    "cudnn",
    "libraries_section",
    "cuda_cudnn",
}
UNKNOWN = {"", "n/a", "none", "could not collect", "no cuda", "unknown"}
ENV_EXTRA_PREFIXES = ENV_PREFIXES + ("CUDA_", "NVIDIA_", "HIP_", "ROCR_")

_FIELD_LINE = re.compile(r"^(?:[-*\u2022]\s+)?([A-Za-z][\w ./`'()\-,]*?)\s*:\s*(.*)$")
_ENV_LINE = re.compile(r"^(?:export\s+|set\s+)?([A-Z][A-Z0-9_]*)\s*(=|:)\s*(.*)$")
_PACKAGE_LINE = re.compile(r"^\[(pip\d*|conda)\]\s*(.*)$")
GPU_LINE = re.compile(r"^GPU\s+(\d+(?:\s*,\s*\d+)*)\s*:\s*(.+)$")  # SGLang: "GPU 0,1,2,3: H100"
_WARNING = re.compile(
    r"Warning|Error|Exception|Traceback|warning:|error:|failed|not compatible|too old"
    r"|no kernel image|undefined symbol|Found no NVIDIA|cannot open|not found",
)
_CODE_ECHO = re.compile(r"^\s*(?:return |warn\(|warnings\.warn\(|[\w.]+ = )")
_MERGED_LINES = re.compile(r"(?<=[^:\s])\s{40,}(?=\S)")


@dataclass
class RawReport:
    """Field values as written, before interpretation."""

    fields: dict[str, str] = field(default_factory=dict)
    gpu_lines: list[str] = field(default_factory=list)
    loose_gpu_lines: list[str] = field(default_factory=list)  # "GPU 0: ..." outside that field
    cudnn_lines: list[str] = field(default_factory=list)
    cpu_lines: list[str] = field(default_factory=list)
    pip: dict[str, str] | None = None
    conda: dict[str, str] | None = None
    conda_builds: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)


def clean_lines(text: str) -> list[str]:
    lines = []
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        line = re.sub(r"^(?:>\s?)+", "", line.rstrip()).replace("**", "").replace("`", "")
        if line.strip().startswith("```"):
            line = ""
        lines.extend(_MERGED_LINES.split(line))
    return lines


def _field_of(line: str) -> tuple[str, str] | None:
    match = _FIELD_LINE.match(line.strip())
    if not match:
        return None
    key = re.sub(r"\(e\.g\..*?\)", "", match.group(1).lower())
    key = " ".join(key.replace("`", "").split())
    name = FIELDS.get(key)
    return (name, match.group(2).strip()) if name else None


def _env_of(line: str) -> tuple[str, str] | None:
    match = _ENV_LINE.match(line.strip())
    if not match:
        return None
    name, value = match.group(1), match.group(3).strip().strip("'\"")
    if name in ENV_NAMES or name.startswith(ENV_EXTRA_PREFIXES):
        return name, value
    return None


def _add_package(raw: RawReport, tool: str, text: str) -> None:
    """One ``[pip3] name==version`` or ``[conda] name version build channel`` line."""
    text = text.strip()
    if text.lower() in ("could not collect", ""):
        return  # the tool did not run: its packages stay unknown
    book = "conda" if tool == "conda" else "pip"
    packages: dict[str, str] = getattr(raw, book) or {}
    setattr(raw, book, packages)
    if text.lower() == "no relevant packages":
        return
    if book == "pip":
        match = re.match(r"([A-Za-z0-9][\w.\-]*)\s*(?:===?|\s@\s|\s+\(?)\s*([^\s)]*)", text)
        if match:
            packages[versions.package_name(match.group(1))] = match.group(2)
        return
    parts = text.split()
    if len(parts) >= 2:
        name = versions.package_name(parts[0])
        packages[name] = parts[1]
        if len(parts) >= 3:
            raw.conda_builds[name] = parts[2]


def scan(lines: list[str]) -> RawReport:
    """One pass over the lines: fields, multi-line values, sections, packages, messages."""
    raw = RawReport()
    section: str | None = None  # "cpu", "libraries", "env"
    continuation: str | None = None  # field whose value continues on the next lines
    block: list[str] = []

    def flush_block() -> None:
        text = " ".join(part.strip() for part in block if not _CODE_ECHO.match(part)).strip()
        text = text.replace("Collecting environment information...", "").strip()
        if text and (_WARNING.search(text) or recognised(text)):
            raw.messages.append(text)
        block.clear()

    for index, line in enumerate(lines):
        stripped = line.strip()
        if not stripped:
            flush_block()
            continuation = None
            if section == "cpu" and raw.cpu_lines:
                section = None
            continue
        if set(stripped) <= set("=-") and len(stripped) >= 10:  # vLLM-style section rule
            flush_block()
            continue
        header = stripped.lower()
        if (
            header in ("cpu info", "versions of relevant libraries", "environment variables")
            and index > 0
            and set(lines[index - 1].strip()) <= set("=")
        ):
            section = {"cpu info": "cpu", "versions of relevant libraries": "libraries"}.get(
                header, "env"
            )
            raw.fields.setdefault("cpu_section" if section == "cpu" else "libraries_section", "")
            continue
        package = _PACKAGE_LINE.match(stripped)
        if package:
            flush_block()
            _add_package(raw, package.group(1), package.group(2))
            continue
        found = _field_of(line)
        if found and found[0] in ("cpu_section", "libraries_section"):
            flush_block()
            raw.fields.setdefault(found[0], found[1])
            section = "cpu" if found[0] == "cpu_section" else "libraries"
            continuation = None
            if found[1] and section == "cpu":
                raw.cpu_lines.append(found[1])
            continue
        if section == "cpu" and not found:
            raw.cpu_lines.append(stripped)
            continue
        env = _env_of(line)
        if env and not found:
            flush_block()
            raw.env[env[0]] = env[1]
            continue
        if found:
            flush_block()
            section = None
            name, value = found
            if name in raw.fields and name != "ignored":
                continue  # a second report pasted below the first: keep the first
            raw.fields[name] = value
            continuation = name if name in ("gpus", "cudnn") else None
            if name == "gpus" and known(value):
                raw.gpu_lines.append(value)
            elif name == "cudnn" and value and not value.lower().startswith("probably"):
                raw.cudnn_lines.append(value)
            continue
        if continuation == "gpus" and GPU_LINE.match(stripped):
            raw.gpu_lines.append(stripped)
            continue
        if GPU_LINE.match(stripped) and "gpus" not in raw.fields:
            raw.loose_gpu_lines.append(stripped)  # nvidia-smi -L output pasted on its own
            continue
        if continuation == "cudnn" and re.search(r"cudnn", stripped, re.IGNORECASE):
            raw.cudnn_lines.append(stripped)
            continue
        continuation = None
        block.append(stripped)
    flush_block()
    return raw


def known(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in UNKNOWN
