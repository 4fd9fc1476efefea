"""The live probe on any machine, the no-GPU path through faked facts, and the pure parsers on
real file texts."""

from __future__ import annotations

import sys
import types

import pytest
from packaging.version import Version

from tuneup.machine import probe
from tuneup.machine import versions
from tuneup.machine.probe import cpu, host, nvidia, torch_build

# /proc/cpuinfo excerpts: an Intel Sapphire Rapids guest and an AWS Graviton3 (aarch64).
CPUINFO_X86 = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8488C
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sse sse2 ss ht syscall nx pdpe1gb rdtscp lm sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand hypervisor avx2 bmi2 avx512f avx512dq avx512cd avx512bw avx512vl avx_vnni avx512_bf16 avx512_vnni avx512_fp16 amx_bf16 amx_tile amx_int8 fma
bogomips\t: 4800.00
"""
CPUINFO_ARM = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs paca pacg dcpodp svei8mm svebf16 i8mm bf16 dgh rng
CPU implementer\t: 0x41
CPU architecture: 8
"""
# /proc/self/cgroup of a hybrid cgroup v1 host and of a Kubernetes pod on cgroup v2.
CGROUP_V1 = "9:name=systemd:/\n4:memory:/process_api/460e7ab3\n2:cpuacct:/\n1:cpu:/\n0::/\n"
CGROUP_V1_JOINED = "11:cpu,cpuacct:/docker/3f1c2a\n1:name=systemd:/docker/3f1c2a\n"
CGROUP_V2 = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c.slice/cri-containerd-9a8b.scope\n"
LDCONFIG = """536 libs found in cache `/etc/ld.so.cache'
\tlibnccl.so.2 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnccl.so.2
\tlibcudnn.so.8 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcudnn.so.8
\tlibcudnn_ops_infer.so.8 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcudnn_ops_infer.so.8
\tlibcudnn.so (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcudnn.so
"""


def test_cpuinfo_x86_and_arm():
    model, flags = cpu.parse_cpuinfo(CPUINFO_X86)
    assert model == "Intel(R) Xeon(R) Platinum 8488C"
    assert {"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile"} <= set(flags)
    assert not {"fpu", "sse", "hypervisor", "avx512dq"} & set(flags)  # noise is dropped
    model, flags = cpu.parse_cpuinfo(CPUINFO_ARM)
    assert model is None and flags == ["asimd", "sve", "bf16", "i8mm"]


@pytest.mark.parametrize(
    ("text", "cores"),
    [
        ("max 100000\n", None),
        ("200000 100000\n", 2.0),
        ("150000 100000", 1.5),
        ("", None),
        ("garbage", None),
    ],
)
def test_cgroup_v2_cpu_max(text, cores):
    assert cpu.parse_cpu_max(text) == cores


@pytest.mark.parametrize(
    ("quota", "period", "cores"),
    [
        ("-1\n", "100000\n", None),
        ("50000\n", "100000\n", 0.5),
        ("400000", "100000", 4.0),
        ("x", "1", None),
    ],
)
def test_cgroup_v1_cfs_quota(quota, period, cores):
    assert cpu.parse_cfs_quota(quota, period) == cores


def test_cgroup_paths_from_proc_self_cgroup():
    assert cpu.cgroup_paths(CGROUP_V1) == ("/", "/")
    assert cpu.cgroup_paths(CGROUP_V1_JOINED) == (None, "/docker/3f1c2a")
    assert cpu.cgroup_paths(CGROUP_V2)[0].startswith("/kubepods.slice/")


def test_cgroup_quota_reads_the_process_cgroup(tmp_path):
    pod = tmp_path / "kubepods.slice" / "pod1"
    pod.mkdir(parents=True)
    (pod / "cpu.max").write_text("250000 100000\n")
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cpu.cgroup_quota(tmp_path, "0::/kubepods.slice/pod1\n") == 2.5
    assert cpu.cgroup_quota(tmp_path, "0::/\n") is None


def test_cgroup_v1_quota_files(tmp_path):
    docker = tmp_path / "cpu,cpuacct" / "docker" / "3f1c2a"
    docker.mkdir(parents=True)
    (docker / "cpu.cfs_quota_us").write_text("150000\n")
    (docker / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu.cgroup_quota(tmp_path, CGROUP_V1_JOINED) == 1.5


def test_usable_cores_is_affinity_capped_by_quota():
    assert cpu.usable_cores(8, None) == 8.0
    assert cpu.usable_cores(8, 2.5) == 2.5
    assert cpu.usable_cores(2, 4.0) == 2.0
    assert cpu.usable_cores(None, 3.0) == 3.0


def test_platform_helpers():
    assert host.is_wsl("Linux version 5.15.153.1-microsoft-standard-WSL2 (root@941d701f84f1)")
    assert not host.is_wsl("Linux version 6.8.0-124-generic (buildd@lcy02-amd64-017)")
    assert host.in_container([], "12:cpu,cpuacct:/docker/3f1c2a9b\n")
    assert not host.in_container(["/nonexistent/.dockerenv"], "0::/init.scope\n")
    assert (
        host.os_pretty_name('NAME="Ubuntu"\nPRETTY_NAME="Ubuntu 24.04.4 LTS"\n')
        == "Ubuntu 24.04.4 LTS"
    )


def test_select_env_keeps_gpu_and_nccl_variables_only():
    environ = {
        "CUDA_VISIBLE_DEVICES": "2",
        "NCCL_DEBUG": "INFO",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "LD_LIBRARY_PATH": "/opt/cudnn/lib",
        "HOME": "/root",
        "AWS_SECRET_ACCESS_KEY": "x",
    }
    assert host.select_env(environ) == {
        "CUDA_VISIBLE_DEVICES": "2",
        "LD_LIBRARY_PATH": "/opt/cudnn/lib",
        "NCCL_DEBUG": "INFO",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    }


def test_ldconfig_and_library_versions():
    cudnn = host.parse_ldconfig(LDCONFIG, "libcudnn")
    assert cudnn == [
        "/usr/lib/x86_64-linux-gnu/libcudnn.so.8",
        "/usr/lib/x86_64-linux-gnu/libcudnn.so",
    ]
    assert versions.distinct_versions(cudnn) == ["8"]
    assert host.parse_ldconfig(LDCONFIG, "libnccl") == ["/usr/lib/x86_64-linux-gnu/libnccl.so.2"]
    assert versions.library_version("C:\\CUDA\\v11.1\\bin\\cudnn64_8.dll") == "8"
    assert versions.library_version("/usr/lib/libcudnn.so.9.8.0") == "9.8.0"


def test_version_helpers():
    assert versions.build_from_version("2.6.0+cu126") == ("cuda", "12.6")
    assert versions.build_from_version("1.7.1+cu92") == ("cuda", "9.2")
    assert versions.build_from_version("2.4.1+rocm6.1") == ("rocm", "6.1")
    assert versions.build_from_version("2.13.0+cpu") == ("cpu", None)
    assert versions.build_from_version("1.8.1") == (None, None)
    assert versions.cuda_from_int(11040) == "11.4" and versions.cuda_from_int(12080) == "12.8"
    assert (
        host.parse_nvcc_version("Cuda compilation tools, release 12.1, V12.1.105\n") == "12.1.105"
    )


def test_nvidia_text_parsers():
    assert nvidia.throttle_reason_names(0x24) == ["SwPowerCap", "SwThermalSlowdown"]
    assert nvidia.throttle_reason_names(0) == []
    proprietary = (
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.124.04  Fri Feb 21 18:04:21 UTC 2025"
    )
    open_module = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder@U16)"
    assert nvidia.parse_proc_driver_version(proprietary) == "570.124.04"
    assert nvidia.parse_proc_driver_version(open_module) == "580.65.06"


class _NotSupported(Exception):
    pass


def _fake_pynvml() -> types.ModuleType:
    """A stand-in NVML with one RTX 4090 on a x8 gen-3 link, power-capped, ECC unsupported."""
    fake = types.ModuleType("pynvml")

    def unsupported(*_):
        raise _NotSupported("Not Supported")

    fake.nvmlInit = fake.nvmlShutdown = lambda: None
    fake.nvmlSystemGetDriverVersion = lambda: "570.124.04"
    fake.nvmlSystemGetCudaDriverVersion = lambda: 12080
    fake.nvmlDeviceGetCount = lambda: 1
    fake.nvmlDeviceGetHandleByIndex = lambda index: ("handle", index)
    fake.nvmlDeviceGetName = lambda handle: b"NVIDIA GeForce RTX 4090"
    fake.nvmlDeviceGetCudaComputeCapability = lambda handle: (8, 9)
    fake.nvmlDeviceGetMemoryInfo = lambda handle: types.SimpleNamespace(total=24 * 2**30)
    fake.nvmlDeviceGetCurrPcieLinkGeneration = lambda handle: 3
    fake.nvmlDeviceGetMaxPcieLinkGeneration = lambda handle: 4
    fake.nvmlDeviceGetCurrPcieLinkWidth = lambda handle: 8
    fake.nvmlDeviceGetMaxPcieLinkWidth = lambda handle: 16
    fake.nvmlDeviceGetPersistenceMode = lambda handle: 0
    fake.nvmlDeviceGetCurrentClocksEventReasons = lambda handle: 0x4
    fake.nvmlDeviceGetEccMode = unsupported
    return fake


def test_nvml_path_with_a_fake_library(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    driver, gpus = nvidia.probe_nvidia()
    assert (driver.version, driver.cuda_version) == ("570.124.04", "12.8")
    (gpu,) = gpus
    assert (gpu.name, gpu.compute_capability, gpu.memory_total_mib) == (
        "NVIDIA GeForce RTX 4090",
        "8.9",
        24576,
    )
    assert (gpu.pcie_gen_current, gpu.pcie_gen_max, gpu.pcie_width_current, gpu.pcie_width_max) == (
        3,
        4,
        8,
        16,
    )
    assert gpu.persistence_mode is False and gpu.throttle_reasons == ["SwPowerCap"]
    assert gpu.ecc_enabled is None  # not supported: unknown, not an error


def test_a_gpu_nvml_cannot_open_is_kept_with_a_note(monkeypatch):
    fake = _fake_pynvml()
    fake.nvmlDeviceGetCount = lambda: 2

    def handle(index):
        if index == 1:
            raise _NotSupported("Unknown Error")
        return ("handle", index)

    fake.nvmlDeviceGetHandleByIndex = handle
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    notes: list[str] = []
    _, gpus = nvidia.probe_nvidia(notes)
    assert [gpu.name for gpu in gpus] == ["NVIDIA GeForce RTX 4090", None]
    assert notes == ["NVML cannot open GPU 1: Unknown Error"]


def test_missing_torch_is_a_fact(monkeypatch):
    monkeypatch.setattr(torch_build.importlib.util, "find_spec", lambda name: None)
    assert torch_build.probe_torch().installed is False


def test_live_snapshot_on_this_machine():
    import torch

    snapshot = probe.snapshot()
    assert snapshot.source == "live"
    assert snapshot.torch.installed and snapshot.torch.version == str(torch.__version__)
    assert snapshot.torch.cuda_available is torch.cuda.is_available()
    if torch.cuda.is_available():  # NVML (or torch) lists every GPU torch can use, and more
        assert snapshot.torch.build in ("cuda", "rocm")
        assert len(snapshot.gpus) >= torch.cuda.device_count() > 0
    assert snapshot.platform.os_family == "linux" and snapshot.platform.python_version
    assert 0 < snapshot.cpu.usable_cores <= snapshot.cpu.logical_cores
    assert snapshot.cpu.shm_total_bytes > 0 and snapshot.cpu.ram_total_bytes > 0
    assert isinstance(snapshot.cpu.flags, list)
    # pip's metadata drops the local label torch.__version__ carries ("2.11.0" beside
    # "2.11.0+cu130" for a PyPI CUDA wheel); download.pytorch.org wheels keep it in both
    assert Version(snapshot.pip_packages["torch"]).public == Version(snapshot.torch.version).public


def test_snapshot_of_a_machine_without_a_gpu(no_gpu):
    snapshot = probe.snapshot()
    assert snapshot.gpus == []  # known: no NVIDIA hardware (torch sees none either)
    assert any(note.startswith("NVML is not available") for note in snapshot.notes)
    assert snapshot.torch.installed and snapshot.torch.build == "cpu"
    assert snapshot.torch.cuda is None and snapshot.torch.cuda_available is False
    assert 0 < snapshot.cpu.usable_cores <= snapshot.cpu.logical_cores


def test_light_probes_used_by_the_fingerprint():
    from tuneup.settings import fingerprint

    current = fingerprint.current()
    assert current["torch"] == probe.probe_torch().version
    assert current["gpu_count"] == len(probe.probe_nvidia()[1] or [])
    assert current["cpu_cores"] == probe.probe_cpu().usable_cores


def test_the_fingerprint_of_a_machine_without_a_gpu(no_gpu):
    from tuneup.settings import fingerprint

    current = fingerprint.current()
    assert (current["gpu_count"], current["gpu_model"], current["driver"]) == (0, None, None)
    assert current["torch_cuda"] is None


@pytest.mark.parametrize(("stamp", "day"), [
    ("Oct  7 2024 12:00:00", "2024-10-07"),  # platform.python_build()'s date: two spaces
    ("Dec 25 2023", "2023-12-25"),
    ("", None),
    ("built yesterday", None),
])
def test_a_compilers_build_date_reads_as_an_iso_day(stamp, day):
    assert host.build_day(stamp) == day


def test_the_live_platform_carries_the_interpreters_build_day(monkeypatch):
    """What TU706 dates the interpreter by, read from the interpreter itself."""
    monkeypatch.setattr(host.platform, "python_build", lambda: ("main", "Oct  7 2024 12:00:00"))
    assert host.probe_platform().python_built == "2024-10-07"
