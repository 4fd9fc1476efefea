"""The compatibility tables and lookups."""

from __future__ import annotations

import csv

import pytest

from tuneup.doctor import knowledge as kb
from tuneup.machine import versions


@pytest.mark.parametrize("table", sorted(p.name for p in kb.DATA_DIR.glob("*.csv")))
def test_every_row_names_its_source(table: str) -> None:
    with open(kb.DATA_DIR / table, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert rows
    for row in rows:
        assert row["source"].strip(), row
        if "status" in row:
            assert row["status"] in ("verified", "UNVERIFIED"), row


def test_release_dates_increase_with_the_release() -> None:
    """A date typed into the wrong row (or month) breaks the order TU706 compares against."""
    with open(kb.DATA_DIR / "torch_release_dates.csv", newline="") as handle:
        rows = sorted(csv.DictReader(handle), key=lambda r: versions.major_minor(r["release"]))
    dates = [r["date"] for r in rows]
    assert dates == sorted(dates) and len(set(dates)) == len(dates), dates
    assert kb.release_date("2.2") == ("2024-01-30", True)


@pytest.mark.parametrize(
    ("cuda", "os_family", "floor", "mvc"),
    [
        ("11.3", "linux", "450.80.02", True),
        ("12.8", "linux", "525.60.13", True),
        ("13.0", "linux", "580.65.06", True),
        ("10.1", "linux", "418.39", False),
        ("10.2", "windows", "441.22", False),
    ],
)
def test_driver_requirement_respects_minor_version_compatibility(
    cuda, os_family, floor, mvc
) -> None:
    need = kb.driver_requirement(cuda, os_family)
    assert need is not None
    assert (need.floor_driver, need.minor_version_compat) == (floor, mvc)


def test_toolkit_driver_and_branch_lookups() -> None:
    assert kb.driver_requirement("11.3", "linux").ga_driver == "465.19.01"
    assert kb.max_cuda_for_driver("470.182.03") == "11.4"
    assert kb.max_cuda_for_driver("570.124.04") == "12.8"
    assert kb.max_cuda_for_driver("460.32.03") == "11.2"
    assert kb.driver_branch("535.104.05") == "R535"


@pytest.mark.parametrize(
    ("name", "cc"),
    [
        ("NVIDIA GeForce RTX 5090 D", "12.0"),
        ("NVIDIA GeForce RTX 4090", "8.9"),
        ("NVIDIA GeForce RTX 3060 Laptop GPU", "8.6"),
        ("NVIDIA A100-SXM4-80GB", "8.0"),
        ("NVIDIA A10G", "8.6"),
        ("Tesla V100-SXM2-16GB", "7.0"),
        ("NVIDIA GeForce GTX 1080 Ti", "6.1"),
        ("NVIDIA GeForce MX150", "6.1"),
        ("Tesla T4", "7.5"),
        ("NVIDIA H100 80GB HBM3", "9.0"),
        ("NVIDIA GB10", "12.1"),
        ("Tesla K80", "3.7"),
    ],
)
def test_gpu_names_map_to_compute_capability(name: str, cc: str) -> None:
    assert kb.compute_capability(name) == cc


def test_unknown_gpu_has_no_compute_capability() -> None:
    assert kb.compute_capability("Matrox G200eW") is None
    assert kb.compute_capability(None) is None


@pytest.mark.parametrize(
    ("sass", "ptx", "cc", "covered"),
    [
        (["sm_80", "sm_86"], [], "8.9", True),  # same major, newer minor
        (["sm_86"], [], "8.0", False),  # never a lower minor
        (["sm_80", "sm_86", "sm_90"], [], "12.0", False),  # never across majors
        (["sm_80"], ["compute_120"], "12.1", True),  # PTX JITs forward within its major
        (["sm_37", "sm_75"], ["compute_37"], "12.0", False),  # old-major PTX is not counted
        (["sm_120"], [], "12.1", True),  # GB10 runs sm_120
        (["sm_60"], [], "6.1", True),
        (["sm_70", "sm_75"], [], "6.1", False),
        (["sm_80", "sm_86"], [], "8.7", False),  # Jetson Orin needs its own target
        (["sm_90a"], [], "9.0", True),
        (["9.0", "10.0"], ["12.0"], "12.0", True),  # table form
    ],
)
def test_arch_coverage(sass, ptx, cc, covered) -> None:
    assert kb.arch_covers(sass, ptx, cc) is covered


@pytest.mark.parametrize(
    ("version", "default"),
    [
        ("1.3.0", "cu101"),
        ("2.1.0", "cu121"),
        ("2.4.1", "cu121"),
        ("2.8.0", "cu128"),
        ("2.11.0", "cu130"),
    ],
)
def test_pypi_default_variant(version: str, default: str) -> None:
    release = kb.torch_release(version)
    assert kb.default_variant(release, "linux")[0] == default
    assert kb.default_variant(release, "darwin") == ("cpu", True)


def test_variant_tables() -> None:
    assert kb.variant("2.7", "cu128").arches[0] == "7.5"
    assert kb.variant("2.7", "cu128").ptx == ("12.0",)
    assert "6.1" in kb.variant("2.7", "cu128", "windows").arches
    assert "6.1" not in kb.variant("2.8", "cu128", "windows").arches
    fallback = kb.variant("2.6", "cu126", "windows")
    assert fallback.platform == "windows" and not fallback.verified
    assert kb.variant("2.1", "cu121").cudnn == "8.9.2"
    assert kb.variant("2.1", "cu121").cuda == "12.1"
    assert kb.variant("2.9", "cu130").nccl == "2.27.7"


def test_release_python_ranges() -> None:
    assert kb.python_supported(kb.torch_release("1.10.1"), "3.9.7")
    assert not kb.python_supported(kb.torch_release("1.10.1"), "3.10.1")
    assert not kb.python_supported(kb.torch_release("2.1.0"), "3.12.0")
    assert kb.python_supported(kb.torch_release("2.2.0"), "3.12.0")


def test_every_listed_variant_has_a_linux_row() -> None:
    for release in kb.releases():
        for name in release.variants:
            assert kb.variant(release.release, name) is not None, (release.release, name)


def test_hardware_features() -> None:
    assert kb.hardware_features("8.9") == {"bf16": True, "tf32": True, "fp8": True}
    assert kb.hardware_features("8.6") == {"bf16": True, "tf32": True, "fp8": False}
    assert kb.hardware_features("7.5") == {"bf16": False, "tf32": False, "fp8": False}


def test_version_helpers() -> None:
    assert versions.cuda_from_tag("cu92") == "9.2"
    assert versions.cuda_from_tag("cu130") == "13.0"
    assert versions.cuda_tag("12.1") == "cu121"
    assert kb.cc_tuple("sm_120") == (12, 0)
    assert kb.cc_tuple("compute_90") == (9, 0)
    assert kb.install_command("1.8.1", "cu111").endswith(
        "-f https://download.pytorch.org/whl/torch_stable.html"
    )
    assert (
        kb.install_command("2.7.1", "cu128")
        == "pip install torch==2.7.1 --index-url https://download.pytorch.org/whl/cu128"
    )
