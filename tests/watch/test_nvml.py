"""The NVML seam: what a GPU reading becomes, unsupported queries, a machine without NVML or
without GPUs (one note, no error), and GPM's SM activity where the GPU has it."""

from __future__ import annotations

import pytest
from fake_nvml import FakeNvml, tick_clock
from watch_helpers import load

from tuneup.watch.nvml import open_gpus


def test_a_reading_in_nvml_units_becomes_a_sample_in_si_units():
    nvml = FakeNvml(load("copy-bound"))
    reader, note = open_gpus(nvml)
    nvml.advance()
    tick = nvml.ticks[0][0]
    (gpu,) = reader.read({4100})
    assert note is None and gpu.name == "NVIDIA A100-PCIE-40GB"
    assert gpu.power_w == tick["power_mw"] / 1000 and gpu.power_limit_w == 250.0
    assert gpu.pcie_rx_bytes_s == tick["rx_kbs"] * 1024
    assert gpu.pcie_link_bytes_s == pytest.approx(16 * 1969e6)  # PCIe 4.0 x16
    assert gpu.sm_clock_mhz == 1410 and gpu.sm_clock_max_mhz == 1410
    assert gpu.memory_total == 40 * 2**30 and gpu.job_memory == 22 * 2**30
    assert reader.read({999})[0].job_memory == 0  # the GPU's processes are not the job's


def test_queries_a_gpu_does_not_support_stay_unknown():
    recording = load("compute-bound")
    recording["devices"][0] = {"name": "GeForce GTX 1060", "memory_total": 6 * 2**30}
    recording["ticks"][0] = [{"util": 80, "memory_used": 2**30}]
    nvml = FakeNvml(recording)
    reader, _ = open_gpus(nvml)
    nvml.advance()
    (gpu,) = reader.read({1})
    assert gpu.utilization == 80 and gpu.memory_used == 2**30
    assert gpu.power_w is gpu.sm_clock_mhz is gpu.pcie_link_bytes_s is gpu.job_memory is None
    assert gpu.throttle_reasons == ()


def test_throttle_reason_bits_are_named():
    nvml = FakeNvml(load("throttled"))
    reader, _ = open_gpus(nvml)
    for _ in range(3):
        nvml.advance()
    assert reader.read(())[0].throttle_reasons == ("SwPowerCap", "SwThermalSlowdown")


def test_no_nvml_is_one_note():
    reader, note = open_gpus(FakeNvml({}, fail_init="NVML Shared Library Not Found"))
    assert reader is None
    assert note.startswith("NVML is not available (NVML Shared Library Not Found)")


def test_nvml_without_gpus_is_one_note_and_shuts_down():
    nvml = FakeNvml({"devices": []})
    reader, note = open_gpus(nvml)
    assert reader is None and note == "NVML sees no GPU: no GPU figures" and nvml.shut_down


def test_this_machine_answers_with_a_note_or_a_reader():
    reader, note = open_gpus()
    assert (reader is None) != (note is None)
    if reader is not None:
        reader.close()


# -- GPM: SM activity, occupancy and tensor activity (Hopper and newer) -------------------
def test_gpm_gives_sm_and_tensor_activity_between_two_reads(monkeypatch):
    tick_clock(monkeypatch)
    nvml = FakeNvml(load("host-bound-h100"))
    reader, _ = open_gpus(nvml)
    nvml.advance()
    (first,) = reader.read(())
    assert first.utilization == 99 and first.uuid.startswith("GPU-5c6e")
    assert first.sm_activity is first.sm_occupancy is first.tensor_activity is None  # one sample
    nvml.advance()
    (second,) = reader.read(())
    tick = nvml.ticks[1][0]
    assert (second.sm_activity, second.sm_occupancy, second.tensor_activity) == (
        tick["sm_active"], tick["sm_occupancy"], tick["tensor_active"])
    assert len(nvml.gpm_samples) == 2
    reader.close()
    assert nvml.gpm_samples == [] and nvml.shut_down  # the sample buffers are freed


def test_reads_within_gpm_s_100_ms_share_the_last_figures(monkeypatch):
    """The daemon reads the GPUs once per job in a tick: one GPM sample serves them all."""
    tick_clock(monkeypatch, seconds=0.03)
    nvml = FakeNvml(load("host-bound-h100"))
    reader, _ = open_gpus(nvml)
    nvml.advance()
    reader.read(())  # t = 0: the first sample
    nvml.advance()
    reader.read(())  # t = 0.03: too soon, no sample taken
    for _ in range(3):
        reader.read(())  # up to t = 0.12: the second sample, compared with the first
    assert nvml.gpm_calls == 1
    assert reader.read(())[0].sm_activity == nvml.ticks[1][0]["sm_active"]
    assert nvml.gpm_calls == 1


def test_a_gpu_without_gpm_leaves_its_figures_unknown(monkeypatch):
    tick_clock(monkeypatch)
    recording = load("host-bound-h100")
    recording["devices"][0]["gpm"] = False
    nvml = FakeNvml(recording)
    reader, _ = open_gpus(nvml)
    for _ in range(3):
        nvml.advance()
        (gpu,) = reader.read(())
    assert gpu.utilization == 99 and gpu.sm_activity is None and gpu.tensor_activity is None
    assert nvml.gpm_samples == [] and nvml.gpm_calls == 0


def test_an_nvml_module_without_gpm_leaves_its_figures_unknown(monkeypatch):
    tick_clock(monkeypatch)
    monkeypatch.delattr(FakeNvml, "nvmlGpmQueryDeviceSupport")  # an older nvidia-ml-py
    nvml = FakeNvml(load("host-bound-h100"))
    reader, note = open_gpus(nvml)
    for _ in range(2):
        nvml.advance()
        (gpu,) = reader.read(())
    assert note is None and gpu.utilization == 98 and gpu.sm_activity is None


def test_gpm_that_fails_once_is_turned_off_for_that_gpu(monkeypatch):
    tick_clock(monkeypatch)
    nvml = FakeNvml(load("host-bound-h100"), gpm_error="GPU is lost")
    reader, _ = open_gpus(nvml)
    for _ in range(4):
        nvml.advance()
        (gpu,) = reader.read(())
    assert gpu.utilization is not None and gpu.sm_activity is None
    assert nvml.gpm_calls == 1 and nvml.gpm_samples == []  # tried once, then freed
