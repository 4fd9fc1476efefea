"""The torch wheel scripts/setup.sh installs: the doctor's own choice for this driver, these
GPUs and this Python, read without torch (fake driver and GPU facts here)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tuneup.doctor.readers import read_path
from tuneup.doctor.rules import diagnose
from tuneup.doctor.wheel_choice import choose, from_environment
from tuneup.machine.probe.nvidia_smi import NvidiaFacts

CORPUS = Path(__file__).parents[1] / "data" / "doctor-corpus"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# reports whose fix names a CUDA wheel, with the driver and the GPUs known
INSTALL_CASES = ["case01", "case03", "case09", "case10", "case106", "case15", "case16",
                 "case23", "case53", "case69", "case99"]
PIP = re.compile(r"pip install torch==(\S+) --index-url (\S+)")


def index(variant: str) -> str:
    return f"https://download.pytorch.org/whl/{variant}"


@pytest.mark.parametrize("case", INSTALL_CASES)
def test_the_same_wheel_as_the_doctor_s_fix_for_that_machine(case):
    snapshot = read_path(str(CORPUS / case / "collect_env.txt"))
    fixes = [f.fix for f in diagnose(snapshot).findings if PIP.search(f.fix or "")]
    version, url = PIP.search(fixes[0]).groups()
    facts = NvidiaFacts(snapshot.driver.version,
                        tuple((gpu.name, gpu.compute_capability) for gpu in snapshot.gpus))
    chosen = choose(facts, snapshot.platform.python_version, wanted=version)
    assert chosen.pip_args() == [f"torch=={version}", "--index-url", url]


@pytest.mark.parametrize(("driver", "gpu", "cc", "python", "version", "variant"), [
    ("580.159.04", "NVIDIA H200", "9.0", "3.12.3", "2.13.0", "cu130"),  # stable, not exp. cu132
    ("570.124.04", "NVIDIA GeForce RTX 5090", "12.0", "3.12.9", "2.11.0", "cu128"),  # 2.13: R580
    ("570.124.04", "NVIDIA GeForce RTX 4090", None, "3.11.7", "2.13.0", "cu126"),  # CC by name
    ("535.104.05", "NVIDIA A100-SXM4-80GB", "8.0", "3.11.7", "2.13.0", "cu126"),
    ("470.182.03", "Tesla T4", "7.5", "3.10.12", "2.7.1", "cu118"),  # no CUDA 12 on R470
    ("525.60.13", "Tesla V100-SXM2-16GB", "7.0", "3.9.18", "2.8.0", "cu129"),  # 2.13: Python 3.10+
])
def test_driver_gpu_and_python_pick_the_index(driver, gpu, cc, python, version, variant):
    chosen = choose(NvidiaFacts(driver, ((gpu, cc),)), python)
    assert chosen.pip_args() == [f"torch=={version}", "--index-url", index(variant)]
    assert gpu in chosen.reason and driver in chosen.reason


def test_no_nvidia_gpu_gets_the_cpu_wheel():
    chosen = choose(None, "3.11.7")
    assert chosen.pip_args() == ["torch==2.13.0", "--index-url", CPU_INDEX]
    assert chosen.reason == "no NVIDIA GPU: the CPU wheel"


def test_a_pinned_release_no_variant_of_which_fits_falls_back_to_the_cpu_wheel():
    chosen = choose(NvidiaFacts("570.124.04", (("NVIDIA GeForce RTX 5090", "12.0"),)), "3.12.9",
                    wanted="2.13.0", pinned=True)
    assert chosen.variant == "cpu"
    assert "no torch 2.13.0 wheel in tuneup's tables fits" in chosen.reason


def test_the_variables_override_the_choice():
    h200 = NvidiaFacts("580.159.04", (("NVIDIA H200", "9.0"),))
    own = from_environment({"TUNEUP_TORCH_INDEX": "https://mirror.example/whl/cu130"},
                           lambda: h200, "3.12.3")
    assert own.pip_args() == ["torch==2.13.0", "--index-url", "https://mirror.example/whl/cu130"]
    pinned = from_environment({"TUNEUP_TORCH": "2.12.1"}, lambda: h200, "3.12.3")
    assert pinned.pip_args() == ["torch==2.12.1", "--index-url", index("cu130")]
    assert from_environment({}, lambda: None, "3.12.3").pip_args()[-1] == CPU_INDEX


def test_it_runs_without_torch():
    code = ("import sys\nfrom tuneup.doctor import wheel_choice\n"
            "wheel_choice.from_environment({}, lambda: None, '3.12.3')\n"
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "False"
