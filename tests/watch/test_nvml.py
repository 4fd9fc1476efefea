"""The NVML seam: what a GPU reading becomes, unsupported queries, and a machine without
NVML or without GPUs (one note, no error)."""

from __future__ import annotations

import pytest
from fake_nvml import FakeNvml
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
