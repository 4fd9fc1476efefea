"""Performance rules and the CPU-side facts."""

from __future__ import annotations

from doctor_helpers import categories, codes, cuda_torch, machine, only, run

from tuneup.machine.snapshot import CPU, GPU, Driver, Platform, Snapshot, TorchBuild

GIB = 2**30


def live_gpu_machine(gpus: list[GPU], cpu: CPU) -> Snapshot:
    return Snapshot(
        platform=Platform(python_version="3.12.3", os_family="linux"),
        torch=TorchBuild(
            installed=True,
            version="2.8.0+cu128",
            build="cuda",
            cuda="12.8",
            cuda_available=True,
            device_count=len(gpus),
        ),
        driver=Driver(version="570.124.04"),
        gpus=gpus,
        cpu=cpu,
    )


def h100(index: int, **fields) -> GPU:
    return GPU(
        index=index,
        name="NVIDIA H100 80GB HBM3",
        vendor="nvidia",
        compute_capability="9.0",
        **fields,
    )


def test_link_persistence_throttling_and_ecc() -> None:
    gpu = h100(
        0,
        pcie_width_current=8,
        pcie_width_max=16,
        pcie_gen_current=1,
        pcie_gen_max=5,
        persistence_mode=False,
        throttle_reasons=["SwThermalSlowdown", "GpuIdle"],
        ecc_uncorrected_errors=3,
    )
    diagnosis = run(live_gpu_machine([gpu], CPU(usable_cores=32, shm_total_bytes=64 * GIB)))
    assert {"TU801", "TU802", "TU803", "TU804", "TU807"} <= codes(diagnosis)
    assert "GpuIdle" not in only(diagnosis, "TU804").message
    assert only(diagnosis, "TU802").severity == "info"


def test_healthy_gpu_has_no_performance_warning() -> None:
    gpu = h100(
        0,
        pcie_width_current=16,
        pcie_width_max=16,
        persistence_mode=True,
        throttle_reasons=["GpuIdle"],
    )
    diagnosis = run(live_gpu_machine([gpu], CPU(usable_cores=32, shm_total_bytes=64 * GIB)))
    assert diagnosis.warnings == 0 and diagnosis.errors == 0
    assert "gpu-features" in categories(diagnosis)


def test_cores_per_gpu_use_the_usable_count_not_the_logical_one() -> None:
    gpus = [h100(i) for i in range(8)]
    diagnosis = run(
        live_gpu_machine(gpus, CPU(logical_cores=128, usable_cores=16, shm_total_bytes=64 * GIB))
    )
    assert "2.0 per GPU" in only(diagnosis, "TU805").message


def test_docker_default_shm_is_too_small() -> None:
    diagnosis = run(live_gpu_machine([h100(0)], CPU(usable_cores=16, shm_total_bytes=64 * 2**20)))
    found = only(diagnosis, "TU806")
    assert "--shm-size" in found.fix and "64 MiB" in found.message


def test_cpu_only_machine_reports_the_cpu_facts_that_matter() -> None:
    snapshot = Snapshot(
        platform=Platform(python_version="3.11.7", os_family="linux"),
        torch=TorchBuild(installed=True, version="2.13.0+cpu", build="cpu", cuda_available=False),
        driver=Driver(),
        gpus=[],
        cpu=CPU(
            model="Xeon",
            flags=["avx2", "avx512f", "avx512_bf16", "amx_bf16"],
            logical_cores=4,
            usable_cores=2,
            shm_total_bytes=8 * GIB,
        ),
    )
    diagnosis = run(snapshot)
    assert {"TU901", "TU902", "TU903", "TU904"} <= codes(diagnosis)
    assert "native bf16" in only(diagnosis, "TU902").message
    assert "of 4" in only(diagnosis, "TU903").message
    assert diagnosis.errors == 0 and diagnosis.warnings == 0


def test_cpu_without_bf16_and_small_shm() -> None:
    snapshot = Snapshot(
        torch=TorchBuild(installed=True, version="2.13.0+cpu", build="cpu"),
        gpus=[],
        cpu=CPU(flags=["avx2"], usable_cores=8, shm_total_bytes=64 * 2**20),
    )
    diagnosis = run(snapshot)
    assert "keep fp32" in only(diagnosis, "TU902").fix
    assert only(diagnosis, "TU904").severity == "warning"


def test_report_without_gpu_lines_does_not_claim_no_gpu() -> None:
    diagnosis = run(machine({"version": "2.4.1+cpu", "build": "cpu"}, None, None))
    assert "no-nvidia-gpu" not in categories(diagnosis)
    assert any(area == "cpu" for area, _ in diagnosis.unchecked)


def test_gpu_report_has_no_cpu_section() -> None:
    diagnosis = run(machine(cuda_torch("2.4.1+cu121"), "550.54.14", ["Tesla T4"]))
    assert not {"TU901", "TU902"} & codes(diagnosis)
