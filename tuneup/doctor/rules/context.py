"""What every rule needs: the snapshot, facts derived from it once, and the outcome collector."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property

from tuneup.doctor import knowledge as kb
from tuneup.doctor import messages
from tuneup.doctor.findings import Finding, finding
from tuneup.doctor.readers.facts import unsure_fact
from tuneup.machine.snapshot import GPU, Snapshot
from tuneup.machine import versions

AMD_NAME = re.compile(r"\b(amd|radeon|instinct|mi\d{2,3}x?|gfx\d+)\b", re.IGNORECASE)
NVIDIA_NAME = re.compile(r"\b(nvidia|geforce|quadro|tesla|titan|rtx|gtx|jetson)\b", re.IGNORECASE)
DRIVER_CUDA_MESSAGE = re.compile(r"driver on your system is too old \(found version (\d{4,6})\)")
CAPABILITY_WARNINGS = (  # torch's warnings name the GPU and its CC even when the GPU list is cut off
    re.compile(
        r"^\s*(?P<name>\S.*?) with CUDA capability sm_(?P<major>\d+?)(?P<minor>\d) is not compatible",
        re.MULTILINE,
    ),
    re.compile(
        r"Found GPU\d+ (?P<name>.+?) which is of (?:cuda|compute) capability (?:\(CC\) )?"
        r"(?P<major>\d+)\.(?P<minor>\d+)"
    ),
)


def _line_around(text: str, match: re.Match[str]) -> str:
    """The matched text, widened to its line when that line is short (the whole message)."""
    start = text.rfind("\n", 0, match.start()) + 1
    end = text.find("\n", match.end())
    line = text[start:end if end >= 0 else len(text)]
    return line if len(line) <= 200 else match.group(0)


EXPLAINED_BY = {
    "no-gpu-visible": ("driver-too-old", "cpu-only-build", "rocm-build", "arch-unsupported"),
}


@dataclass
class Diagnosis:
    """Everything the rules concluded: findings, checks that passed, checks that could not run."""

    findings: list[Finding] = field(default_factory=list)
    passed: list[tuple[str, str]] = field(default_factory=list)  # (area, what was fine)
    unchecked: list[tuple[str, str]] = field(default_factory=list)  # (area, why not)

    @property
    def errors(self) -> int:
        return sum(f.severity == "error" for f in self.findings)

    @property
    def warnings(self) -> int:
        return sum(f.severity == "warning" for f in self.findings)


@dataclass(frozen=True)
class GpuFact:
    """One GPU with its vendor and compute capability settled (from the probe or the tables)."""

    name: str
    vendor: str | None  # "nvidia", "amd", None
    cc: str | None
    raw: GPU
    # where cc came from, for messages: "report", "table" or "family fallback (<series>)"
    cc_basis: str = "report"

    @property
    def cc_guessed(self) -> bool:
        """The CC comes from the GPU's series, not its model: findings on it only warn."""
        return self.cc_basis.startswith("family fallback")

    @property
    def cc_note(self) -> str:
        """Said after the CC in a message when it was guessed."""
        return f", guessed from its series by the {self.cc_basis}" if self.cc_guessed else ""


@dataclass(frozen=True)
class Build:
    """The torch build the rules judge: installed, or the one the user asked about."""

    version: str | None
    release: kb.Release | None
    kind: str | None  # "cuda", "cpu", "rocm", "xpu", None = unknown
    cuda: str | None  # "12.1"
    variant: str | None  # "cu121"
    basis: str  # how the kind/CUDA was learned, for messages
    assumed: bool  # kind comes from the default-wheel assumption, not from the build itself
    requested: bool  # from --torch rather than the installed torch

    @property
    def base_version(self) -> str | None:
        return versions.base(self.version)

    @property
    def cuda_major(self) -> int | None:
        mm = versions.major_minor(self.cuda)
        return mm[0] if mm else None

    @property
    def is_dev(self) -> bool:
        return bool(self.version and versions.is_dev(self.version))

    @property
    def is_published_wheel(self) -> bool:
        """A release wheel from PyPI/download.pytorch.org (not a nightly, source or vendor build)."""
        return bool(self.version) and not versions.is_custom_build(self.version or "")

    @property
    def label(self) -> str:
        return f"torch {self.version}" if self.version else "torch"


class Context:
    """Rules read facts from here and record their outcome with :meth:`add`, :meth:`ok`, :meth:`skip`."""

    def __init__(
        self,
        snapshot: Snapshot,
        requested_torch: str | None = None,
        requested_python: str | None = None,
    ) -> None:
        self.snap = snapshot
        self.requested_torch = requested_torch
        self.requested_python = requested_python
        self.diagnosis = Diagnosis()
        self.settled: set[str] = set()  # categories a rule proved fine from facts (see pasted)

    # -- outcome --------------------------------------------------------------------

    def add(self, code: str, severity: str, message: str, fix: str = "") -> None:
        new = finding(code, severity, message, fix)
        if new not in self.diagnosis.findings:  # identical GPUs give identical findings
            self.diagnosis.findings.append(new)

    def ok(self, area: str, text: str) -> None:
        if (area, text) not in self.diagnosis.passed:
            self.diagnosis.passed.append((area, text))

    def skip(self, area: str, text: str) -> None:
        if (area, text) not in self.diagnosis.unchecked:
            self.diagnosis.unchecked.append((area, text))

    def has(self, category: str) -> bool:
        return any(f.category == category for f in self.diagnosis.findings)

    # -- platform -------------------------------------------------------------------

    @cached_property
    def os_family(self) -> str | None:
        platform = self.snap.platform
        if platform.os_family:
            return platform.os_family
        text = f"{platform.os or ''} {platform.kernel or ''}".lower()
        if "windows" in text:
            return "windows"
        if "darwin" in text or "macos" in text or "mac os" in text:
            return "darwin"
        if text.strip():
            return "linux"
        return None

    @cached_property
    def driver_os(self) -> str | None:
        """Whose driver numbering applies: under WSL the driver is the Windows one."""
        platform = self.snap.platform
        kernel = f"{platform.kernel or ''} {platform.os or ''}".lower()
        if platform.is_wsl or "microsoft" in kernel or "wsl" in kernel:
            return "windows"
        return self.os_family

    @property
    def python(self) -> str | None:
        return self.requested_python or self.snap.platform.python_version

    def env(self, name: str) -> str | None:
        return (self.snap.env or {}).get(name)

    @cached_property
    def all_messages(self) -> str:
        parts = list(self.snap.messages)
        if self.snap.torch.init_error:
            parts.append(self.snap.torch.init_error)
        return "\n".join(parts)

    @cached_property
    def pasted_messages(self) -> list[tuple[messages.Message, str]]:
        """Each known message in the pasted text, with the text it matched, in registry order
        (the curated texts before the bare CUDA codes)."""
        found = []
        for message in messages.MESSAGES:
            match = message.pattern.search(self.all_messages)
            if match:
                found.append((message, _line_around(self.all_messages, match)))
        return found

    def explained(self, category: str) -> bool:
        """Another fault accounts for ``category``'s symptom (torch seeing no usable GPU is
        the symptom of a driver too old, a CPU or ROCm build, or no kernels): a finding of
        that fault, or a pasted message placing it there."""
        return any(self.has(cause) or self.message_says(cause)
                   for cause in EXPLAINED_BY.get(category, ()))

    def message_says(self, category: str) -> bool:
        """A pasted message places the fault in ``category`` (a rule that would otherwise call
        the failure unexplained defers to it)."""
        return any(message.category == category for message, _ in self.pasted_messages)

    # -- GPUs and driver ----------------------------------------------------------

    @cached_property
    def gpus(self) -> list[GpuFact]:
        facts = []
        for gpu in self.snap.gpus or []:
            name = gpu.name or ""
            vendor = gpu.vendor
            if vendor is None and AMD_NAME.search(name):
                vendor = "amd"
            elif vendor is None and (NVIDIA_NAME.search(name) or gpu.compute_capability):
                vendor = "nvidia"
            cc, basis = gpu.compute_capability, "report"
            known = kb.gpu_lookup(name) if cc is None and vendor != "amd" else None
            if known is not None:
                cc = known.cc
                basis = f"family fallback ({known.family})" if known.fallback else "table"
                if vendor is None:
                    vendor = "nvidia"  # the GPU tables hold NVIDIA products only
            facts.append(GpuFact(name or "unnamed GPU", vendor, cc, gpu, basis))
        if not facts:
            for pattern in CAPABILITY_WARNINGS:
                for match in pattern.finditer(self.all_messages):
                    name, cc = (
                        match.group("name"),
                        f"{int(match.group('major'))}.{match.group('minor')}",
                    )
                    if all(f.name != name for f in facts):
                        facts.append(GpuFact(name, "nvidia", cc, GPU(name=name)))
        return facts

    @property
    def nvidia_gpus(self) -> list[GpuFact]:
        return [g for g in self.gpus if g.vendor == "nvidia"]

    @property
    def amd_gpus(self) -> list[GpuFact]:
        return [g for g in self.gpus if g.vendor == "amd"]

    def cuda_wheels(self, library: str) -> dict[int, tuple[str, str]]:
        """CUDA major -> (name, version) of each installed ``nvidia-<library>-cuXX`` wheel."""
        pattern = re.compile(rf"nvidia-{library}-cu(\d+)$")
        return {int(match.group(1)): (name, version)
                for name, version in (self.snap.pip_packages or {}).items()
                if (match := pattern.match(name))}

    @property
    def nvidia_present(self) -> bool:
        driver = self.snap.driver
        return bool(self.nvidia_gpus or driver.version or driver.proc_version)

    @cached_property
    def driver_max_cuda(self) -> tuple[str, str] | None:
        """(highest CUDA the driver runs, how that is known), or None."""
        driver = self.snap.driver
        match = DRIVER_CUDA_MESSAGE.search(self.all_messages)
        if match:
            number = int(match.group(1))
            cuda = f"{number // 1000}.{number % 1000 // 10}"
            return cuda, f"torch printed 'found version {number}'"
        if driver.cuda_version:
            return versions.major_minor_text(driver.cuda_version), "the driver reports it"
        if driver.version:
            cuda = kb.max_cuda_for_driver(driver.version, self.driver_os)
            if cuda:
                return cuda, f"driver {driver.version} shipped with CUDA {cuda}"
        return None

    def driver_runs(self, cuda: str) -> bool | None:
        """Whether the driver runs a CUDA ``cuda`` runtime (minor-version compatibility counted)."""
        need = kb.driver_requirement(cuda, self.driver_os)
        if need is None:
            return None
        driver = versions.release(self.snap.driver.version)
        floor = versions.release(need.floor_driver)
        if driver is not None and floor is not None:
            if len(driver) == 1:  # a branch ("515"): the floor's own branch leaves it open
                return None if driver[0] == floor[0] else driver[0] > floor[0]
            return driver >= floor
        known = self.driver_max_cuda
        if known is None:
            return None
        have, want = versions.major_minor(known[0]), versions.major_minor(need.cuda)
        if need.minor_version_compat:
            return have[0] >= want[0]
        return have >= want

    # -- the torch build ------------------------------------------------------------

    @cached_property
    def build(self) -> Build:
        if self.requested_torch:
            return self._resolve(self.requested_torch, requested=True)
        torch = self.snap.torch
        version = torch.version
        if version is None:
            version = (self.snap.pip_packages or {}).get("torch")
        if version is None:
            version = (self.snap.conda_packages or {}).get("pytorch")
        return self._resolve(version, requested=False)

    def _resolve(self, version: str | None, requested: bool) -> Build:
        torch = self.snap.torch
        release = kb.torch_release(version) if version else None
        local = versions.local(version)

        def make(kind: str | None, cuda: str | None, basis: str, assumed: bool = False) -> Build:
            variant = versions.cuda_tag(cuda) if cuda else None
            return Build(version, release, kind, cuda, variant, basis, assumed, requested)

        if local.startswith("cu") and versions.cuda_from_tag(local):
            return make("cuda", versions.cuda_from_tag(local), f"the +{local} suffix")
        if local == "cpu":
            return make("cpu", None, "the +cpu suffix")
        if local.startswith("rocm"):
            return make("rocm", None, f"the +{local} suffix")
        if not requested:
            if torch.hip or torch.build == "rocm":
                return make("rocm", None, "torch.version.hip")
            if torch.cuda:
                return make("cuda", versions.major_minor_text(torch.cuda), "torch.version.cuda")
            prose = unsure_fact(self.snap, "torch.build")
            if torch.build in ("cpu", "xpu") and prose:
                return make(torch.build, None, f"the text says so: {prose}", assumed=True)
            if torch.build in ("cpu", "xpu"):
                return make(torch.build, None, "the report (CUDA used to build PyTorch: none)")
            if any(a.startswith("sm_") for a in torch.arch_list or []):
                # torch lists its own CUDA kernels (get_arch_list() or its capability warning)
                return make("cuda", None, "torch's own CUDA arch list")
            if messages.says(self.all_messages, "not-compiled-with-cuda"):
                return make("cpu", None, "torch's own error 'Torch not compiled with CUDA enabled'")
        if not requested and self._jetson_without_jetpack_build(version):
            return make("cpu", None, "PyPI's and pytorch.org's aarch64 wheels carry no Jetson "
                        "build (only NVIDIA's JetPack wheels, versions with '+nv', do)",
                        assumed=True)
        conda = "pytorch" in (self.snap.conda_packages or {}) and not requested
        if release is None or conda or not version or versions.is_custom_build(version):
            return make(None, None, "unknown")
        name = kb.default_variant(release, self.os_family)[0]
        if name == "cpu" and torch.cuda_available and not requested:
            return make("cuda", None, "torch.cuda.is_available()")
        os_name = self.os_family or "linux"
        basis = f"the default PyPI wheel of {versions.major_minor_text(version)} on {os_name} is {name}"
        if name == "cpu":
            return make("cpu", None, basis, assumed=True)
        return make("cuda", versions.cuda_from_tag(name), basis, assumed=True)

    def _jetson_without_jetpack_build(self, version: str | None) -> bool:
        """A Jetson (integrated) GPU with an unsuffixed torch that states no CUDA of its own:
        the generic aarch64 wheel, which cannot use the Jetson's GPU."""
        if not version or versions.local(version) or self.snap.torch.cuda_available:
            return False
        return bool(self.jetson_gpus)

    @property
    def jetson_gpus(self) -> list[GpuFact]:
        """NVIDIA GPUs of an integrated (Jetson) architecture: only JetPack builds run there."""
        return [gpu for gpu in self.nvidia_gpus
                if gpu.cc and (arch := kb.architecture(gpu.cc)) and arch.integrated]

    def variant_row(self, version: str, variant: str) -> kb.Variant | None:
        release = kb.torch_release(version)
        if release is None:
            return None
        platform = "windows" if self.os_family == "windows" else "linux"
        return kb.variant(release.release, variant, platform)

    def arch_targets(self) -> tuple[list[str], list[str], str, bool] | None:
        """(SASS targets, PTX targets, where from, verified) of the build, or None if unknown."""
        arch_list = self.snap.torch.arch_list
        build = self.build
        if arch_list and not build.requested:
            sass = [a for a in arch_list if a.startswith("sm_")]
            ptx = [a for a in arch_list if a.startswith("compute_")]
            return sass, ptx, "torch.cuda.get_arch_list()", True
        if build.kind != "cuda" or not build.variant or not build.is_published_wheel:
            return None
        machine = self.snap.cpu.architecture or self.snap.platform.os or ""
        if re.search(r"aarch64|arm64|ppc64", machine, re.IGNORECASE):
            return None  # the wheel tables describe x86_64 builds only
        row = self.variant_row(build.version, build.variant)
        if row is None:
            return None
        where = f"the {row.platform} {row.release} {row.name} wheel table"
        return list(row.arches), list(row.ptx), where, row.verified and not build.assumed


