"""Fixtures every area shares: a machine without a GPU, faked through the probe seam, and
an autotune budget that grows with the machine's load.

The suite passes on a machine with a GPU and on one without: a test of the no-GPU path
takes ``no_gpu`` instead of relying on the machine it runs on. It passes on a loaded machine
too: a test that runs autotune under a budget takes it from ``budget_for_load``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types
from collections.abc import Callable

import pytest

# What `python -c "import torch, tuneup.runtime"` took on the 2-core machine the tests' budgets
# were set on; the most a budget is stretched (the tests' own timeouts hold the longest one)
REFERENCE_STARTUP_S = 3.0
MAX_STRETCH = 6.0

NO_NVML_NOTE = "NVML is not available (NVML Shared Library Not Found)"


def _no_nvml_library() -> types.ModuleType:
    """``pynvml`` where libnvidia-ml is not installed: its init fails as the real one does."""
    module = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def init() -> None:
        raise NVMLError("NVML Shared Library Not Found")

    module.NVMLError = NVMLError
    module.nvmlInit = init
    return module


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process sees no NVIDIA driver or GPU, and a CPU build of torch.

    Faked where the facts enter: the probe's NVIDIA step (what ``probe_nvidia`` returns where
    there is no trace of NVIDIA hardware), NVML for whatever else imports ``pynvml`` here (the
    watcher: a CPU job on a GPU machine is otherwise judged by the GPU's idle figures) and
    torch's own CUDA queries. Subprocesses still see the real machine.
    """
    import torch

    from tuneup.machine import probe
    from tuneup.machine.snapshot import Driver

    def no_nvidia(notes: list[str] | None = None):
        if notes is not None:
            notes.append(NO_NVML_NOTE)
        return Driver(), []

    monkeypatch.setattr(probe, "_probe_nvidia", no_nvidia)
    monkeypatch.setitem(sys.modules, "pynvml", _no_nvml_library())
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


# The stand-in pynvml a subprocess imports first: as where libnvidia-ml is not installed
NO_NVML_MODULE = '''"""pynvml where libnvidia-ml is not installed (a test's stand-in)."""


class NVMLError(Exception):
    pass


def nvmlInit():
    raise NVMLError("NVML Shared Library Not Found")
'''


@pytest.fixture
def no_gpu_in_subprocesses(monkeypatch: pytest.MonkeyPatch,
                           tmp_path_factory: pytest.TempPathFactory) -> None:
    """Python subprocesses started from here see no GPU: no NVML (a stand-in ``pynvml``
    first on PYTHONPATH) and none for torch (``CUDA_VISIBLE_DEVICES`` empty). For a
    subprocess watcher judging a CPU job, which on a GPU machine reads that GPU's figures."""
    folder = tmp_path_factory.mktemp("no-nvml")
    (folder / "pynvml.py").write_text(NO_NVML_MODULE)
    path = [str(folder), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


@pytest.fixture
def budget_for_load() -> Callable[[float], float]:
    """``budget_for_load(40)``: 40 s on an idle machine, more where a Python start with torch
    takes longer now (the busy GPU machine ran out of a 30 s budget after a 36 s start-up)."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch, tuneup.runtime"], check=True,
                   timeout=300)
    stretch = min(MAX_STRETCH, max(1.0, (time.monotonic() - started) / REFERENCE_STARTUP_S))
    return lambda base: round(base * stretch)
