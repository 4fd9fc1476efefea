"""The collect_env reader on real reports: the doctor corpus and extra fixtures from bug threads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tuneup.doctor.readers import ReportError, read_path, read_report
from tuneup.doctor.rules import diagnose

DATA = Path(__file__).resolve().parents[1] / "data"
CORPUS = sorted((DATA / "doctor-corpus").glob("case*/collect_env.txt"))
FIXTURES = sorted((DATA / "collect_env").glob("*.txt"))


def read(path: Path):
    return read_report(path.read_text())


@pytest.mark.parametrize("path", CORPUS + FIXTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_real_report_parses(path):
    snapshot = read(path)
    assert snapshot.source == "collect_env"
    assert snapshot.to_dict()  # plain data all the way down


# case -> facts the report states (or implies); everything else it must leave alone.
CORPUS_FACTS = {
    "case01": {
        "torch.version": "2.6.0+cu126",
        "torch.cuda": "12.6",
        "torch.build": "cuda",
        "driver.version": "570.124.04",
        "gpu_names": ["NVIDIA GeForce RTX 5090 D"],
        "gpu_cc": ["12.0"],
        "cudnn_versions": ["9.8.0"],
        "platform.python_version": "3.12.9",
        "torch.arch_list": ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"],
    },
    "case06": {
        "torch.version": "1.3.0",
        "torch.build": None,
        "torch.cuda": None,
        "driver.version": "410.48",
        "platform.python_version": "3.7",
        "gpus": None,
    },
    "case07": {
        "torch.version": "1.8.1",
        "torch.build": "cpu",
        "torch.cuda": None,
        "torch.cuda_available": False,
        "driver.version": "470.182.03",
        "gpu_names": ["NVIDIA GeForce RTX 3090"] * 2,
        "cuda_toolkit": "11.4.152",
        "cudnn_versions": ["8.2.1"],
    },
    "case13": {
        "torch.version": "2.8.0+cu128",
        "torch.cuda": "12.8",
        "platform.os_family": "windows",
        "gpu_names": ["NVIDIA GeForce GTX 1080 Ti"],
        "driver.version": None,
    },
    "case17": {
        "torch.version": "2.1.0+cu121",
        "torch.cuda": "12.1",
        "driver.cuda_version": "11.4",
        "driver.version": None,
        "gpus": None,
    },
    "case20": {
        "torch.version": "1.11.0+cu113",
        "torch.cuda": "11.3",
        "driver.version": "460.32.03",
    },
    "case23": {
        "torch.version": "2.5.1+cu121",
        "torch.cuda": "12.1",
        "driver.version": "590.48.01",
        "gpu_names": ["NVIDIA GeForce RTX 5090"],
    },
    "case27": {
        "torch.version": "2.1.0.dev20230905",
        "torch.build": "cpu",
        "torch.cuda": None,
        "cuda_toolkit": "11.8.89",
        "gpus": None,
    },
    "case30": {
        "torch.importable": False,
        "torch.version": None,
        "pip_packages": {"nvidia-nccl-cu12": "2.29.3", "nvidia-nccl-cu13": "2.29.7"},
    },
    "case33": {
        "torch.version": "1.12.0+cu113",
        "torch.cuda": "11.3",
        "cudnn_versions": ["8.0.3"],
        "pip_packages": {"torch": "1.12.0+cu113"},
    },
    "case34": {
        "cudnn_versions": ["9.13.1"],
        "pip_packages": {"nvidia-cudnn-cu12": "9.20.0"},
        "torch.version": None,
    },
    "case35": {"torch.version": "1.6.0", "gpu_names": ["AMD Raven"], "gpu_vendors": ["amd"]},
    "case36": {
        "torch.version": "2.4.1",
        "torch.installed": True,
        "gpu_names": ["AMD Radeon RX 6650 XT"],
        "gpu_vendors": ["amd"],
    },
    "case38": {
        "torch.installed": None,
        "torch.importable": False,
        "platform.python_version": "3.10.1",
        "gpu_names": ["NVIDIA GeForce GTX 760"],
        "driver.version": "470.94",
        "cudnn_libraries": None,
    },
    "case40": {
        "torch.importable": False,
        "platform.python_version": "3.12.0",
        "platform.os_family": "windows",
    },
    "case45": {
        "torch.cuda": "11.3",
        "torch.cuda_available": False,
        "torch.installed": True,
        "gpu_names": ["NVIDIA GeForce RTX 2070 SUPER"],
        "platform.os_family": "windows",
    },
    "case46": {
        "driver.version": "387.12",
        "torch.cuda_available": False,
        "platform.python_version": "3.6",
    },
    "case48": {
        "torch.version": "1.9.0",
        "torch.cuda": "10.2",
        "driver.version": "470.42.01",
        "gpu_names": ["NVIDIA GeForce MX150"],
        "cudnn_versions": ["8"],
        "cuda_toolkit": None,
    },
}


def fact(snapshot, name):
    if name == "gpu_names":
        return [gpu.name for gpu in snapshot.gpus or []]
    if name == "gpu_cc":
        return [gpu.compute_capability for gpu in snapshot.gpus or []]
    if name == "gpu_vendors":
        return [gpu.vendor for gpu in snapshot.gpus or []]
    value = snapshot
    for part in name.split("."):
        value = getattr(value, part)
    return value


def test_corpus_table_covers_every_case():
    assert set(CORPUS_FACTS) <= {path.parent.name for path in CORPUS}


@pytest.mark.parametrize("case", sorted(CORPUS_FACTS))
def test_corpus_key_facts(case):
    snapshot = read(DATA / "doctor-corpus" / case / "collect_env.txt")
    for name, expected in CORPUS_FACTS[case].items():
        assert fact(snapshot, name) == expected, name


def test_sm120_warning_is_kept_as_a_message():
    snapshot = read(DATA / "doctor-corpus/case01/collect_env.txt")
    assert any("sm_120 is not compatible" in message for message in snapshot.messages)
    assert not any("Collecting environment" in message for message in snapshot.messages)


def test_truncated_report_says_what_is_missing():
    snapshot = read(DATA / "doctor-corpus/case17/collect_env.txt")
    assert "Nvidia driver version" in snapshot.notes[0]
    assert "driver on your system is too old" in snapshot.torch.init_error


FIXTURE_FACTS = {
    "pytorch-10657-torch0.4-arch.txt": {
        "torch.version": "0.4.1.post2",
        "torch.build": "cpu",
        "gpus": [],
        "torch.cuda_available": False,
        "pip_packages": None,
    },
    "pytorch-28321-torch1.3-conda.txt": {
        "torch.cuda": "10.1",
        "driver.version": "410.104",
        "gpu_names": ["Tesla T4"],
        "torch.cuda_available": False,
    },
    "pytorch-51858-windows-conda-cpu-build.txt": {
        "torch.build": "cpu",
        "platform.os_family": "windows",
        "gpu_names": ["NVIDIA GeForce RTX 3060 Laptop GPU"],
    },
    "pytorch-74733-no-driver-warning.txt": {"torch.cuda": "11.0", "torch.debug_build": True},
    "pytorch-pr44106-rocm-torch1.7.txt": {
        "torch.build": "rocm",
        "torch.hip": "3.7.20315-077bcfa0",
        "torch.cuda": None,
        "gpu_vendors": ["amd"],
    },
    "pytorch-150168-torch2.6-cpu.txt": {
        "torch.build": "cpu",
        "cpu.logical_cores": 16,
        "cpu.model": "AMD Ryzen 7 6800U with Radeon Graphics",
    },
    "pytorch-pr137846-windows-cpu-nightly.txt": {
        "torch.build": "cpu",
        "cpu.architecture": "x86_64",
        "cpu.model": "12th Gen Intel(R) Core(TM) i7-1270P",
    },
    "vllm-pr9293-wsl2.txt": {
        "platform.is_wsl": True,
        "driver.version": "551.88",
        "cuda_toolkit": "12.4.131",
    },
    "pytorch-121067-macos-email-wrapped.txt": {
        "platform.os_family": "darwin",
        "platform.python_version": "3.10.13",
        "cpu.model": "Intel(R) Core(TM) i9-9880H CPU @ 2.30GHz",
        "conda_packages": None,
    },
    "scale-mae-pr7-conda-cpu-build-2x3090.txt": {
        "torch.build": "cpu",
        "cudnn_versions": ["8.8.0"],
        "gpu_names": ["NVIDIA GeForce RTX 3090"] * 2,
    },
    "pytorch-48145-macos-old-format.txt": {"torch.build": "cpu", "platform.os_family": "darwin"},
    "vllm-10303-eight-gpus.txt": {"gpu_names": ["NVIDIA GeForce RTX 3090"] * 8},
    "vllm-5640-jetson-agx-orin.txt": {
        "torch.version": "2.0.0a0+ec3941ad.nv23.02",
        "torch.cuda": "11.4",
        "gpus": None,
        "driver.version": None,
        "cudnn_versions": ["8.6.0"],
    },
    "jetson-containers-1495-orin-starts-mid-report.txt": {
        "torch.version": None,
        "gpu_vendors": ["nvidia"],
        "cpu.architecture": "aarch64",
        "platform.python_version": "3.10.19",
    },
    "local-torch2.13-cpu-debian12.txt": {
        "torch.version": "2.13.0+cpu",
        "torch.build": "cpu",
        "notes": [],
    },
}


def test_fixture_table_covers_every_fixture():
    assert sorted(FIXTURE_FACTS) == sorted(path.name for path in FIXTURES)


@pytest.mark.parametrize("name", sorted(FIXTURE_FACTS))
def test_fixture_key_facts(name):
    snapshot = read(DATA / "collect_env" / name)
    for key, expected in FIXTURE_FACTS[name].items():
        assert fact(snapshot, key) == expected, key


def test_lscpu_flags_keep_the_ones_that_matter():
    snapshot = read(DATA / "collect_env/local-torch2.13-cpu-debian12.txt")
    assert {"avx512_bf16", "amx_bf16", "avx2"} <= set(snapshot.cpu.flags)
    assert "fpu" not in snapshot.cpu.flags


def test_extension_lines_become_environment_variables():
    text = (
        DATA / "doctor-corpus/case45/collect_env.txt"
    ).read_text() + "\nCUDA_VISIBLE_DEVICES=2\n"
    text += "LD_LIBRARY_PATH: /public/apps/cudnn/v8.0.3.33-cuda.11.0/cuda/lib64\nexport NCCL_P2P_DISABLE=1\n"
    env = read_report(text).env
    assert env == {
        "CUDA_VISIBLE_DEVICES": "2",
        "LD_LIBRARY_PATH": "/public/apps/cudnn/v8.0.3.33-cuda.11.0/cuda/lib64",
        "NCCL_P2P_DISABLE": "1",
    }


def test_nvidia_smi_header_pasted_with_the_report():
    text = "PyTorch version: 1.11.0+cu113\n| NVIDIA-SMI 460.32.03    Driver Version: 460.32.03    CUDA Version: 11.2     |\n"
    snapshot = read_report(text)
    assert (snapshot.driver.version, snapshot.driver.cuda_version) == ("460.32.03", "11.2")


def test_old_issue_template_and_markdown():
    text = (
        "## Environment\n"
        "- PyTorch Version (e.g., 1.0): 1.6.0\n"
        "- OS (e.g., Linux): Ubuntu 18.04.5\n"
        "- How you installed PyTorch (`conda`, `pip`, source): pip\n"
        "- Python version: 3.6.5\n"
        "- CUDA/cuDNN version: 10.1/7.6\n"
        "- **GPU models and configuration:** AMD Raven\n"
    )
    snapshot = read_report(text)
    assert snapshot.torch.version == "1.6.0"
    assert snapshot.platform.python_version == "3.6.5"
    assert snapshot.cuda_toolkit == "10.1"
    assert snapshot.cudnn_versions == ["7.6"]
    assert [gpu.name for gpu in snapshot.gpus] == ["AMD Raven"]


def test_github_paste_with_bom_crlf_fences_and_uuid():
    text = (
        "\ufeffPyTorch version: 1.4.0\r\nIs debug build: No\r\nCUDA used to build PyTorch: 10.1\r\n"
        "<details><summary>env</summary>\r\n```text\r\nIs CUDA available: Yes\r\n"
        "GPU models and configuration: \r\nGPU 0: GeForce RTX 2080 Ti (UUID: GPU-1234abcd)\r\n"
        "GPU 1: GeForce RTX 2080 Ti\r\n\r\ncuDNN version: /usr/lib/x86_64-linux-gnu/libcudnn.so.7.6.5\r\n"
        "[conda] pytorch   1.4.0   py3.7_cuda10.1.243_cudnn7.6.3_0    pytorch\r\n```\r\n</details>\r\n"
    )
    snapshot = read_report(text)
    assert (snapshot.torch.version, snapshot.torch.cuda, snapshot.torch.cuda_available) == (
        "1.4.0",
        "10.1",
        True,
    )
    assert [gpu.name for gpu in snapshot.gpus] == ["GeForce RTX 2080 Ti"] * 2
    assert snapshot.cudnn_versions == ["7.6.5"]
    assert snapshot.conda_packages == {"pytorch": "1.4.0"}


def test_vllm_layout_with_padded_keys_and_sections():
    text = (
        "==============================\n       PyTorch Info\n==============================\n"
        "PyTorch version              : 2.7.0+cu128\n"
        "CUDA used to build PyTorch   : 12.8\n"
        "ROCM used to build PyTorch   : N/A\n\n"
        "==============================\n          CPU Info\n==============================\n"
        "Architecture:                         x86_64\n"
        "Model name:                           AMD EPYC 7763 64-Core Processor\n\n"
        "==============================\nVersions of relevant libraries\n==============================\n"
        "[pip3] torch==2.7.0+cu128\n\n"
        "==============================\n     Environment Variables\n==============================\n"
        "NCCL_CUMEM_ENABLE=0\nCUDA_VISIBLE_DEVICES=0,1\n"
    )
    snapshot = read_report(text)
    assert (snapshot.torch.version, snapshot.torch.cuda) == ("2.7.0+cu128", "12.8")
    assert snapshot.cpu.model == "AMD EPYC 7763 64-Core Processor"
    assert snapshot.env == {"NCCL_CUMEM_ENABLE": "0", "CUDA_VISIBLE_DEVICES": "0,1"}


def test_lines_merged_by_a_paste_are_split_again():
    text = "PyTorch version: 2.8.0.dev20250413+rocm6.3" + " " * 60 + "Is debug build: False\n"
    snapshot = read_report(text)
    assert (snapshot.torch.build, snapshot.torch.hip, snapshot.torch.debug_build) == (
        "rocm",
        "6.3",
        False,
    )


def test_rocm_gpu_line_with_gfx_target():
    text = (
        "PyTorch version: 2.5.1+rocm6.2\nROCM used to build PyTorch: 6.2.41133-dd7f95766\n"
        "GPU models and configuration: AMD Instinct MI250X/MI250 (gfx90a:sramecc+:xnack-)\n"
    )
    (gpu,) = read_report(text).gpus
    assert (gpu.name, gpu.vendor, gpu.arch) == ("AMD Instinct MI250X/MI250", "amd", "gfx90a")


def test_cudnn_mismatch_error_text_gives_both_versions():
    text = (
        "PyTorch version: 1.12.0+cu113\nRuntimeError: cuDNN version incompatibility: PyTorch was "
        "compiled against (8, 3, 2) but linked against (8, 0, 3)\n"
    )
    torch = read_report(text).torch
    assert (torch.cudnn_compiled, torch.cudnn_runtime) == ("8.3.2", "8.0.3")
    assert torch.init_error.startswith("cuDNN version incompatibility")


def test_old_too_old_gpu_warning_gives_its_capability():
    text = (
        "PyTorch version: 1.5.0\nUserWarning: Found GPU0 GeForce GTX 770 which is of cuda capability 3.0.\n"
        "PyTorch no longer supports this GPU because it is too old.\n"
    )
    (gpu,) = read_report(text).gpus
    assert (gpu.name, gpu.compute_capability) == ("GeForce GTX 770", "3.0")


@pytest.mark.parametrize(
    "text",
    [
        "# My project\n\nInstall with pip. Usage: run main.py\n",
        "hello world",
        "Traceback: nothing here",
    ],
)
def test_unrelated_text_gets_a_report_of_what_could_not_be_checked(text):
    """Text is never refused: a README gets a report that read nothing and claims nothing."""
    snapshot = read_report(text)
    assert snapshot.notes[0].startswith("no collect_env report")
    assert diagnose(snapshot).errors == 0


def test_documentation_quoting_report_lines_is_read_as_text():
    text = (
        "# Troubleshooting\n\nThe nvidia-smi header (`Driver Version: 460.32.03   CUDA Version: 11.2`)\n"
        'tells the driver. Example plan:\n\n```json\n{"protocol": 1, "trials": []}\n```\n'
    )
    for variant in (text, text.replace("{", "(").replace("}", ")")):
        snapshot = read_report(variant)  # JSON that is not a tuneup report is just more text
        assert snapshot.source == "text" and diagnose(snapshot).errors == 0


def test_report_cut_right_after_its_warning_is_still_read():
    text = (DATA / "doctor-corpus/case17/collect_env.txt").read_text().split("PyTorch version")[0]
    snapshot = read_report(text)
    assert snapshot.driver.cuda_version == "11.4" and snapshot.torch.version is None


def test_bad_files_give_one_line_messages(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n\n")
    binary = tmp_path / "junk.bin"
    binary.write_bytes(bytes(range(256)) * 64)
    cases = {
        str(tmp_path / "missing.txt"): "no such file",
        str(tmp_path): "is a directory",
        str(empty): "empty",
        str(binary): "binary",
    }
    for path, words in cases.items():
        with pytest.raises(ReportError) as caught:
            read_path(path)
        message = str(caught.value)
        assert words in message and "\n" not in message and path in message


def test_utf16_report_from_powershell(tmp_path):
    report = tmp_path / "env.txt"
    report.write_bytes((DATA / "doctor-corpus/case01/collect_env.txt").read_text().encode("utf-16"))
    assert read_path(str(report)).torch.version == "2.6.0+cu126"


def test_stdin_dash(monkeypatch):
    import io

    data = (DATA / "doctor-corpus/case07/collect_env.txt").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert read_path("-").torch.version == "1.8.1"


def test_readers_do_not_import_torch():
    code = (
        "import sys\n"
        "from tuneup.doctor.readers import read_path\n"
        f"read_path({str(DATA / 'doctor-corpus/case01/collect_env.txt')!r})\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "assert 'pynvml' not in sys.modules, 'pynvml was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
