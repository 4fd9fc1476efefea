"""The fact reader: facts read wherever they stand, each noted with the line it came from."""

from __future__ import annotations

import pytest

from tuneup.doctor.readers import read_report
from tuneup.doctor.readers.facts import read_facts
from tuneup.doctor.rules import diagnose


def codes(text: str) -> set[str]:
    return {f.code for f in diagnose(read_report(text)).findings}


@pytest.mark.parametrize(("text", "version", "build", "cuda"), [
    ("pytorch                   2.4.0         py3.11_cpu_0    pytorch\n", "2.4.0", "cpu", None),
    ("pytorch   2.1.2   py3.10_cuda12.1_cudnn8.9.2_0   pytorch\n", "2.1.2", "cuda", "12.1"),
    ("torch==2.3.1+cu121\nnumpy==1.26.4\n", "2.3.1+cu121", "cuda", "12.1"),
    ("torch        2.9.1+cu128\ntorchvision  0.24.1+cu128\n", "2.9.1+cu128", "cuda", "12.8"),
    (">>> import torch\n>>> torch.__version__\n'2.5.1+cpu'\n", "2.5.1+cpu", "cpu", None),
    ('$ python -c "import torch; print(torch.__version__)"\n2.6.0+rocm6.2.4\n', "2.6.0+rocm6.2.4",
     "rocm", None),
])
def test_package_lines_and_prints_give_the_build(text, version, build, cuda):
    torch = read_report(text).torch
    assert (torch.version, torch.build, torch.cuda) == (version, build, cuda)


def test_python_prints_in_any_order_give_capability_arch_list_and_availability():
    text = ("print(torch.cuda.get_arch_list())\n"
            "['sm_75', 'sm_80', 'sm_86', 'sm_90', 'sm_100', 'sm_120']\n"
            ">>> torch.cuda.get_device_capability()\n(7, 0)\nCUDA available: True\n"
            "GPU: Tesla V100-SXM2-32GB\n")
    snap = read_report(text)
    assert snap.torch.arch_list[-1] == "sm_120" and snap.torch.cuda_available is True
    assert snap.gpus[0].compute_capability == "7.0"
    assert "TU101" in codes(text)  # torch's own list lacks sm_70: a stated fact, so an error


def test_each_fact_is_noted_with_its_line_and_ambiguity_lowers_confidence():
    snap = read_report("I tried Python 3.10 first.\nThen python 3.12.\nmy driver is 550.54.15\n")
    notes = " ".join(snap.notes)
    assert snap.platform.python_version == "3.10" and "not unambiguous" in notes
    assert snap.driver.version == "550.54.15" and "from 'my driver is 550.54.15'" in notes


def test_a_version_an_installer_was_asked_for_is_not_read_as_installed():
    snap = read_report("uv pip install torch==2.3.0\n"
                       "error: No matching distribution found for torch\n")
    assert snap.torch.version is None


def test_amd_facts_in_prose_and_an_override_of_another_generation():
    text = "RX 9070 XT is gfx1201, and the launcher sets HSA_OVERRIDE_GFX_VERSION=10.3.0\n"
    snap = read_report(text)
    assert snap.gpus[0].arch == "gfx1201" and snap.env["HSA_OVERRIDE_GFX_VERSION"] == "10.3.0"
    assert "TU607" in codes(text)
    assert "TU607" not in codes("gfx1031 with HSA_OVERRIDE_GFX_VERSION=10.3.0\n")  # a sibling


def test_an_amd_capability_tuple_is_not_a_cuda_capability():
    snap = read_report("name = AMD Radeon RX 6600 XT\ncapability = (10, 3)\ngfx1032\n")
    assert snap.gpus[0].vendor == "amd" and snap.gpus[0].compute_capability is None


@pytest.mark.parametrize(("text", "code"), [
    ("nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.6, please update "
     "your driver to a newer version, or use an earlier cuda container: unknown", "TU203"),
    ("Because torch==1.12.0+cu113 has no wheels with a matching Python ABI tag (e.g., `cp311`)",
     "TU704"),
    ("UserWarning: User provided device_type of 'cuda', but CUDA is not available. Disabling",
     "TU505"),
    ("Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000", "TU409"),
])
def test_tool_messages_around_torch_are_diagnosed(text, code):
    assert code in codes(text)


def test_a_harmless_capability_range_warning_is_no_error():
    text = ("Found GPU0 NVIDIA GB10 which is of cuda capability 12.1. Minimum and Maximum cuda "
            "capability supported by this version of PyTorch is (8.0) - (12.0)")
    assert diagnose(read_report(text)).errors == 0


def test_the_reader_reads_a_huge_text_only_at_its_ends():
    text = "torch==2.4.0+cu121\n" + "noise line\n" * 200_000 + "Python 3.11.9\n"
    names = {fact.name for fact in read_facts(text)}
    assert {"pip", "python"} <= names


@pytest.mark.parametrize(("text", "version", "available"), [
    ("pip show torch\nName: torch\nVersion: 2.0.1+cu117\n", "2.0.1+cu117", None),
    ('python -c "import torch; print(torch.__version__, torch.version.cuda, '
     'torch.cuda.is_available())"\n2.5.1+cu121 12.1 False\n', "2.5.1+cu121", False),
    ("In [2]: torch.cuda.is_available()\nOut[2]: False\n", None, False),
    ("I have an RTX 3060 12GB and torch 2.5.1 from pip on Windows 11.\n", "2.5.1", None),
])
def test_more_forms_people_paste(text, version, available):
    snap = read_report(text)
    assert (snap.torch.version, snap.torch.cuda_available) == (version, available)


def test_two_torch_versions_named_settle_nothing_and_say_so():
    snap = read_report("upgraded torch 2.4.1 to torch 2.5.1, still slow\nPython 3.11\n")
    assert snap.torch.version is None and snap.platform.python_version == "3.11"
    assert any("several values of torch.version" in note for note in snap.notes)


def test_a_cpu_build_stated_in_prose_is_a_warning_never_an_error():
    text = "pip installed the CPU-only build of torch even though I have CUDA 12.4 installed.\n"
    found = {f.code: f.severity for f in diagnose(read_report(text)).findings}
    assert found.get("TU104") == "warning" and "error" not in found.values()


def test_torch_s_capability_range_is_an_error_only_outside_it():
    below = ("Found GPU0 Tesla K80 which is of cuda capability 3.7. Minimum and Maximum cuda "
             "capability supported by this version of PyTorch is (5.0) - (9.0)")
    found = {f.code: f.severity for f in diagnose(read_report(below)).findings}
    assert found.get("TU107") == "error"
    inside = below.replace("Tesla K80", "NVIDIA GB10").replace("3.7", "12.1").replace(
        "(5.0) - (9.0)", "(8.0) - (12.0)")
    assert diagnose(read_report(inside)).errors == 0


def test_conda_s_libmamba_solver_error_for_pytorch_cuda_is_recognised():
    text = ("LibMambaUnsatisfiableError: Encountered problems while solving:\n"
            "  - nothing provides cuda-cudart >=12.1,<12.2 needed by "
            "pytorch-cuda-12.1-ha16c6d3_6\n")
    assert "TU704" in codes(text)


def test_a_conda_forge_build_string_and_device_properties():
    forge = read_report("pytorch   2.5.1   cuda126_generic_py312_h4aab1a8_306   conda-forge\n")
    assert (forge.torch.build, forge.torch.cuda) == ("cuda", "12.6")
    props = read_report("_CudaDeviceProperties(name='NVIDIA GeForce RTX 3090', major=8, minor=6, "
                        "total_memory=24265MB, multi_processor_count=82)\n")
    gpus = [(g.name, g.compute_capability) for g in props.gpus]
    assert gpus == [("NVIDIA GeForce RTX 3090", "8.6")]


@pytest.mark.parametrize(("text", "driver", "family", "toolkit"), [
    ("I upgraded my Nvidia GPU driver from 581 to the latest (610) and it works\n", "610", None,
     None),
    ("win11 laptop with cuda12.4 installed\n", None, "windows", "12.4"),
    ("Ubuntu 24.04 LTS, driver version: 570.133.07\n", "570.133.07", "linux", None),
])
def test_drivers_systems_and_toolkits_as_people_write_them(text, driver, family, toolkit):
    snap = read_report(text)
    assert (snap.driver.version, snap.platform.os_family, snap.cuda_toolkit) == (
        driver, family, toolkit)


def test_nccl_and_cudnn_versions_next_to_their_names():
    error = read_report("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970"
                        ", invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.19.3")
    assert error.torch.nccl == "2.19.3"
    prose = read_report("CUDA 12.1, cuDNN 8.9.2, driver 535.104.05\n")
    assert prose.cudnn_versions == ["8.9.2"] and prose.driver.version == "535.104.05"


@pytest.mark.parametrize(("line", "built"), [
    ("Python version: 3.12.0 | packaged by conda-forge | (main, Oct  3 2023, 08:43:22) "
     "[GCC 12.3.0] (64-bit runtime)", "3.12.0 2023-10-03"),
    ("Python 3.11.2 (tags/v3.11.2:878ead1, Feb  7 2023, 16:38:35) [MSC v.1934 64 bit (AMD64)] "
     "on win32", "3.11.2 2023-02-07"),
])
def test_an_interpreter_banner_gives_its_build_date(line, built):
    """sys.version carries the day the interpreter was built; noted where torch is missing,
    the one case the Python rule dates the interpreter (TU706)."""
    from tuneup.doctor.readers.facts import noted_value
    missing, installed = (read_report(f"PyTorch version: {v}\n{line}\n") for v in ("N/A", "2.1.0"))
    assert noted_value(missing, "python.built") == built
    assert noted_value(installed, "python.built") is None
    assert missing.platform.python_built == built.split()[1]
    assert installed.platform.python_built is None


def test_a_build_date_is_kept_only_for_the_interpreter_the_text_names():
    """The banner may stand before the line naming the Python; a banner of another Python
    (a second interpreter pasted alongside) dates nothing."""
    banner = "3.12.0 | packaged by conda-forge | (main, Oct  3 2023, 08:43:22) [GCC 12.3.0]"
    later = read_report(f"PyTorch version: N/A\n{banner}\nmy Python is 3.12.0\n")
    other = read_report(f"PyTorch version: N/A\n{banner}\nmy Python is 3.11.4\n")
    assert (later.platform.python_version, later.platform.python_built) == ("3.12.0", "2023-10-03")
    assert (other.platform.python_version, other.platform.python_built) == ("3.11.4", None)
    alone = read_report(f"PyTorch version: N/A\n{banner}\n")  # print(sys.version) only
    assert (alone.platform.python_version, alone.platform.python_built) == ("3.12.0",
                                                                           "2023-10-03")


@pytest.mark.parametrize(("line", "importable"), [
    ("ModuleNotFoundError: No module named 'torch'", False),
    ("ImportError: No module named torch", False),  # Python 2's words
    ('No module named "torch"', False),
    ("ModuleNotFoundError: No module named 'torch._C'", None),  # a broken torch, not none
    ("ModuleNotFoundError: No module named 'torchvision'", None),
    ("ModuleNotFoundError: No module named 'torch.distributed.elastic'", None),
])
def test_no_module_named_torch_says_that_interpreter_has_none(line, importable):
    snap = read_report(f"$ python train.py\nTraceback (most recent call last):\n{line}\n")
    assert snap.torch.importable is importable


@pytest.mark.parametrize("missing_first", [False, True])
def test_a_torch_version_the_text_names_outranks_a_missing_module(missing_first):
    """Pasted from two environments: the one that imports torch names its version."""
    lines = ["torch.__version__ = 2.4.1+cu121", "ModuleNotFoundError: No module named 'torch'"]
    snap = read_report("\n".join(lines[::-1] if missing_first else lines) + "\n")
    assert snap.torch.version == "2.4.1+cu121" and snap.torch.importable is not False


def test_a_missing_torch_in_pips_isolated_build_is_not_the_users():
    """pip builds flash-attn in a fresh environment without torch: the user's torch is
    there, and the text must not say it is missing."""
    snap = read_report(
        "$ pip install flash-attn\nCollecting flash-attn\n  Getting requirements to build "
        "wheel ... error\n  error: subprocess-exited-with-error\n  \u00d7 Getting requirements "
        "to build wheel did not run successfully.\n      ModuleNotFoundError: No module named "
        "'torch'\n      [end of output]\n")
    assert snap.torch.importable is not False
