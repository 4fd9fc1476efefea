"""NCCL rules."""

from __future__ import annotations

from doctor_helpers import categories, codes, cuda_torch, machine, only, run


def test_nccl_wheels_for_two_cuda_majors() -> None:
    snapshot = machine(
        {"installed": True, "importable": False},
        None,
        None,
        pip_packages={"nvidia-nccl-cu12": "2.29.3", "nvidia-nccl-cu13": "2.29.7"},
    )
    found = only(run(snapshot), "TU401")
    assert found.severity == "error"
    assert found.fix.startswith("pip uninstall -y nvidia-nccl-cu12")


def test_the_build_decides_which_nccl_wheel_stays() -> None:
    snapshot = machine(
        cuda_torch("2.2.2+cu121"),
        "550.54.14",
        None,
        pip_packages={"nvidia-nccl-cu11": "2.14.3", "nvidia-nccl-cu12": "2.19.3"},
    )
    assert only(run(snapshot), "TU401").fix.startswith("pip uninstall -y nvidia-nccl-cu11")


def test_one_nccl_wheel_is_fine() -> None:
    snapshot = machine(
        cuda_torch("2.8.0+cu128"), "570.124.04", None, pip_packages={"nvidia-nccl-cu12": "2.27.3"}
    )
    assert "nccl-problem" not in categories(run(snapshot))


def test_transport_switches_warn() -> None:
    snapshot = machine(
        cuda_torch("2.8.0+cu128"),
        "570.124.04",
        None,
        env={"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "0"},
    )
    found = only(run(snapshot), "TU403")
    assert found.severity == "warning" and "NCCL_P2P_DISABLE=1" in found.message


def test_missing_nccl_symbol_and_preloaded_library() -> None:
    snapshot = machine(
        cuda_torch("2.2.0+cu121"),
        "550.54.14",
        None,
        env={"LD_PRELOAD": "/opt/nccl/libnccl.so.2"},
        messages=["ImportError: libtorch_cuda.so: undefined symbol: ncclCommRegister"],
    )
    assert {"TU402", "TU404"} <= codes(run(snapshot))


def test_two_libnccl_versions_on_the_path() -> None:
    snapshot = machine(
        cuda_torch("2.2.0+cu121"), "550.54.14", None, nccl_versions=["2.18.1", "2.19.3"]
    )
    assert "TU404" in codes(run(snapshot))


def _with_wheels(version: str, wheels: dict[str, str]) -> object:
    snapshot = machine(cuda_torch(version), "550.54.14", ["NVIDIA A100-SXM4-80GB"] * 2)
    snapshot.pip_packages = {"torch": version, **wheels}
    return run(snapshot)


def test_a_single_nccl_wheel_for_another_cuda_major_is_an_error() -> None:
    for version, wheel in [("2.4.1+cu121", "nvidia-nccl-cu11"), ("2.9.0+cu130", "nvidia-nccl-cu12"),
                           ("2.2.0+cu118", "nvidia-nccl-cu12")]:
        found = [f for f in _with_wheels(version, {wheel: "2.21.5"}).findings if f.code == "TU405"]
        assert len(found) == 1 and found[0].severity == "error", (version, wheel)


def test_an_nccl_wheel_older_than_the_release_pin_is_a_warning() -> None:
    old = _with_wheels("2.3.1+cu121", {"nvidia-nccl-cu12": "2.18.1"})  # 2.3 pins 2.20.5
    assert "TU406" in codes(old)
    pinned = _with_wheels("2.3.1+cu121", {"nvidia-nccl-cu12": "2.20.5"})
    assert not {"TU405", "TU406", "TU407"} & codes(pinned)


def test_cuda_11_nccl_wheels_cannot_be_captured_in_graphs() -> None:
    for version in ("2.0.1+cu118", "2.2.0+cu118", "2.3.1+cu118"):
        found = [f for f in _with_wheels(version, {"nvidia-nccl-cu11": "2.19.3"}).findings
                 if f.code == "TU407"]
        assert len(found) == 1 and found[0].severity == "warning", version
    assert "TU407" not in codes(_with_wheels("2.2.0+cu121", {"nvidia-nccl-cu12": "2.19.3"}))


def test_a_cuda_build_on_windows_is_told_distributed_needs_gloo():
    from tuneup.doctor.readers import read_report
    from tuneup.doctor.rules import diagnose

    text = ("PyTorch version: 2.7.0+cu126\nCUDA used to build PyTorch: 12.6\n"
            "OS: Microsoft Windows 10 Home\n"
            "GPU models and configuration: GPU 0: NVIDIA GeForce GTX 1070\n")
    found = {f.code: f.severity for f in diagnose(read_report(text)).findings}
    assert found.get("TU410") == "info"
    linux = text.replace("Microsoft Windows 10 Home", "Ubuntu 22.04.4 LTS (x86_64)")
    assert "TU410" not in {f.code for f in diagnose(read_report(linux)).findings}


def _two_5090s(version: str, **extra) -> object:
    torch = {"version": version, "build": "cuda", "cuda": "12.8", "cuda_available": True}
    return machine(torch, "570.124.06", ["NVIDIA GeForce RTX 5090"] * 2, **extra)


def test_ngc_container_nccl_too_old_for_two_consumer_blackwell_gpus() -> None:
    """NGC 25.02 ships NCCL 2.25.1, whose collectives fail between RTX 5090s (NVIDIA/nccl#1637)."""
    found = only(run(_two_5090s("2.7.0a0+ecf3bae40a.nv25.02")), "TU411")
    assert found.severity == "warning" and found.category == "nccl-problem"
    assert "NCCL 2.25.1" in found.message and "container 25.02" in found.message
    assert "2.26.2" in found.fix


def test_ncclmaxsharedmem_in_the_log_makes_it_an_error() -> None:
    snapshot = _two_5090s("2.7.0a0+ecf3bae40a.nv25.2",  # pip's normalised form of .nv25.02
                          messages=["NCCL INFO ncclMaxSharedMem 82240 exceeds device/fn "
                                    "maxSharedMem 79856"])
    assert only(run(snapshot), "TU411").severity == "error"


def test_the_nccl_wheel_decides_for_a_pip_torch() -> None:
    old = _two_5090s("2.7.0+cu128", pip_packages={"nvidia-nccl-cu12": "2.25.1"})
    assert "installed nvidia-nccl-cu12==2.25.1" in only(run(old), "TU411").message
    new = _two_5090s("2.7.0+cu128", pip_packages={"nvidia-nccl-cu12": "2.26.2"})
    assert "TU411" not in codes(run(new))


def test_a_newer_nccl_wheel_in_an_ngc_container_counts_only_when_preloaded() -> None:
    """An NGC torch loads the container's libnccl: a pip wheel beside it is not used unless
    LD_PRELOAD names it (the fix TU411 gives)."""
    wheel = {"nvidia-nccl-cu12": "2.26.5"}
    beside = _two_5090s("2.7.0a0+ecf3bae40a.nv25.02", pip_packages=wheel)
    assert "container 25.02" in only(run(beside), "TU411").message
    preloaded = _two_5090s("2.7.0a0+ecf3bae40a.nv25.02", pip_packages=wheel, env={
        "LD_PRELOAD": "/usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2"})
    assert "TU411" not in codes(run(preloaded))


def test_a_release_that_pins_a_fixed_nccl_is_fine() -> None:
    assert "TU411" not in codes(run(_two_5090s("2.7.1+cu128")))  # pins nvidia-nccl-cu12 2.26.2


def test_one_consumer_blackwell_gpu_or_other_gpus_need_no_collective() -> None:
    torch = {"version": "2.7.0a0+ecf3bae40a.nv25.02", "build": "cuda", "cuda": "12.8"}
    one = machine(torch, "570.124.06", ["NVIDIA GeForce RTX 5090"])
    ada = machine(torch, "570.124.06", ["NVIDIA GeForce RTX 4090"] * 2)
    assert "TU411" not in codes(run(one)) | codes(run(ada))


def test_windows_has_no_nccl_to_judge() -> None:
    snapshot = _two_5090s("2.7.0+cu128", pip_packages={"nvidia-nccl-cu12": "2.25.1"})
    snapshot.platform.os = "Microsoft Windows 11 Pro"
    assert "TU411" not in codes(run(snapshot))
