"""Build rules: CPU-only builds and GPUs without kernels in the build."""

from __future__ import annotations

from doctor_helpers import categories, codes, cuda_torch, machine, only, run

from tuneup.doctor import knowledge as kb

from tuneup.machine.snapshot import GPU, Snapshot, TorchBuild


def test_blackwell_on_a_pre_cu128_build_is_arch_unsupported() -> None:
    found = only(
        run(machine(cuda_torch("2.5.1+cu121"), "590.48.01", ["NVIDIA GeForce RTX 5090"])), "TU101"
    )
    assert found.severity == "error"
    assert "12.0" in found.message and "sm_90" in found.message
    assert found.fix == kb.install_fix_text("2.14.1", "cu130")  # newest verified, stable variant


def test_blackwell_on_driver_580_names_the_stable_cu130_not_the_experimental_cu132() -> None:
    found = only(run(machine(cuda_torch("2.5.1+cu121"), "580.65.06", ["NVIDIA GeForce RTX 5080"])),
                 "TU101")
    assert "whl/cu130" in found.fix and "cu132" not in found.fix


def test_an_experimental_variant_only_where_no_stable_one_fits_and_then_said(monkeypatch) -> None:
    import dataclasses

    newest = kb.torch_release("2.14.1")
    only_experimental = dataclasses.replace(newest, experimental=newest.variants)
    installed = kb.torch_release("2.5.1")
    monkeypatch.setattr(kb, "releases", lambda: (installed, only_experimental))
    found = only(run(machine(cuda_torch("2.5.1+cu121"), "590.48.01", ["NVIDIA GeForce RTX 5090"])),
                 "TU101")
    assert "whl/cu132" in found.fix and "experimental in PyTorch's release matrix" in found.fix


def test_arch_list_from_torch_wins_over_tables() -> None:
    torch = {
        **cuda_torch("2.7.1+cu128"),
        "arch_list": ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"],
    }
    diagnosis = run(machine(torch, "570.124.04", ["NVIDIA GeForce RTX 5080"]))
    assert "arch-unsupported" not in categories(diagnosis)
    assert any("RTX 5080" in text for _, text in diagnosis.passed)


def test_pascal_dropped_by_cu128_gets_the_cu126_build_of_the_same_release() -> None:
    found = only(
        run(machine(cuda_torch("2.8.0+cu128"), "570.86.10", ["NVIDIA GeForce GTX 1080 Ti"])),
        "TU101",
    )
    assert (
        found.fix == kb.install_fix_text("2.8.0", "cu126")
    )


def test_same_major_binary_compatibility_is_healthy() -> None:
    for gpu, torch in [
        ("NVIDIA GeForce RTX 4090", "2.4.1+cu121"),
        ("NVIDIA GeForce MX150", "1.12.1+cu102"),
        ("NVIDIA GeForce RTX 3090", "2.0.1+cu117"),
    ]:
        diagnosis = run(machine(cuda_torch(torch), "550.54.14", [gpu]))
        assert "arch-unsupported" not in categories(diagnosis), (gpu, torch)


def test_hopper_on_cu117_has_no_kernels() -> None:
    assert "TU101" in codes(
        run(machine(cuda_torch("2.0.1+cu117"), "535.104.05", ["NVIDIA H100 80GB HBM3"]))
    )


def test_gpu_named_only_in_torch_warning_is_still_checked() -> None:
    snapshot = machine(
        cuda_torch("2.6.0+cu126"),
        "570.124.04",
        None,
        messages=[
            (
                "NVIDIA GeForce RTX 5090 with CUDA capability sm_120 is not compatible with the "
                "current PyTorch installation."
            )
        ],
    )
    assert "TU101" in codes(run(snapshot))


def test_unverified_arch_list_only_warns() -> None:
    found = only(
        run(machine(cuda_torch("1.9.0+cu102"), "470.42.01", ["NVIDIA A100-SXM4-40GB"])), "TU102"
    )
    assert found.severity == "warning"


def test_gpu_too_old_for_every_wheel_points_to_a_source_build() -> None:
    found = only(
        run(machine(cuda_torch("2.4.1+cu121"), "470.94", ["NVIDIA GeForce GTX 760"])), "TU101"
    )
    assert "TORCH_CUDA_ARCH_LIST=3.0" in found.fix


def test_cpu_build_with_an_nvidia_gpu_is_an_error_with_a_cuda_wheel_fix() -> None:
    snapshot = machine(
        {"version": "1.8.1", "build": "cpu", "cuda_available": False},
        "470.182.03",
        ["NVIDIA GeForce RTX 3090"],
        python="3.8.16",
    )
    found = only(run(snapshot), "TU103")
    assert found.severity == "error"
    assert found.fix.startswith(
        "pip install torch==1.8.1+cu111 -f https://download.pytorch.org/whl/torch_stable.html"
    )
    assert "cpuonly" in found.fix


def test_cpu_suffix_with_driver_only() -> None:
    found = only(run(machine({"version": "2.7.1+cpu"}, "535.104.05", None)), "TU103")
    assert (
        "cu128" in found.fix
    )  # newest 2.7 variant a 535 driver runs (12.x minor-version compatibility)


def test_cpu_build_next_to_a_cuda_toolkit_warns_when_gpus_are_unknown() -> None:
    snapshot = machine(
        {"version": "2.1.0.dev20230905", "build": "cpu"}, None, None, cuda_toolkit="11.8.89"
    )
    found = only(run(snapshot), "TU104")
    assert found.severity == "warning"
    assert "nightly/cu118" in found.fix


def test_cpu_build_on_a_machine_known_to_have_no_gpu_is_fine() -> None:
    snapshot = Snapshot(
        torch=TorchBuild(installed=True, version="2.13.0+cpu", build="cpu"),
        gpus=[],
        cuda_toolkit="13.0.88",
    )
    assert "cpu-only-build" not in categories(run(snapshot))


def test_torch_not_installed_suggests_a_wheel_for_the_gpu() -> None:
    snapshot = machine(
        {"installed": False}, "570.124.04", ["NVIDIA GeForce RTX 5090"], python="3.12.3"
    )
    found = only(run(snapshot), "TU105")
    assert found.severity == "info"
    assert "cu128" in found.fix


def test_unknown_build_is_listed_as_unchecked() -> None:
    snapshot = machine({"version": "2.1.0.dev20230905"}, "535.104.05", ["NVIDIA A100-SXM4-80GB"])
    diagnosis = run(snapshot)
    assert "arch-unsupported" not in categories(diagnosis)
    assert any("CUDA build" in text for _, text in diagnosis.unchecked)


def test_gpu_with_known_compute_capability_from_probe() -> None:
    snapshot = machine(cuda_torch("2.6.0+cu126"), "570.124.04", None)
    snapshot.gpus = [
        GPU(index=0, name="Some Future Board", vendor="nvidia", compute_capability="12.0")
    ]
    assert "TU101" in codes(run(snapshot))


def test_vendor_builds_are_not_judged_by_the_wheel_tables() -> None:
    ngc = {
        "version": "2.3.0a0+6ddf5cf85e.nv24.04",
        "build": "cuda",
        "cuda": "12.4",
        "cuda_available": True,
    }
    diagnosis = run(machine(ngc, "550.54.15", ["NVIDIA GeForce RTX 4090"]))
    assert "arch-unsupported" not in categories(diagnosis)
    assert any("arch list" in text for _, text in diagnosis.unchecked)
    # ... but its CUDA 12.4 toolkit cannot target sm_120, whatever the container ships
    blackwell = run(machine(ngc, "550.54.15", ["NVIDIA GeForce RTX 5090"]))
    assert {f.code for f in blackwell.findings if f.category == "arch-unsupported"} == {"TU106"}


def test_unsuffixed_windows_wheel_that_sees_the_gpu_is_not_called_cpu_only() -> None:
    torch = {"version": "2.4.1", "cuda_available": True}
    diagnosis = run(
        machine(torch, "551.86", ["NVIDIA GeForce RTX 4070"], os="Microsoft Windows 11 Pro")
    )
    assert "cpu-only-build" not in categories(diagnosis)


def test_unsuffixed_windows_wheel_with_a_gpu_is_probably_cpu_only() -> None:
    found = only(
        run(
            machine(
                {"version": "2.4.1"},
                "551.86",
                ["NVIDIA GeForce RTX 4070"],
                os="Microsoft Windows 11 Pro",
            )
        ),
        "TU103",
    )
    assert found.severity == "warning" and "cu124" in found.fix


def test_old_nvidia_smi_names_without_vendor_prefix_count_as_nvidia() -> None:
    found = only(run(machine(cuda_torch("2.0.1+cu117"), "525.85.12", ["H100 PCIe"])), "TU101")
    assert "9.0" in found.message


def test_new_style_capability_warning_names_the_gpu() -> None:
    snapshot = machine(
        cuda_torch("2.9.0+cu128"),
        "580.82.07",
        None,
        messages=[
            "Found GPU0 NVIDIA GeForce GTX 1080 Ti which is of cuda capability 6.1.",
            "Minimum and Maximum cuda capability supported by this version of PyTorch is (7.0) - (12.0)",
        ],
    )
    assert "cu126" in only(run(snapshot), "TU101").fix


def test_no_kernel_image_error_without_gpu_facts_warns() -> None:
    snapshot = machine(
        cuda_torch("2.8.0+cu128"),
        None,
        None,
        messages=[
            "RuntimeError: CUDA error: no kernel image is available for execution on the device"
        ],
    )
    assert only(run(snapshot), "TU102").severity == "warning"


# A toolkit targets a range of architectures (architectures.csv first_cuda..last_cuda): a build
# whose arch list is unknown (nightly, dev, source) still cannot cover a GPU outside the range.
TOOLKIT_CASES = [  # (GPU, CUDA of the build, whether the toolkit can target the GPU)
    ("NVIDIA GeForce RTX 5090", "12.1", False),
    ("NVIDIA GeForce RTX 5070 Ti", "12.6", False),
    ("NVIDIA GeForce RTX 5090", "12.8", True),
    ("NVIDIA B200", "12.4", False),
    ("NVIDIA H100 80GB HBM3", "11.7", False),
    ("NVIDIA H100 80GB HBM3", "12.1", True),
    ("Tesla K80", "12.1", False),
    ("Tesla K80", "11.8", True),
    ("NVIDIA GeForce GTX 1080 Ti", "13.0", False),
    ("Tesla V100-SXM2-32GB", "13.0", False),
    ("NVIDIA GeForce RTX 3090", "13.0", True),
    ("NVIDIA GeForce RTX 4090", "11.8", True),
]


def test_the_toolkit_settles_builds_without_a_known_arch_list() -> None:
    for gpu, cuda, targets in TOOLKIT_CASES:
        tag = "cu" + cuda.replace(".", "")
        for version in (f"2.9.0.dev20250601+{tag}", "2.4.0a0+git1234abc"):
            torch = {"version": version, "build": "cuda", "cuda": cuda, "cuda_available": True}
            diagnosis = run(machine(torch, "590.48.01", [gpu]))
            found = [f for f in diagnosis.findings if f.code == "TU106"]
            assert bool(found) is not targets, (gpu, version, [f.code for f in diagnosis.findings])
            if found:
                assert found[0].severity == "error" and f"CUDA {cuda}" in found[0].message
                assert found[0].fix


def test_the_toolkit_rule_stays_out_when_the_arch_list_is_known() -> None:
    torch = {**cuda_torch("2.5.1+cu121"), "arch_list": ["sm_80", "sm_86", "sm_90"]}
    diagnosis = run(machine(torch, "590.48.01", ["NVIDIA GeForce RTX 5090"]))
    assert "TU106" not in codes(diagnosis) and "TU101" in codes(diagnosis)


def test_a_cc_guessed_from_the_gpu_series_only_warns_and_says_so() -> None:
    # an unlisted model of a listed series: its CC comes from the family table
    for torch, gpu in [("2.8.0+cu128", "NVIDIA GeForce GTX 1077"),
                       ("2.5.1+cu121", "NVIDIA GeForce RTX 5055")]:
        diagnosis = run(machine(cuda_torch(torch), "590.48.01", [gpu]))
        found = [f for f in diagnosis.findings if f.category == "arch-unsupported"]
        assert found and all(f.severity == "warning" for f in found), (torch, gpu)
        assert "guessed from its series" in found[0].message


def test_the_install_fix_covers_every_gpu_of_the_machine_and_names_uv_too() -> None:
    """An Ampere card beside a Blackwell one: the wheel named has kernels for both, not only
    for the GPU the finding is about (uv's --torch-backend=auto looks at the driver only)."""
    import re

    found = only(run(machine(cuda_torch("2.5.1+cu121"), "590.48.01",
                             ["NVIDIA GeForce RTX 5090", "NVIDIA GeForce RTX 3090"])), "TU101")
    pip = re.search(r"torch==(\S+) --index-url https://download.pytorch.org/whl/(\w+)", found.fix)
    assert pip and f"uv pip install torch=={pip.group(1)} --torch-backend={pip.group(2)}" in found.fix
    row = kb.variant(".".join(pip.group(1).split(".")[:2]), pip.group(2))
    assert row is not None
    assert all(kb.arch_covers(row.arches, row.ptx, cc) for cc in ("12.0", "8.6"))


def test_gpus_no_single_wheel_covers_get_one_environment_each() -> None:
    found = only(run(machine(cuda_torch("2.5.1+cu121"), "590.48.01",
                             ["NVIDIA GeForce RTX 5090", "NVIDIA GeForce GTX 1080 Ti"])), "TU101")
    assert "no single published wheel has kernels for every GPU" in found.fix
    assert 'TORCH_CUDA_ARCH_LIST="12.0;6.1"' in found.fix or 'TORCH_CUDA_ARCH_LIST="6.1;12.0"' in found.fix
    assert "--torch-backend=" in found.fix
