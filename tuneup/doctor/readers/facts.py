"""The fact reader: known facts wherever they stand in a text, behind the format readers.

People paste what they have: a conda or pip list, what they printed from Python, an installer's
or the container toolkit's error, a sentence ("torch is 2.0.1, cuda is 11.8, RTX 5090"). Each
rule here finds one kind of fact next to the name that owns it, in any text; each fact keeps the
line it was read from, so the report can quote it. A form that can mean two things, or two
different values for one fact, lowers the confidence (the note says so); it never stops the
reading. Versions are parsed by :mod:`tuneup.machine.versions`, never by hand.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tuneup.doctor.messages import SCANNED_CHARS
from tuneup.machine import versions
from tuneup.machine.probe.host import build_day
from tuneup.machine.snapshot import GPU, Snapshot

_VERSION = r"\d+\.\d+(?:\.\d+)*(?:\.?(?:dev|a|b|rc|post)\d*)?(?:\+[\w.]+)?"
# Packages whose list line (pip list / pip freeze / conda list) says something about the build.
_PACKAGES = (r"torch|pytorch|torchvision|torchaudio|pytorch-cuda|pytorch-mutex|cpuonly|cudatoolkit"
             r"|cuda-version|pytorch-triton-rocm|triton|nvidia-[\w-]+")
_PACKAGE_NAME = re.compile(r"^\[?(?:pip\d?|conda)?\]?\s*(?:nvidia-)?(?:nccl|cudnn)\S*\s",
                           re.IGNORECASE)
_PIP_FREEZE = re.compile(rf"^({_PACKAGES})\s*==\s*({_VERSION})\s*$", re.IGNORECASE)
_LIST_LINE = re.compile(  # pip list: name version; conda list: name version build [channel]
    rf"^({_PACKAGES})\s+({_VERSION})(?:\s+(\S+))?(?:\s+(\S+))?\s*$", re.IGNORECASE)
# "torch version is 2.0.1", "PyTorch: 2.7.0.dev...", "torch 2.5.1 from pip"
_TORCH_SAID = re.compile(
    rf"\b(?:py)?torch(?:\s+version)?\s*(?:is|[:=：]|==)?\s*v?({_VERSION})(?![\w.])", re.IGNORECASE)
# A line asking an installer for a version (or its resolver answering) names a request, not
# what is installed: "No matching distribution found for torch==1.13.1",
# "uv pip install torch==2.3.0".
_REQUEST_LINE = re.compile(
    r"\b(?:install|requirement|require|distribution|depends on|no wheels|no version|because)\b",
    re.IGNORECASE)
_PRINTED = {  # what a line printing one of these is followed by, in a REPL or python -c
    "torch.version": re.compile(r"torch\.__version__"),
    "torch.cuda": re.compile(r"torch\.version\.cuda"),
    "torch.hip": re.compile(r"torch\.version\.hip"),
    "cuda_available": re.compile(r"torch\.cuda\.is_available\(\)"),
    "device_count": re.compile(r"torch\.cuda\.device_count\(\)"),
    "capability": re.compile(r"get_device_capability\("),
    "arch_list": re.compile(r"get_arch_list\(\)"),
}
_PROMPT = re.compile(r"^\s*(?:>>>|\.\.\.|In \[\d+\]:|\$|#|\(?[\w.-]+\)?\s*[\w@.:~/\\-]*[$#>])")
_AVAILABLE = re.compile(
    r"\b(?:torch\.)?cuda(?:\.is_available\(\))?\s*(?:is\s+)?(?:available)?\s*(?:[:=]|returns?|->)"
    r"\s*(true|false|yes|no)\b", re.IGNORECASE)
_COUNT = re.compile(r"\b(?:cuda\s+)?(?:device|gpu)\s+count\s*[:=]\s*(\d+)\b", re.IGNORECASE)
_PYTHON = re.compile(
    r"\b(?:c?python)(?:\s+version)?\s*(?:[:=：\-]|is)?\s*(3\.\d{1,2}(?:\.\d+)?)\b"
    r"|\(`cp3(\d{1,2})`\)", re.IGNORECASE)
_DRIVER = re.compile(
    r"\bdriver(?:\s+version)?\s*(?:[:=]|is)?\s*v?"
    r"(\d{3}\.\d{1,3}(?:\.\d{1,3})?|\d{3}(?=\s*(?:max|branch|\)|$)))"
    r"|\b(?:nvidia|driver)\s+(?:driver\s+)?v?(\d{3}\.\d{1,3}(?:\.\d{1,3})?)\b"
    r"|\bnvidia\s+drivers?\s*\(v?(\d{3})\b", re.IGNORECASE)
# "upgraded my driver from 581 to the latest (610)": the driver in use is the later one
_DRIVER_CHANGE = re.compile(
    r"\bdriver\b[^.\n]{0,20}?\bfrom\s+v?\d{3}(?:\.\d+)*\s+to\s+"
    r"(?:the\s+latest\s+)?\(?v?(\d{3}(?:\.\d+)*)",
    re.IGNORECASE)
_DRIVER_CUDA = re.compile(r"\bdriver\s+(1[0-3]\.\d)\b", re.IGNORECASE)  # "Driver 13.0": its CUDA
_GPU_NAMES = re.compile(
    r"\b(?:NVIDIA\s+)?(?:GeForce\s+)?(?:RTX|GTX)\s?\d{3,4}(?:\s?(?:Ti|SUPER|D))*"
    r"(?:\s+Laptop(?:\s+GPU)?)?\b"
    r"|\bNVIDIA\s+(?:RTX\s+)?(?:PRO\s+)?\d{4}\b(?:\s+TI\b)?"
    r"|\bTesla\s+[A-Z]\d+\w*|\bQuadro\s+\w+|\bRTX\s+(?:A\d{4}|\d{4}\s+Ada(?:\s+Generation)?)"
    r"|\b(?:NVIDIA\s+)?(?:GB10|[ABHL]\d{2,3}(?=\s*(?:GPU|PCIe|SXM|NVL|\d+GB)))\b"
    r"|\bRadeon\s+(?:RX\s+)?\w+(?:\s+XTX?)?|\bRX\s?\d{3,4}\s?(?:XTX|XT|S)?\b|\bInstinct\s+MI\d+\w*",
    re.IGNORECASE)
_GFX = re.compile(r"\bgfx(\d{3,4}|\d{2,3}[a-f])\b", re.IGNORECASE)
_HSA_OVERRIDE = re.compile(
    r"HSA_OVERRIDE_GFX_VERSION\W{0,4}(?:to|=|:)?\W{0,4}(\d+\.\d+\.\d+)", re.IGNORECASE)
_PROPERTIES = re.compile(  # print(torch.cuda.get_device_properties(0))
    r"_CudaDeviceProperties\(name='([^']+)', major=(\d+), minor=(\d+)")
_SM_LIST = re.compile(r"\[\s*'sm_\d+'(?:\s*,\s*'(?:sm|compute)_\d+a?')*\s*\]")
_TUPLE = re.compile(r"\((\d{1,2}),\s*(\d)\)")
_CC = re.compile(r"\b(?:compute|cuda) capability(?: \(CC\))?(?: of)?\s*(\d{1,2})\.(\d)\b",
                 re.IGNORECASE)
_OS = re.compile(
    r"\b(?:Windows(?: Server)?\s?(?:1[01]|20\d\d)|win\s?1[01]"
    r"|Ubuntu(?: Server)?\s\d{2}\.\d{2}(?:\.\d+)?(?: LTS)?"
    r"|Debian(?: GNU/Linux)?\s\d+|Fedora\s\d+|Arch Linux"
    r"|macOS(?:\s\d+(?:\.\d+)*)?|Mac\s1\d(?:\.\d+)+"
    r"|WSL2?)\b", re.IGNORECASE)
# An interpreter banner (sys.version, which collect_env's "Python version" prints) carries its
# build date: "3.12.0 | packaged by conda-forge | (main, Oct  3 2023, 08:43:22) [GCC 12.3.0]"
# (the day as C's __DATE__ writes it, for build_day to read).
_PYTHON_BUILT = re.compile(
    r"\b(3\.\d{1,2}\.\d+)\b[^\n]{0,80}?\([^(),\n]{0,60},\s*"
    r"([A-Z][a-z]{2}\s+\d{1,2}\s+\d{4}),\s*\d{1,2}:\d\d:\d\d\)")
_NO_TORCH = re.compile(r"\bNo module named ['\"]?torch['\"]?(?![\w.])")  # torch, not torch._C
# pip building a package in its isolated environment, which never holds the user's torch: a
# missing torch there says nothing of the user's Python (flash-attn's "No module named 'torch'")
_ISOLATED_BUILD = re.compile(
    r"Getting requirements to build|pip-build-env|subprocess-exited-with-error"
    r"|metadata-generation-failed|Preparing metadata \(|egg_info|Building wheels? for",
    re.IGNORECASE)
_NCCL = re.compile(r"\bNCCL(?:\s+version)?\s*[:=]?\s*v?(2\.\d+\.\d+)\b", re.IGNORECASE)
_CUDNN = re.compile(r"\bcuDNN(?:\s+version)?\s*(?:is\s+|[:=]\s*)?v?(\d{1,2}\.\d+(?:\.\d+)*)\b",
                    re.IGNORECASE)
_CPU_BUILD = re.compile(  # "installed the CPU version of torch", "torch ... is the cpu build"
    r"\bcpu[- ](?:only )?(?:versions?|builds?|wheels?) of (?:py)?torch"
    r"|\b(?:py)?torch\b[^.\n]{0,30}\bcpu[- ](?:only |version|build|wheel)", re.IGNORECASE)
_TOOLKIT = re.compile(r"\bcuda(?:\s+toolkit)?\s*(?:version\s+)?(?:is\s+)?v?(1\d\.\d)\b",
                      re.IGNORECASE)
_REQUESTED = re.compile(r"\btorch==(\d+\.\d+(?:\.\d+)?)")
_INDEX = re.compile(r"/whl/(?:nightly/|test/)?(cu\d{2,3}|cpu|rocm\d+(?:\.\d+)*)\b")
_INSTALL = re.compile(r"\b(?:pip3?|uv(?:\s+pip)?|conda|mamba)\s+(?:install|add)\b", re.IGNORECASE)
_MIG_DEVICE = re.compile(r"^MIG\s+\d+g\.\d+gb\s+Device\s+\d+", re.IGNORECASE)
_NO_GPU_SAID = re.compile(
    r"\b(?:no (?:nvidia |cuda )?gpu(?! is| was| found| detected| available)"
    r"|without (?:a |an )?(?:nvidia )?gpu|cpu[- ]only (?:machine|server|host|laptop)"
    r"|does(?:n't| not) have (?:a |an )?(?:nvidia )?gpu)",
    re.IGNORECASE)


@dataclass(frozen=True)
class Fact:
    """One fact, where it was read, and whether the form was unambiguous."""

    name: str
    value: str
    line: str
    sure: bool = True


def read_facts(text: str) -> list[Fact]:
    """Every known fact in ``text``, in the order its lines hold them (of a long text its first
    and last :data:`SCANNED_CHARS`, as the message registry reads it: a paste's facts are there)."""
    if len(text) > 2 * SCANNED_CHARS:
        text = text[:SCANNED_CHARS] + "\n" + text[-SCANNED_CHARS:]
    lines = [_plain(line) for line in text.splitlines()]
    isolated = _ISOLATED_BUILD.search(text) is not None
    facts: list[Fact] = []
    mig = [line for line in lines if _MIG_DEVICE.match(line)]
    if mig:  # collect_env lists MIG instances under their GPU: "MIG 3g.40gb Device 0:"
        facts.append(Fact("mig.devices", str(len(mig)), mig[0]))
    for number, line in enumerate(lines):
        if not line:
            continue
        facts.extend(_package_facts(line))
        facts.extend(_printed_facts(line, lines[number + 1:number + 3]))
        facts.extend(f for f in _named_facts(line)
                     if not (isolated and f.name == "torch.importable"))
    return facts


def apply_facts(snap: Snapshot, facts: list[Fact]) -> None:
    """Fill what the format readers left unknown, each fact noted with the line it came from."""
    used: list[Fact] = []
    names = list(dict.fromkeys(fact.name for fact in facts))
    # python.built is set only for the interpreter python_version names, and a missing torch
    # only where no version is named: settle those first
    for name in sorted(names, key=lambda name: (name == "python.built",
                                                name == "torch.importable")):
        found = [fact for fact in facts if fact.name == name]
        values = list(dict.fromkeys(fact.value for fact in found))
        fact = found[0] if len(values) == 1 else Fact(name, values[0], found[0].line, sure=False)
        if _SETTERS[name](snap, fact, values):
            used.append(fact)
        elif len(values) > 1 and name == "torch.version" and snap.torch.version is None:
            snap.notes.append(f"the text names several values of {name} ({', '.join(values[:4])}):"
                              " not settled")
    for fact in sorted(used, key=lambda fact: names.index(fact.name)):
        doubt = "" if fact.sure else " (the text is not unambiguous here)"
        snap.notes.append(f"read from the text: {fact.name} = {fact.value}{doubt}, "
                          f"from '{_quote(fact.line)}'")


def unsure_fact(snap: Snapshot, name: str) -> str | None:
    """The line an ambiguous fact ``name`` was read from (rules make a guess of it a warning)."""
    for value, line, sure in _noted(snap, name):
        if not sure:
            return line
    return None


def noted_value(snap: Snapshot, name: str) -> str | None:
    """The value the fact reader noted for ``name`` (e.g. ``install.torch``: what an install
    command asked for), or None."""
    return next((value for value, _, _ in _noted(snap, name)), None)


def _noted(snap: Snapshot, name: str) -> list[tuple[str, str, bool]]:
    prefix = f"read from the text: {name} = "
    found = []
    for note in snap.notes:
        if note.startswith(prefix):
            value, _, line = note[len(prefix):].partition(", from ")
            sure = "(the text is not unambiguous here)" not in value
            found.append((value.replace(" (the text is not unambiguous here)", ""), line, sure))
    return found


def says_no_gpu(text: str) -> bool:
    """The text states that the machine has no (NVIDIA) GPU."""
    return bool(_NO_GPU_SAID.search(text))


def _plain(line: str) -> str:
    line = re.sub(r"^(?:>\s?)+|^\s*[-*\u2022]\s+|`|\*\*", "", line.rstrip())
    return line.strip()


def _quote(line: str, limit: int = 100) -> str:
    return line if len(line) <= limit else line[:limit - 1] + "…"


def _package_facts(line: str) -> list[Fact]:
    freeze = _PIP_FREEZE.match(line)
    if freeze:
        return [Fact("pip", f"{freeze.group(1).lower()}=={freeze.group(2)}", line)]
    listed = _LIST_LINE.match(line)
    if not listed:
        return []
    name, version, build, channel = listed.groups()
    if build and (channel or re.search(r"_|cpu|cuda|pypi", build)):
        return [Fact("conda", f"{name.lower()}=={version}={build}", line)]
    return [] if build else [Fact("pip", f"{name.lower()}=={version}", line)]


def _printed_facts(line: str, following: list[str]) -> list[Fact]:
    """``>>> torch.__version__`` / ``python -c "print(torch.version.cuda)"`` and the output below
    (``print(a, b, c)`` printing three values on one line is read value by value)."""
    following = [re.sub(r"^Out\[\d+\]:\s*", "", o) for o in following]
    several = _several_printed(line, following)
    if several:
        return several
    facts = []
    for name, pattern in _PRINTED.items():
        if not pattern.search(line):
            continue
        after = line[pattern.search(line).end():]
        inline = re.search(r"(?:[:=]|->)\s*(.+)$", after)
        output = inline.group(1) if inline and not after.strip().startswith(")") else None
        if output is None:
            output = next((o for o in following if o and not _PROMPT.match(o)), None)
        value = _printed_value(name, (output or "").strip().strip("'\""))
        if value:
            facts.append(Fact(name, value, f"{line} → {output.strip()}" if output else line))
    return facts


def _several_printed(line: str, following: list[str]) -> list[Fact]:
    call = re.search(r"print\((.+)\)", line)
    if call is None or "," not in call.group(1):
        return []
    names = []
    for argument in call.group(1).split(","):
        name = next((n for n, p in _PRINTED.items() if p.search(argument)), None)
        if name is None:
            return []  # something else is printed too: which value is which is not certain
        names.append(name)
    output = next((o for o in following if o and not _PROMPT.match(o)), "")
    values = output.split()
    if len(values) != len(names):
        return []
    facts = []
    for name, raw in zip(names, values):
        value = _printed_value(name, raw.strip("'\",()"))
        if value:
            facts.append(Fact(name, value, f"{line} → {output}"))
    return facts


def _printed_value(name: str, output: str) -> str | None:
    if name in ("torch.version", "torch.cuda", "torch.hip"):
        if name != "torch.version" and output.lower() == "none":
            return "None"
        match = re.match(_VERSION, output)
        return match.group(0) if match else None
    if name == "cuda_available":
        return output.capitalize() if output.lower() in ("true", "false") else None
    if name == "device_count":
        return output if output.isdigit() else None
    if name == "capability":
        match = _TUPLE.search(output)
        return f"{match.group(1)}.{match.group(2)}" if match else None
    match = _SM_LIST.search(output)
    return " ".join(re.findall(r"(?:sm|compute)_\d+a?", match.group(0))) if match else None


def _named_facts(line: str) -> list[Fact]:
    facts = []
    said = () if _REQUEST_LINE.search(line) else ((_TORCH_SAID, "torch.version", 1),)
    for pattern, name, group in (*said, (_GFX, "gfx", 1),
                                 (_HSA_OVERRIDE, "HSA_OVERRIDE_GFX_VERSION", 1)):
        facts.extend(Fact(name, ("gfx" if name == "gfx" else "") + m.group(group).lower(), line)
                     for m in pattern.finditer(line))
    python = _PYTHON.search(line)
    if python and "wheels" not in line.lower():  # "only has wheels for cp38": not the interpreter
        facts.append(Fact("python", python.group(1) or f"3.{python.group(2)}", line))
    built = _PYTHON_BUILT.search(line)
    day = build_day(built.group(2)) if built else None
    if built and day:  # "3.12.0 2023-10-03": the interpreter and the day it was built
        facts.append(Fact("python.built", f"{built.group(1)} {day}", line))
    upgraded = _DRIVER_CHANGE.search(line)
    driver = _DRIVER.search(line) if upgraded is None else None
    if upgraded:
        facts.append(Fact("driver", upgraded.group(1), line, sure=False))
    if driver and "cuda version" not in line.lower().split("driver")[0][-20:]:
        facts.append(Fact("driver", next(g for g in driver.groups() if g), line))
    elif _DRIVER_CUDA.search(line):
        facts.append(Fact("driver.cuda", _DRIVER_CUDA.search(line).group(1), line, sure=False))
    properties = _PROPERTIES.search(line)
    if properties:
        facts.append(Fact("gpu", properties.group(1), line))
        facts.append(Fact("capability", f"{properties.group(2)}.{properties.group(3)}", line))
    else:
        facts.extend(Fact("gpu", " ".join(m.group(0).split()), line)
                     for m in _GPU_NAMES.finditer(line))
    for pattern in (_AVAILABLE, _COUNT, _CC, _SM_LIST):
        match = pattern.search(line)
        if match is None:
            continue
        if pattern is _AVAILABLE:
            facts.append(Fact("cuda_available", "True" if match.group(1).lower() in ("true", "yes")
                              else "False", line))
        elif pattern is _COUNT:
            facts.append(Fact("device_count", match.group(1), line))
        elif pattern is _CC:
            facts.append(Fact("capability", f"{match.group(1)}.{match.group(2)}", line))
        else:
            facts.append(Fact("arch_list", " ".join(re.findall(r"(?:sm|compute)_\d+a?",
                                                                 match.group(0))), line))
    for pattern, name in ((_NCCL, "nccl"), (_CUDNN, "cudnn")):
        match = pattern.search(line)
        if match and not _PACKAGE_NAME.match(line):  # a pip/conda line is read as a package
            facts.append(Fact(name, match.group(1), line))
    system = _OS.search(line)
    if system:
        facts.append(Fact("os", " ".join(system.group(0).split()), line))
    if _NO_GPU_SAID.search(line):
        facts.append(Fact("machine.gpu", "none", line, sure=False))
    if _CPU_BUILD.search(line):
        facts.append(Fact("torch.build", "cpu", line, sure=False))
    if _NO_TORCH.search(line):
        facts.append(Fact("torch.importable", "False", line))
    toolkit = _TOOLKIT.search(line)
    if toolkit and not _DRIVER.search(line):
        facts.append(Fact("cuda_toolkit", toolkit.group(1), line, sure=False))
    if _INSTALL.search(line) and _REQUESTED.search(line):
        facts.append(Fact("install.torch", _REQUESTED.search(line).group(1), line))
    if _INSTALL.search(line) and _INDEX.search(line):
        facts.append(Fact("install.index", _INDEX.search(line).group(1), line, sure=False))
    return facts


# -- applying facts: each setter fills only what is still unknown, True when it did ----------


def _set_torch_version(snap: Snapshot, fact: Fact, values: list[str]) -> bool:
    if snap.torch.version is not None or snap.torch.importable is False or len(values) > 1:
        return False  # "tried 2.6.0+cu124, then 2.7.1+cu128": which one is installed is unknown
    version = values[0] if versions.parse(values[0]) else None
    if version is None:
        return False
    snap.torch.version, snap.torch.installed = version, True
    build, implied = versions.build_from_version(version)
    if build:
        snap.torch.build = snap.torch.build or build
        if build == "cuda":
            snap.torch.cuda = snap.torch.cuda or implied
        elif build == "rocm":
            snap.torch.hip = snap.torch.hip or implied
    return True


def _set_packages(snap: Snapshot, fact: Fact, values: list[str], tool: str) -> bool:
    packages = {}
    builds = {}
    for value in values:
        name, _, rest = value.partition("==")
        version, _, build = rest.partition("=")
        packages.setdefault(versions.package_name(name), version)
        builds.setdefault(versions.package_name(name), build)
    target = "pip_packages" if tool == "pip" else "conda_packages"
    current = getattr(snap, target)
    if current is not None:
        return False
    setattr(snap, target, packages)
    torch = packages.get("torch") or packages.get("pytorch")
    if torch and snap.torch.version is None:
        _set_torch_version(snap, fact, [torch])
    build = builds.get("pytorch") or builds.get("torch") or ""
    if snap.torch.build is None or (snap.torch.build == "cuda" and not snap.torch.cuda):
        # pytorch channel: py3.10_cuda12.1_cudnn8.9.2_0; conda-forge: cuda126_generic_py312_...
        cuda = re.search(r"cuda(\d+\.\d+)", build)
        forge = re.search(r"cuda(\d{3})(?=_|$)", build)
        if cuda or forge:
            found = cuda.group(1) if cuda else versions.cuda_from_tag(f"cu{forge.group(1)}")
            snap.torch.build, snap.torch.cuda = "cuda", found
        elif "cpu" in build or "cpuonly" in packages or builds.get("pytorch-mutex") == "cpu":
            snap.torch.build = "cpu"
    return True


def _set_python(snap: Snapshot, fact: Fact, values: list[str]) -> bool:
    if snap.platform.python_version is not None:
        return False
    snap.platform.python_version = values[0]
    return True


def _set_os(snap: Snapshot, fact: Fact, values: list[str]) -> bool:
    plat = snap.platform
    if plat.os_family is not None or plat.os is not None:
        return False
    families = {"windows" if v.lower().startswith("win") else
                "darwin" if v.lower().startswith("mac") else "linux" for v in values}
    if len(families) != 1:
        return False  # "moved from Windows 10 to Ubuntu 22.04": not settled
    plat.os, plat.os_family = values[0], families.pop()
    if values[0].upper().startswith("WSL"):
        plat.is_wsl = True
    return True


def _set_driver(snap: Snapshot, fact: Fact, values: list[str]) -> bool:
    if snap.driver.version is not None:
        return False
    snap.driver.version = values[0]
    return True


def _set_driver_cuda(snap: Snapshot, fact: Fact, values: list[str]) -> bool:
    if snap.driver.cuda_version is not None:
        return False
    snap.driver.cuda_version = values[0]
    return True


def _set_gpus(snap: Snapshot, fact: Fact, values: list[str]) -> bool:
    if snap.gpus is not None:
        return False
    names = [v for v in values if not any(v != o and v.lower() in o.lower() for o in values)]
    amd = re.compile(r"radeon|\brx\b|instinct", re.IGNORECASE)
    snap.gpus = [GPU(index=i, name=name, vendor="amd" if amd.search(name) else "nvidia")
                 for i, name in enumerate(names)]
    return True


def _set_gfx(snap: Snapshot, fact: Fact, values: list[str]) -> bool:
    gpus = [gpu for gpu in snap.gpus or [] if gpu.vendor in ("amd", None) and gpu.arch is None]
    if len(values) != 1 and not gpus:
        return False  # several targets named, no GPU to pin them to: not settled
    if gpus:
        for gpu in gpus:
            gpu.arch, gpu.vendor = values[0], "amd"
    elif not any(gpu.vendor == "amd" for gpu in snap.gpus or []):
        snap.gpus = (snap.gpus or []) + [GPU(index=len(snap.gpus or []), name=values[0],
                                             vendor="amd", arch=values[0])]
    return True


def _set_env(name: str):
    def setter(snap: Snapshot, fact: Fact, values: list[str]) -> bool:
        if (snap.env or {}).get(name) is not None:
            return False
        snap.env = {**(snap.env or {}), name: values[0]}
        return True
    return setter


def _set_available(snap: Snapshot, fact: Fact, values: list[str]) -> bool:
    if snap.torch.cuda_available is not None or len(values) != 1:
        return False
    snap.torch.cuda_available = values[0] == "True"
    return True


def _set_count(snap: Snapshot, fact: Fact, values: list[str]) -> bool:
    if snap.torch.device_count is not None or len(values) != 1:
        return False
    snap.torch.device_count = int(values[0])
    if snap.torch.device_count == 0 and snap.torch.cuda_available is None:
        snap.torch.cuda_available = False
    return True


def _set_torch_cuda(snap: Snapshot, fact: Fact, values: list[str]) -> bool:
    if snap.torch.build is not None and snap.torch.build != "cuda" or snap.torch.cuda:
        return False
    if values[0] == "None":
        snap.torch.build = snap.torch.build or ("cpu" if snap.torch.hip is None else "rocm")
    else:
        snap.torch.build, snap.torch.cuda = "cuda", versions.major_minor_text(values[0])
    return True


def _set_hip(snap: Snapshot, fact: Fact, values: list[str]) -> bool:
    if snap.torch.hip or values[0] == "None":
        return False
    snap.torch.hip, snap.torch.build = versions.major_minor_text(values[0]), "rocm"
    return True


def _set_capability(snap: Snapshot, fact: Fact, values: list[str]) -> bool:
    nvidia = [gpu for gpu in snap.gpus or [] if gpu.vendor != "amd"]
    if len(values) != 1 or len(nvidia) > 1 or any(g.vendor == "amd" for g in snap.gpus or []):
        return False  # an AMD GPU's (10, 3) is its gfx, not a CUDA capability
    if nvidia:
        nvidia[0].compute_capability = nvidia[0].compute_capability or values[0]
    else:
        snap.gpus = [GPU(index=0, vendor="nvidia", compute_capability=values[0])]
    return True


def _set_arch_list(snap: Snapshot, fact: Fact, values: list[str]) -> bool:
    if snap.torch.arch_list is not None or len(values) != 1:
        return False
    snap.torch.arch_list = values[0].split()
    return True


def _set_build(snap: Snapshot, fact: Fact, values: list[str]) -> bool:
    if snap.torch.build is not None or len(values) != 1:
        return False
    snap.torch.build = values[0]
    return True


def _set_toolkit(snap: Snapshot, fact: Fact, values: list[str]) -> bool:
    if snap.cuda_toolkit is not None or len(values) != 1:
        return False
    snap.cuda_toolkit = values[0]
    return True


def _set_nccl(snap: Snapshot, fact: Fact, values: list[str]) -> bool:
    """``NCCL version 2.19.3`` as torch's distributed errors print it: the NCCL torch loaded."""
    if snap.torch.nccl is not None or len(values) != 1:
        return False
    snap.torch.nccl = values[0]
    return True


def _set_cudnn(snap: Snapshot, fact: Fact, values: list[str]) -> bool:
    if snap.cudnn_versions is not None:
        return False
    snap.cudnn_versions = values
    return True


def _set_python_built(snap: Snapshot, fact: Fact, values: list[str]) -> bool:
    """Set only where torch is missing: the Python rule then dates the interpreter against
    the first torch release with wheels for it (elsewhere the date says nothing). The banner's
    version must be the interpreter's: a date of another Python dates nothing here. A text
    that names no other interpreter (``print(sys.version)`` alone) is the banner's."""
    plat, torch = snap.platform, snap.torch
    if len(values) != 1 or (torch.importable is not False and torch.installed is not False):
        return False
    version, _, day = values[0].partition(" ")
    if plat.python_built is not None or version != (plat.python_version or version):
        return False
    plat.python_version, plat.python_built = version, day
    return True


def _set_not_importable(snap: Snapshot, fact: Fact, values: list[str]) -> bool:
    """``No module named 'torch'``: that interpreter has no torch (unless the text names
    the version it imported)."""
    if snap.torch.version is not None or snap.torch.importable is not None:
        return False
    snap.torch.importable = False
    return True


def _set_nothing(snap: Snapshot, fact: Fact, values: list[str]) -> bool:
    return True  # known and quoted (an install command asks for an index), not a build fact


_SETTERS = {
    "torch.version": _set_torch_version,
    "pip": lambda snap, fact, values: _set_packages(snap, fact, values, "pip"),
    "conda": lambda snap, fact, values: _set_packages(snap, fact, values, "conda"),
    "python": _set_python,
    "os": _set_os,
    "driver": _set_driver,
    "driver.cuda": _set_driver_cuda,
    "gpu": _set_gpus,
    "gfx": _set_gfx,
    "HSA_OVERRIDE_GFX_VERSION": _set_env("HSA_OVERRIDE_GFX_VERSION"),
    "cuda_available": _set_available,
    "device_count": _set_count,
    "torch.cuda": _set_torch_cuda,
    "torch.hip": _set_hip,
    "capability": _set_capability,
    "arch_list": _set_arch_list,
    "torch.build": _set_build,
    "torch.importable": _set_not_importable,
    "cuda_toolkit": _set_toolkit,
    "nccl": _set_nccl,
    "cudnn": _set_cudnn,
    "install.index": _set_nothing,
    "python.built": _set_python_built,
    "install.torch": _set_nothing,
    "machine.gpu": _set_nothing,
    "mig.devices": _set_nothing,
}
