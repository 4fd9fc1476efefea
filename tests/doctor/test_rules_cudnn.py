"""cuDNN rules: a loaded cuDNN against the compiled one; a mere listing is not evidence."""

from __future__ import annotations

from doctor_helpers import categories, codes, cuda_torch, machine, only, run

from tuneup.machine.snapshot import LibraryVersion
from tuneup.machine.versions import distinct_versions

SYSTEM_CUDNN = [
    "/usr/local/cuda-11.4/targets/x86_64-linux/lib/libcudnn.so.8",
    "/usr/local/cuda-11.4/targets/x86_64-linux/lib/libcudnn_ops_infer.so.8",
]


def test_listed_system_cudnn_next_to_a_pip_wheel_is_not_a_mismatch() -> None:
    snapshot = machine(
        cuda_torch("1.9.0+cu102"),
        "470.42.01",
        ["NVIDIA GeForce MX150"],
        cudnn_libraries=SYSTEM_CUDNN,
    )
    assert "cudnn-mismatch" not in categories(run(snapshot))


def test_stated_older_runtime_cudnn_is_a_mismatch() -> None:
    snapshot = machine(cuda_torch("1.12.0+cu113"), None, None, cudnn_libraries=["8.0.3"])
    found = only(run(snapshot), "TU301")
    assert found.severity == "error"
    assert "8.0.3" in found.message and "8.3.2" in found.message


def test_pip_cudnn_wheel_gives_the_compiled_version() -> None:
    snapshot = machine(
        {"installed": None},
        None,
        None,
        cudnn_libraries=["9.13.1"],
        pip_packages={"nvidia-cudnn-cu12": "9.20.0"},
    )
    assert "9.20.0" in only(run(snapshot), "TU301").message


def test_newer_runtime_minor_is_fine_but_other_major_is_not() -> None:
    newer = machine(
        {**cuda_torch("2.4.1+cu121"), "cudnn_compiled": "9.1.0", "cudnn_runtime": "9.5.1"},
        "550.54.14",
        None,
    )
    assert "cudnn-mismatch" not in categories(run(newer))
    other = machine(
        {**cuda_torch("2.4.1+cu121"), "cudnn_compiled": "9.1.0", "cudnn_runtime": "8.9.7"},
        "550.54.14",
        None,
    )
    assert "different major" in only(run(other), "TU301").message


def test_torch_error_text_and_ld_library_path_fix() -> None:
    snapshot = machine(
        cuda_torch("1.12.0+cu113"),
        "510.47.03",
        None,
        env={"LD_LIBRARY_PATH": "/public/apps/cudnn/v8.0.3.33-cuda.11.0/cuda/lib64:/usr/lib"},
        messages=[
            (
                "RuntimeError: cuDNN version incompatibility: PyTorch was compiled  against (8, 3, 2) "
                "but linked against (8, 0, 3)"
            )
        ],
    )
    found = only(run(snapshot), "TU301")
    assert "/public/apps/cudnn/v8.0.3.33-cuda.11.0/cuda/lib64" in found.fix


def test_system_cudnn_on_ld_library_path_counts_as_loaded() -> None:
    snapshot = machine(
        cuda_torch("2.1.0+cu121"),
        "535.104.05",
        None,
        cudnn_libraries=["/opt/cudnn/lib/libcudnn.so.8.2.1"],
        env={"LD_LIBRARY_PATH": "/opt/cudnn/lib"},
    )
    assert "8.2.1" in only(run(snapshot), "TU301").message


def test_cudnn_directory_on_ld_library_path_without_versions_warns() -> None:
    snapshot = machine(
        cuda_torch("2.1.0+cu121"), "535.104.05", None, env={"LD_LIBRARY_PATH": "/opt/cudnn-8/lib"}
    )
    assert only(run(snapshot), "TU302").severity == "warning"


def test_new_cudnn_drops_pre_turing_gpus() -> None:
    snapshot = machine(
        {**cuda_torch("2.9.1+cu130"), "cudnn_compiled": "9.13.0"},
        "580.82.07",
        ["Tesla V100-SXM2-16GB"],
    )
    assert only(run(snapshot), "TU303").severity == "warning"


def _with_system_cudnn(torch: dict, system: list[str], pip: dict | None = None) -> object:
    snapshot = machine(torch, "550.54.14", ["NVIDIA GeForce RTX 4090"])
    snapshot.cudnn_libraries = system
    snapshot.cudnn_versions = distinct_versions(system)
    snapshot.pip_packages = pip
    return run(snapshot)


def test_a_system_cudnn_of_the_same_major_beside_the_pip_one_is_two_builds() -> None:
    cases = [  # (torch, system cuDNN entries, pip packages)
        (cuda_torch("2.6.0+cu126"), ["/usr/lib/x86_64-linux-gnu/libcudnn.so.9.8.0"], None),
        (cuda_torch("2.12.1+cu130"), ["9.23.2"], {"nvidia-cudnn-cu13": "9.20.0.48"}),
    ]
    for torch, system, pip in cases:
        found = [f for f in _with_system_cudnn(torch, system, pip).findings if f.code == "TU304"]
        assert len(found) == 1 and found[0].severity == "warning", (torch, system)


def test_no_two_builds_finding_for_another_major_the_same_version_or_conda() -> None:
    other_major = _with_system_cudnn(cuda_torch("2.6.0+cu126"), ["/usr/lib/libcudnn.so.8.9.7"])
    assert "TU304" not in codes(other_major)
    same = _with_system_cudnn(
        cuda_torch("2.6.0+cu126"), ["9.5.1.17"], {"nvidia-cudnn-cu12": "9.5.1.17"}
    )
    assert "TU304" not in codes(same)
    snapshot = machine(cuda_torch("2.6.0+cu126"), "550.54.14", ["NVIDIA GeForce RTX 4090"])
    snapshot.cudnn_libraries = ["/usr/lib/x86_64-linux-gnu/libcudnn.so.9.8.0"]
    snapshot.conda_packages = {"pytorch": "2.6.0", "cudnn": "9.8.0"}
    assert "TU304" not in codes(run(snapshot))  # conda's torch links the conda cuDNN


SONAME = "/lib/x86_64-linux-gnu/libcudnn.so.9"
H200_TORCH = {**cuda_torch("2.11.0+cu130"), "cudnn_compiled": "9.19.0",
              "cudnn_runtime": "9.19.0"}


def _live(read: str | None, torch: dict = H200_TORCH) -> object:
    """A live probe's snapshot: the system cuDNN listed by soname, its version as read."""
    snapshot = machine(torch, "580.159.04", ["NVIDIA H200"])
    snapshot.cudnn_libraries = [SONAME]
    snapshot.cudnn_versions = distinct_versions([SONAME])
    snapshot.cudnn_library_versions = (
        [LibraryVersion(SONAME, read, "cudnnGetVersion")] if read else [])
    return run(snapshot)


def test_a_system_cudnn_of_the_version_torch_loads_is_no_warning() -> None:
    diagnosis = _live("9.19.0")  # the H200 image: same soname, same version
    assert "TU304" not in codes(diagnosis)
    assert ("cudnn", f"the system cuDNN 9.19.0 ({SONAME}) is the version torch loads") \
        in diagnosis.passed


def test_a_system_cudnn_read_at_another_version_is_two_builds() -> None:
    found = only(_live("9.8.0"), "TU304")
    assert found.severity == "warning"
    assert "torch loads cuDNN 9.19.0 (torch.backends.cudnn.version())" in found.message
    assert f"the system has cuDNN 9.8.0 ({SONAME})" in found.message


def test_a_system_cudnn_of_unknown_version_is_only_a_note() -> None:
    nightly = {"version": "2.13.0.dev20260521+cu130", "build": "cuda", "cuda": "13.0"}
    for diagnosis in (_live(None), _with_system_cudnn(
            nightly, ["/lib/x86_64-linux-gnu/libcudnn_engines_tensor_ir.so.9"])):
        found = only(diagnosis, "TU304")
        assert found.severity == "info"
        assert "its full version could not be read" in found.message
        assert "cudnnGetVersion" in found.fix
