"""Read the text of ``python -m torch.utils.collect_env`` (torch 0.4 to today) into a Snapshot.

Reports pasted into bug threads are cut short, wrapped, edited by hand, carry warning lines
and sometimes extra lines (``CUDA_VISIBLE_DEVICES=2``, an nvidia-smi header). Everything is
read line by line and defensively: what the text does not state stays ``None``.
No torch import here: this runs in a triage bot.
"""

from __future__ import annotations

import ast
import re

from tuneup.doctor.messages import BY_NAME, PIP_REQUEST, recognised
from tuneup.machine.probe.host import parse_nvcc_version
from tuneup.machine.probe.cpu_flags import relevant_flags
from tuneup.doctor.readers.facts import apply_facts, read_facts
from tuneup.doctor.readers.collect_env_lines import (
    GPU_LINE,
    STRONG_FIELDS,
    RawReport,
    clean_lines,
    known,
    scan,
)
from tuneup.machine.snapshot import GPU, Snapshot
from tuneup.machine import versions

# Fields a complete modern report states; missing ones are listed in the notes.
EXPECTED = {
    "torch_version": "PyTorch version",
    "cuda_built": "CUDA used to build PyTorch",
    "os": "OS",
    "python": "Python version",
    "cuda_available": "Is CUDA available",
    "gpus": "GPU models and configuration",
    "driver": "Nvidia driver version",
    "cudnn": "cuDNN version",
    "cpu_section": "CPU",
    "libraries_section": "Versions of relevant libraries",
}
WINDOWS_ARCHITECTURE = {"0": "x86", "5": "arm", "9": "x86_64", "12": "arm64"}
_VERSION = re.compile(r"\d+\.\d+(?:\.\d+)*(?:[\w.+\-]*)")
_VENDOR_NAMES = (
    (
        "nvidia",
        re.compile(
            r"nvidia|geforce|tesla|quadro|titan|\b[rg]tx\b|\b[ahlbt]\d{2,3}\b|nvgpu|orin|xavier"
        ),
    ),
    ("amd", re.compile(r"\bamd\b|radeon|instinct|\bgfx\d|\bmi\d{2,3}")),
    ("intel", re.compile(r"intel|\barc\b")),
)


def _boolean(value: str | None) -> bool | None:
    text = (value or "").strip().lower()
    return {"true": True, "yes": True, "false": False, "no": False}.get(text)


def _first_version(value: str | None) -> str | None:
    if not known(value):
        return None
    match = _VERSION.search(value or "")
    return match.group(0) if match else None


def _driver_branch(raw: RawReport) -> str | None:
    """``Nvidia driver version: 515``: a branch without its minor is still a driver fact."""
    match = re.fullmatch(r"\s*(\d{3})\s*", raw.fields.get("driver") or "")
    return match.group(1) if match and int(match.group(1)) >= 100 else None


def _vendor(name: str) -> str | None:
    lowered = name.lower()
    for vendor, pattern in _VENDOR_NAMES:
        if pattern.search(lowered):
            return vendor
    return None


def _gpus(raw: RawReport, rocm: bool) -> list[GPU] | None:
    value = raw.fields.get("gpus")
    if value is None and not raw.loose_gpu_lines:
        return None
    if value is not None and value.strip().lower() == "no cuda":
        return []
    gpus = []
    for line in raw.gpu_lines if value is not None else raw.loose_gpu_lines:
        if not known(line):
            continue
        match = GPU_LINE.match(line)
        indices = ([int(i) for i in match.group(1).split(",")] if match else [None])
        name = match.group(2) if match else line
        name = re.sub(r"\s*\(UUID:[^)]*\)", "", name).strip()
        arch = re.search(r"\((gfx[0-9a-f]+)[^)]*\)", name)
        if arch:
            name = name[: arch.start()].strip()
        # "GPU n: name" lines come from nvidia-smi -L; ROCm builds print the bare device name
        vendor = _vendor(name) or ("amd" if rocm or arch else "nvidia" if match else None)
        gpus.extend(GPU(index=index, name=name, vendor=vendor, arch=arch.group(1) if arch else None)
                    for index in indices)
    return gpus or None


def _read_cpu(raw: RawReport, snap: Snapshot) -> None:
    pairs: dict[str, str] = {}
    for line in raw.cpu_lines:
        match = re.match(r"([^:=]+?)\s*[:=]\s*(.*)$", line)
        if match:
            pairs.setdefault(match.group(1).strip().lower(), match.group(2).strip())
    cpu = snap.cpu
    cpu.model = pairs.get("model name") or pairs.get("name") or None
    if cpu.model is None and raw.cpu_lines and not re.search(r"[:=]", raw.cpu_lines[0]):
        cpu.model = raw.cpu_lines[0]  # macOS: the brand string alone
    if "flags" in pairs:
        cpu.flags = relevant_flags(pairs["flags"])
    architecture = pairs.get("architecture")
    if architecture:
        cpu.architecture = WINDOWS_ARCHITECTURE.get(architecture, architecture)
    if pairs.get("cpu(s)", "").isdigit():
        cpu.logical_cores = int(pairs["cpu(s)"])


def _read_platform(fields: dict[str, str], snap: Snapshot) -> None:
    plat = snap.platform
    plat.python_version = _first_version(fields.get("python"))
    plat.python_implementation = _implementation(fields.get("python", ""))
    bits = re.search(r"\((\d\d)-bit runtime\)|\b(\d\d) bit \((?:AMD64|Intel|ARM64|ARM)\)",
                     fields.get("python", ""))
    if bits:
        plat.python_bits = int(bits.group(1) or bits.group(2))
    if known(fields.get("os")):
        plat.os = fields["os"]
    python_platform = fields.get("python_platform", "")
    hint = f"{plat.os or ''} {python_platform}".lower()
    if "windows" in hint:
        plat.os_family = "windows"
    elif "macos" in hint or "mac osx" in hint or "darwin" in hint:
        plat.os_family = "darwin"
    elif plat.os or python_platform.lower().startswith("linux"):
        plat.os_family = "linux"
    kernel = re.match(r"Linux-(.+?)-(?:x86_64|aarch64|arm64|ppc64le|s390x|i686)", python_platform)
    if kernel:
        plat.kernel = kernel.group(1)
    if plat.os_family == "linux" and python_platform:
        plat.is_wsl = "microsoft" in python_platform.lower()
    elif plat.os_family in ("windows", "darwin"):
        plat.is_wsl = False
    if known(fields.get("libc")):
        plat.libc = fields["libc"]


def _implementation(python: str) -> str | None:
    """CPython, PyPy, GraalPy...: collect_env's Python line carries ``sys.version``'s brackets."""
    for name in ("PyPy", "GraalPy", "IronPython", "Jython"):
        if name.lower() in python.lower():
            return name
    return "CPython" if re.search(r"\[(?:GCC|MSC|Clang)", python) else None


def _read_torch(raw: RawReport, snap: Snapshot) -> None:
    torch = snap.torch
    fields = raw.fields
    stated = fields.get("torch_version")
    pip_torch = (
        (raw.pip or {}).get("torch")
        or (raw.conda or {}).get("pytorch")
        or (raw.conda or {}).get("torch")
    )
    if stated is not None and stated.strip().upper() == "N/A":
        torch.importable = False
        if pip_torch:  # installed but broken; without a pip line: not installed, or a cut list
            torch.installed, torch.version = True, pip_torch
    else:
        torch.version = _first_version(stated) or pip_torch
        if torch.version:
            torch.installed = True
            torch.importable = True if stated else None
    torch.debug_build = _boolean(fields.get("debug"))
    torch.cuda_available = _boolean(fields.get("cuda_available"))
    if torch.version:
        torch.build, implied = versions.build_from_version(torch.version)
        if torch.build == "cuda":
            torch.cuda = implied
        elif torch.build == "rocm":
            torch.hip = implied
    rocm = fields.get("rocm_built")
    if known(rocm):
        torch.hip, torch.build = rocm, "rocm"
    if known(fields.get("xpu_built")):
        torch.build = torch.build or "xpu"
    cuda = fields.get("cuda_built")
    if cuda is not None and versions.major_minor_text(cuda):
        torch.cuda, torch.build = versions.major_minor_text(cuda), torch.build or "cuda"
        torch.installed = True
    elif (
        cuda is not None
        and cuda.strip().lower() in ("none", "could not collect")
        and torch.installed
    ):
        torch.build = torch.build or "cpu"
    _read_conda_build(raw, snap)


def _read_conda_build(raw: RawReport, snap: Snapshot) -> None:
    """conda's build string says what the version does not (``py3.8_cpu_0``, ``cuda11.8``)."""
    build = raw.conda_builds.get("pytorch", "")
    cuda = re.search(r"cuda(\d+\.\d+)", build)
    if snap.torch.build is None and cuda:
        snap.torch.build = "cuda"
        snap.torch.cuda = snap.torch.cuda or cuda.group(1)
    elif snap.torch.build is None and ("cpu" in build or "cpuonly" in (raw.conda or {})):
        snap.torch.build = "cpu"


def _read_messages(raw: RawReport, snap: Snapshot) -> None:
    """Facts that only warning lines carry (arch list, the driver's CUDA level, init errors)."""
    text = " ".join(" ".join(raw.messages).split())
    snap.messages = raw.messages
    arch = re.search(r"supports CUDA capabilities ((?:(?:sm|compute)_\d+a?\s*)+)", text)
    if arch and snap.torch.arch_list is None:
        snap.torch.arch_list = arch.group(1).split()
    for name, major, minor in re.findall(
        r"(?:UserWarning:\s*)?([\w ()\-]+?) with CUDA capability sm_(\d+?)(\d) is not compatible",
        text,
    ):
        _gpu_capability(snap, name.strip(), f"{major}.{minor}")
    for name, major, minor in re.findall(
        r"Found GPU\d+ (.+?) which is of (?:cuda|compute) capability (?:\(CC\) )?(\d+)\.(\d+)", text
    ):
        _gpu_capability(snap, name.strip(), f"{major}.{minor}")
    too_old = re.search(r"driver on your system is too old \(found version (\d+)\)", text)
    if too_old and snap.driver.cuda_version is None:
        snap.driver.cuda_version = versions.cuda_from_int(int(too_old.group(1)))
    init = re.search(
        r"CUDA initialization: (.+?)(?: \(Triggered internally.*?\))?(?= return |$)", text
    )
    mismatch = re.search(r"cuDNN version incompatibility: .+?\)[^()]*?\(\d+, \d+, \d+\)", text)
    no_driver = re.search(r"Found no NVIDIA driver on your system[^.]*\.", text)
    for hit in (init, mismatch, no_driver):
        if hit and snap.torch.init_error is None:
            snap.torch.init_error = (hit.group(1) if hit is init else hit.group(0)).strip()
    if mismatch:
        found = re.findall(r"\((\d+), (\d+), (\d+)\)", mismatch.group(0))
        if len(found) == 2:
            snap.torch.cudnn_compiled = snap.torch.cudnn_compiled or ".".join(found[0])
            snap.torch.cudnn_runtime = snap.torch.cudnn_runtime or ".".join(found[1])


def _registry_lines(text: str, messages: list[str]) -> list[str]:
    """Lines holding a known message that the warning-line scan did not keep (uv's
    ``DEBUG No compatible version found for: torch``)."""
    found = []
    for name in recognised(text):
        match = BY_NAME[name].pattern.search(text)
        if match is None:
            continue
        start = text.rfind("\n", 0, match.start()) + 1
        end = text.find("\n", match.end())
        line = text[start:end if end >= 0 else len(text)].strip()
        if line and not any(line in kept or kept in line for kept in messages + found):
            found.append(line)
    return found


def _gpu_capability(snap: Snapshot, name: str, capability: str) -> None:
    for gpu in snap.gpus or []:
        if gpu.name and (gpu.name == name or gpu.name.endswith(name) or name.endswith(gpu.name)):
            gpu.compute_capability = gpu.compute_capability or capability
            return
    snap.gpus = (snap.gpus or []) + [
        GPU(name=name, vendor=_vendor(name) or "nvidia", compute_capability=capability)
    ]


def _read_free_text(text: str, snap: Snapshot) -> None:
    """nvidia-smi header and nvcc lines users paste next to the report."""
    smi = re.search(r"NVIDIA-SMI [\d.]+\s+Driver Version:\s*(\d+\.\d+(?:\.\d+)?)", text)
    if smi and snap.driver.version is None:
        snap.driver.version = smi.group(1)
    smi_cuda = re.search(r"Driver Version:\s*[\d.]+\s+CUDA Version:\s*(\d+\.\d+)", text)
    if smi_cuda and snap.driver.cuda_version is None:
        snap.driver.cuda_version = smi_cuda.group(1)
    if snap.cuda_toolkit is None:
        snap.cuda_toolkit = parse_nvcc_version(text)


# "torch 2.1.0+cu121", "torch==2.4.1+rocm6.1", "torch version: 2.10.0+cu128" in prose or a pip line
# that is not in collect_env's form. Only a version with a build suffix counts: the suffix is what
# makes such a mention specific enough to stand for the installed build.
_FREE_TORCH = re.compile(
    r"\btorch(?:\s*==\s*|\s+version\s*[:=]?\s*|\s+|\s*:\s*|-)"  # "torch-2.1.0+cpu": Ultralytics
    r"(\d+\.\d+(?:\.\d+)?(?:\.dev\d+|a0|[a-z]+\d*)?\+(?:cu\d{2,3}|cpu|rocm\d+(?:\.\d+)*))\b",
    re.IGNORECASE,
)


# "No matching distribution found for torch==2.5.1+cu121": what pip was asked for, not what is
# installed (messages.requested_torch reads it as such).
_PIP_REQUEST_BEFORE = re.compile(PIP_REQUEST + r"$", re.IGNORECASE)


def _read_free_torch(text: str, snap: Snapshot) -> None:
    """The torch version a partial paste states in passing, when no collect_env line gives one."""
    if snap.torch.version is not None or snap.torch.importable is False:
        return
    found = {match.group(1) for match in _FREE_TORCH.finditer(text)
             if not _PIP_REQUEST_BEFORE.search(text, 0, match.start())}
    if len(found) != 1:
        return  # none, or several different builds named: not settled
    version = found.pop()
    snap.torch.version, snap.torch.installed = version, True
    snap.torch.build, implied = versions.build_from_version(version)
    if snap.torch.build == "cuda":
        snap.torch.cuda = snap.torch.cuda or implied
    elif snap.torch.build == "rocm":
        snap.torch.hip = snap.torch.hip or implied
    snap.notes.append(f"torch {version}: read from the text, not from a collect_env line")


def _read_libraries(raw: RawReport, snap: Snapshot) -> None:
    fields = raw.fields
    cudnn = [line for line in raw.cudnn_lines if known(line)]
    if cudnn:
        snap.cudnn_libraries = cudnn
        snap.cudnn_versions = versions.distinct_versions(cudnn)
    cuda_cudnn = fields.get("cuda_cudnn", "")
    if known(cuda_cudnn):  # old template: "CUDA/cuDNN version: 10.1/7.6"
        cuda, _, cudnn = cuda_cudnn.partition("/")
        snap.cuda_toolkit = _first_version(cuda)
        if _first_version(cudnn):
            snap.cudnn_libraries = snap.cudnn_libraries or [cudnn.strip()]
            snap.cudnn_versions = snap.cudnn_versions or [_first_version(cudnn) or ""]
    runtime = fields.get("cuda_runtime")
    if runtime is not None and _first_version(runtime):
        snap.cuda_toolkit = _first_version(runtime)
    snap.pip_packages = raw.pip
    snap.conda_packages = raw.conda


def _read_env(raw: RawReport, snap: Snapshot) -> None:
    env = dict(raw.env)
    loading = raw.fields.get("module_loading")
    if known(loading):
        env.setdefault("CUDA_MODULE_LOADING", loading or "")
    alloc = raw.fields.get("alloc_conf")
    if known(alloc):
        try:
            parsed = ast.literal_eval(alloc or "")
        except (ValueError, SyntaxError):
            parsed = alloc
        if isinstance(parsed, dict):
            env.update({str(k): str(v) for k, v in parsed.items()})
        elif parsed:
            env.setdefault("PYTORCH_CUDA_ALLOC_CONF", str(parsed))
    snap.env = env or None


def _notes(raw: RawReport, snap: Snapshot) -> list[str]:
    missing = [label for name, label in EXPECTED.items() if name not in raw.fields]
    notes = []
    if missing:
        notes.append("not in the report: " + ", ".join(missing))
    if snap.torch.importable is False:
        notes.append(
            "collect_env could not import torch (PyTorch version: N/A): build facts unknown"
        )
    if snap.env:
        notes.append("environment variables: only those written in the report are known")
    return notes


def parse_collect_env(text: str, require_evidence: bool = True) -> Snapshot | None:
    """The Snapshot a collect_env text describes; ``None`` if the text is not such a report
    (unless ``require_evidence`` is False: then any text is read for the facts it states)."""
    raw = scan(clean_lines(text))
    strong = STRONG_FIELDS & set(raw.fields)
    snap = Snapshot(source="collect_env")
    _read_free_text(text, snap)
    banner = "Collecting environment information" in text  # collect_env's first line
    evidence = (
        strong or banner or raw.fields.keys() - {"ignored"} or raw.pip is not None
        or raw.conda is not None or snap.driver.version or snap.cuda_toolkit or raw.loose_gpu_lines
        or recognised(text)
    )
    if not evidence and require_evidence:  # a collect_env line, nvidia-smi/nvcc or a known error
        return None
    _read_platform(raw.fields, snap)
    _read_torch(raw, snap)
    _read_free_torch(text, snap)
    snap.driver.version = (_first_version(raw.fields.get("driver")) or _driver_branch(raw)
                           or snap.driver.version)
    snap.gpus = _gpus(raw, rocm=snap.torch.build == "rocm")
    _read_libraries(raw, snap)
    _read_cpu(raw, snap)
    _read_env(raw, snap)
    if not strong:  # a partial paste: a known line the warning scan missed (a full report's
        raw.messages.extend(_registry_lines(text, raw.messages))  # are caught by the scan)
    _read_messages(raw, snap)
    apply_facts(snap, read_facts(text))
    snap.notes = (_notes(raw, snap) if evidence else [NO_REPORT]) + snap.notes
    if not evidence:
        snap.source = "text"  # free text, not a report: "tuneup doctor — a text report"
    return snap


NO_REPORT = ("no collect_env report, nvidia-smi output or known error in the text: only the facts "
             "below were read, everything else could not be checked")
