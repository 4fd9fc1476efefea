"""A stuck NVML (``nvmlInit`` or a query that never returns: a wedged driver, a GPU off the
bus) hangs nothing: the doctor, the runtime's fingerprint check and the watcher each give up
after the deadline, say "NVML did not answer", and never call into the stuck NVML again."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tuneup.cli import main
from tuneup.machine import probe
from tuneup.machine.probe import nvidia, nvml_call
from tuneup.watch.nvml import open_gpus

DEADLINE = 0.3
MARGIN = 10.0  # what the probe does besides NVML, on a loaded 2-core machine


def never_returns(*_: Any) -> None:
    threading.Event().wait()  # as a call stuck in the driver: nothing wakes it


def stuck_nvml(**fine: Callable[..., Any]) -> types.ModuleType:
    """A stand-in for pynvml whose nvmlInit never returns (unless given in ``fine``), whose
    other functions are ``fine``, and which counts nvmlShutdown calls."""
    fake = types.ModuleType("pynvml")
    fake.shutdowns = 0

    def shutdown() -> None:
        fake.shutdowns += 1

    fake.nvmlInit = never_returns
    fake.nvmlShutdown = shutdown
    for name, function in fine.items():
        setattr(fake, name, function)
    return fake


def within(seconds: float, work: Callable[[], Any]) -> Any:
    """``work()``'s value; fails (instead of hanging the suite) when it takes longer."""
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(work()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    return box[0]


@pytest.fixture
def short_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(nvml_call.ENV, str(DEADLINE))


def test_the_deadline_comes_from_the_environment() -> None:
    assert nvml_call.timeout_s({nvml_call.ENV: "2.5"}) == 2.5
    for bad in ("", "0", "-1", "nan", "inf", "soon"):
        assert nvml_call.timeout_s({nvml_call.ENV: bad}) == nvml_call.DEFAULT_TIMEOUT_S
    assert nvml_call.timeout_s({}) == nvml_call.DEFAULT_TIMEOUT_S


def test_a_stuck_call_raises_then_nvml_is_never_called_again() -> None:
    fake = stuck_nvml()
    nvml = nvml_call.bounded(fake, deadline_s=DEADLINE)
    started = time.monotonic()
    with pytest.raises(nvml_call.NvmlTimeout, match=r"did not answer within 0.3 s \(nvmlInit\)"):
        nvml.nvmlInit()
    assert time.monotonic() - started < DEADLINE + 2
    started = time.monotonic()
    with pytest.raises(nvml_call.NvmlTimeout):
        nvml.nvmlShutdown()  # at once, and not into the stuck driver
    assert time.monotonic() - started < 0.1 and fake.shutdowns == 0
    again = nvml_call.bounded(fake, deadline_s=DEADLINE)  # the same NVML, asked anew
    assert again.stuck is not None and again.stuck.call == "nvmlInit"


def test_errors_and_values_pass_through_the_deadline() -> None:
    fake = stuck_nvml(nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 3,
                      nvmlDeviceGetName=lambda handle: (_ for _ in ()).throw(KeyError(handle)))
    fake.NVML_CLOCK_SM = 1
    nvml = nvml_call.bounded(fake, deadline_s=DEADLINE)
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetCount() == 3 and nvml.NVML_CLOCK_SM == 1
    with pytest.raises(KeyError):
        nvml.nvmlDeviceGetName("h")
    assert nvml.stuck is None


def test_doctor_reports_nvml_not_answering_instead_of_hanging(monkeypatch, short_deadline):
    monkeypatch.setitem(sys.modules, "pynvml", stuck_nvml())
    started = time.monotonic()
    snapshot = within(DEADLINE + MARGIN, probe.snapshot)
    assert snapshot.driver.nvml_timeout_s == DEADLINE
    assert snapshot.gpus != []  # unknown, not "no GPU"
    assert any(note.startswith("NVML did not answer within 0.3 s") for note in snapshot.notes)
    assert snapshot.torch.version and snapshot.torch.cuda_available is None  # torch asks NVML
    assert "torch's CUDA state not read: NVML does not answer" in " ".join(snapshot.notes)
    result = within(DEADLINE + MARGIN, lambda: CliRunner().invoke(main, ["doctor"]))
    assert time.monotonic() - started < 2 * (DEADLINE + MARGIN)
    assert result.exit_code == 1, result.output
    assert "TU204 NVML did not answer within 0.3 s" in result.output


def test_a_query_that_stops_answering_leaves_the_gpus_unknown(monkeypatch, short_deadline):
    fake = stuck_nvml(nvmlInit=lambda: None, nvmlSystemGetDriverVersion=lambda: "580.65.06",
                      nvmlSystemGetCudaDriverVersion=lambda: 13000,
                      nvmlDeviceGetCount=never_returns)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    notes: list[str] = []
    driver, gpus = within(DEADLINE + MARGIN, lambda: nvidia.probe_nvidia(notes))
    assert (driver.version, driver.nvml_timeout_s, gpus) == ("580.65.06", DEADLINE, None)
    assert "NVML did not answer within 0.3 s (nvmlDeviceGetCount): the GPUs are unknown" in notes
    assert fake.shutdowns == 0


def test_torch_asking_nvml_itself_is_bounded_too(monkeypatch, short_deadline) -> None:
    """torch.cuda.device_count() loads libnvidia-ml and calls nvmlInit through ctypes."""
    import torch

    from tuneup.machine.probe import torch_build

    monkeypatch.setattr(torch.cuda, "device_count", never_returns)
    notes: list[str] = []
    build = within(DEADLINE + MARGIN, lambda: torch_build.probe_torch(notes))
    assert build.version == torch.__version__ and build.device_count is None
    assert "torch's CUDA state not read: NVML did not answer within 0.3 s " \
           "(torch.cuda.device_count())" in notes


def test_the_fingerprint_leaves_the_gpus_out_and_warns_once(monkeypatch, short_deadline):
    import torch

    from tuneup.settings import fingerprint

    monkeypatch.setattr(torch.cuda, "device_count", never_returns)  # never asked: no wait
    monkeypatch.setattr(torch.cuda, "is_available", never_returns)
    monkeypatch.setitem(sys.modules, "pynvml", stuck_nvml())
    monkeypatch.setattr(fingerprint, "_warned", [])
    with pytest.warns(UserWarning, match="NVML did not answer within 0.3 s") as caught:
        now = within(DEADLINE + MARGIN, fingerprint.current)
        again = within(1.0, fingerprint.current)  # stuck already: no second wait, no warning
    assert len(caught) == 1 and now == again
    assert not {"gpu_model", "gpu_count"} & set(now) and now["torch"]
    stored = {**now, "gpu_model": "NVIDIA H200", "gpu_count": 1, "driver": now.get("driver")}
    assert fingerprint.differences(stored, now) == []  # unknown is not "changed"


STUCK_PYNVML = """
import threading

def nvmlInit():
    threading.Event().wait()

def nvmlShutdown():
    raise SystemExit("nvmlShutdown was called into a stuck NVML")
"""

TRAIN = """
import torch
from tuneup import tuned_loop

model = torch.nn.Linear(4, 1)
loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
for batch in [torch.ones(8, 4)] * 3:
    with loop.step():
        loss = loop.model(batch).sum()
    loop.backward(loss)
print("trained")
"""


def test_a_tuned_run_trains_on_and_exits_with_nvml_stuck(tmp_path: Path) -> None:
    """The whole process: the settings' fingerprint check gives up on NVML, the run trains,
    and the interpreter exits although NVML's thread is still stuck."""
    from tuneup.settings import fingerprint, store
    from tuneup.settings.schema import Knobs, Settings

    fake_dir = tmp_path / "fake"
    fake_dir.mkdir()
    (fake_dir / "pynvml.py").write_text(STUCK_PYNVML)
    facts = fingerprint.current()  # this machine, as the run will see it
    settings_path = tmp_path / "train.tuneup.json"
    store.save(Settings(knobs=Knobs(cpu_threads=1), fingerprint=facts), settings_path)
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake_dir), *sys.path]),
           nvml_call.ENV: "0.5", store.ENV_PATH: str(settings_path)}
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "trained"
    assert done.stderr.count("NVML did not answer within 0.5 s") == 1, done.stderr
    assert "different machine" not in done.stderr  # the rest of the fingerprint matched
    assert time.monotonic() - started < 60


def test_the_watcher_opens_no_gpus_from_a_stuck_nvml(short_deadline) -> None:
    fake = stuck_nvml()
    reader, note = within(DEADLINE + 2, lambda: open_gpus(fake))
    assert reader is None
    assert note.startswith("NVML did not answer within 0.3 s (nvmlInit): no GPU figures")
    assert fake.shutdowns == 0


def test_a_gpu_that_stops_answering_mid_job_ends_its_figures_not_the_watcher(short_deadline):
    answers = {"utilisation": True}

    def utilisation(handle: Any) -> Any:
        if not answers["utilisation"]:
            never_returns()
        return types.SimpleNamespace(gpu=50, memory=10)

    fake = stuck_nvml(nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 1,
                      nvmlDeviceGetHandleByIndex=lambda index: ("gpu", index),
                      nvmlDeviceGetUtilizationRates=utilisation)
    fake.NVML_CLOCK_SM, fake.NVML_PCIE_UTIL_RX_BYTES, fake.NVML_PCIE_UTIL_TX_BYTES = 1, 0, 1
    fake.NVML_TEMPERATURE_GPU = 0
    reader, note = open_gpus(fake)
    assert note is None and reader.read(set())[0].utilization == 50.0
    answers["utilisation"] = False
    (sample,) = within(DEADLINE + 2, lambda: reader.read(set()))
    assert sample.utilization is None
    assert within(0.5, lambda: reader.read(set()))[0].utilization is None  # no second wait
    assert reader.note == ("NVML did not answer within 0.3 s (nvmlDeviceGetUtilizationRates): "
                           "no GPU figures from then on")
    within(0.5, reader.close)
    assert fake.shutdowns == 0


def test_watch_returns_after_its_job_with_nvml_stuck(tmp_path: Path) -> None:
    fake_dir = tmp_path / "fake"
    fake_dir.mkdir()
    (fake_dir / "pynvml.py").write_text(STUCK_PYNVML)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake_dir), *sys.path]),
           nvml_call.ENV: "0.5"}
    watch = [sys.executable, "-c", "from tuneup.cli import main; main()", "watch",
             "--interval", "0.2", "--format", "json", "--", sys.executable, "-c", "pass"]
    done = subprocess.run(watch, capture_output=True, text=True, env=env, timeout=60,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "NVML did not answer within 0.5 s (nvmlInit)" in done.stdout + done.stderr
