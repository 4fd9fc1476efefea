"""TU605: ROCm wheel lines and the gfx targets they ship, against AMD GPUs."""

from __future__ import annotations

import csv
import re

import pytest
from doctor_helpers import codes, machine, only, run

from tuneup.doctor import knowledge as kb
from tuneup.doctor import rocm_tables
from tuneup.doctor.readers import read_report
from tuneup.doctor.rules import diagnose
from tuneup.machine import versions
from tuneup.machine.snapshot import GPU, Snapshot


def _rows(table: str) -> list[dict[str, str]]:
    with open(kb.DATA_DIR / table, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _rocm(torch: str, gpus: list[str], hip: str | None = "6.2.41133", **extra) -> Snapshot:
    return machine({"version": torch, "build": "rocm", "hip": hip}, None, gpus, os="Linux", **extra)


def _with_arch(torch: str, arch: str, name: str = "AMD Radeon Graphics") -> Snapshot:
    snapshot = _rocm(torch, [name])
    snapshot.gpus = [GPU(index=0, name=name, vendor="amd", arch=arch)]
    return snapshot


def _tu605(snapshot: Snapshot, **requested: str):
    found = [f for f in run(snapshot, **requested).findings if f.code == "TU605"]
    assert len(found) <= 1, found
    return found[0] if found else None


# ---------------------------------------------------------------- the tables


@pytest.mark.parametrize("table", ["rocm_targets.csv", "amd_gpus.csv"])
def test_every_row_has_a_source_and_a_status(table: str) -> None:
    rows = _rows(table)
    assert rows
    for row in rows:
        assert row["source"].strip(), row
        assert row["status"] in ("verified", "UNVERIFIED"), row


def test_every_gfx_in_the_gpu_table_is_a_valid_target() -> None:
    for row in _rows("amd_gpus.csv"):
        assert rocm_tables.GFX_TARGET.fullmatch(row["gfx"]), row
        re.compile(row["pattern"])  # a broken pattern fails here, not at lookup time


def test_every_wheel_line_row_is_well_formed() -> None:
    known = {release.release for release in kb.releases()}
    seen: set[tuple[str, str]] = set()
    for row in _rows("rocm_targets.csv"):
        assert re.fullmatch(r"rocm\d+(?:\.\d+)+", row["variant"]), row
        targets = row["targets"].split()
        assert targets and len(targets) == len(set(targets)), row
        assert all(rocm_tables.GFX_TARGET.fullmatch(t) for t in targets), row
        assert row["torch"].split(), row
        for release in row["torch"].split():
            assert release in known, row
            assert (row["variant"], release) not in seen, row  # one list per line and release
            seen.add((row["variant"], release))


def test_verified_lines_only_grow_with_rocm_and_torch() -> None:
    """Within verified rows, a newer line of the wheels never drops a target an older one had."""
    rows = [r for r in rocm_tables.rocm_lines() if r.verified]
    rows.sort(
        key=lambda r: (versions.release(r.rocm), max(versions.major_minor(x) for x in r.releases))
    )
    for older, newer in zip(rows, rows[1:]):
        assert set(older.targets) <= set(newer.targets), (older.variant, newer.variant)


NAMES = [
    ("AMD Instinct MI355X", "gfx950"),
    ("AMD Instinct MI350X", "gfx950"),
    ("AMD Instinct MI325X", "gfx942"),
    ("AMD Instinct MI300X", "gfx942"),
    ("AMD Instinct MI300X VF", "gfx942"),
    ("AMD Instinct MI300A", "gfx942"),
    ("AMD Instinct MI250X", "gfx90a"),
    ("AMD Instinct MI250X / MI250", "gfx90a"),
    ("AMD Instinct MI250", "gfx90a"),
    ("AMD Instinct MI210", "gfx90a"),
    ("AMD Instinct MI100", "gfx908"),
    ("AMD Radeon Instinct MI60", "gfx906"),
    ("AMD Radeon Instinct MI50 32GB", "gfx906"),
    ("Radeon Instinct MI25", "gfx900"),
    ("Radeon Instinct MI8", "gfx803"),
    ("AMD Radeon PRO W7900", "gfx1100"),
    ("AMD Radeon PRO W7900 Dual Slot", "gfx1100"),
    ("AMD Radeon PRO W7800", "gfx1100"),
    ("AMD Radeon PRO W7700", "gfx1101"),
    ("AMD Radeon PRO W7600", "gfx1102"),
    ("AMD Radeon PRO W6800", "gfx1030"),
    ("AMD Radeon PRO V620", "gfx1030"),
    ("AMD Radeon PRO W6600", "gfx1032"),
    ("AMD Radeon Pro W5500", "gfx1012"),
    ("AMD Radeon Pro V520", "gfx1011"),
    ("AMD Radeon Pro VII", "gfx906"),
    ("AMD Radeon VII", "gfx906"),
    ("AMD Radeon RX 9070 XT", "gfx1201"),
    ("AMD Radeon RX 9070 GRE", "gfx1201"),
    ("AMD Radeon RX 9060 XT", "gfx1200"),
    ("AMD Radeon AI PRO R9700", "gfx1201"),
    ("AMD Radeon RX 7900 XTX", "gfx1100"),
    ("AMD Radeon(TM) RX 7900 XT", "gfx1100"),
    ("Radeon RX 7900 GRE", "gfx1100"),
    ("AMD Radeon RX 7800 XT", "gfx1101"),
    ("AMD Radeon RX 7700 XT", "gfx1101"),
    ("AMD Radeon RX 7600 XT", "gfx1102"),
    ("AMD Radeon RX 7600", "gfx1102"),
    ("AMD Radeon RX 7600M XT", "gfx1102"),
    ("AMD Radeon RX 7700S", "gfx1102"),
    ("AMD Radeon RX 6950 XT", "gfx1030"),
    ("AMD Radeon RX 6900 XT", "gfx1030"),
    ("AMD Radeon RX 6800 XT", "gfx1030"),
    ("AMD Radeon RX 6800", "gfx1030"),
    ("AMD Radeon RX 6800M", "gfx1031"),
    ("AMD Radeon RX 6750 XT", "gfx1031"),
    ("AMD Radeon RX 6700 XT", "gfx1031"),
    ("AMD Radeon RX 6700M", "gfx1031"),
    ("AMD Radeon RX 6650 XT", "gfx1032"),
    ("AMD Radeon RX 6600 XT", "gfx1032"),
    ("AMD Radeon RX 6600", "gfx1032"),
    ("AMD Radeon RX 6500 XT", "gfx1034"),
    ("AMD Radeon RX 5700 XT", "gfx1010"),
    ("Radeon 5700XT", "gfx1010"),  # the RX and the space dropped, as people write it
    ("Radeon RX 580 Series", "gfx803"),
    ("AMD Radeon R9 Fury X", "gfx803"),
    ("AMD Radeon RX 6700S", "gfx1032"),
    ("AMD Radeon RX 5600 XT", "gfx1010"),
    ("AMD Radeon RX 5500 XT", "gfx1012"),
    ("Radeon RX Vega 64", "gfx900"),
    ("AMD Radeon RX Vega 56", "gfx900"),
    ("Radeon Vega Frontier Edition", "gfx900"),
    ("AMD Radeon 780M", "gfx1103"),
    ("AMD Radeon 760M", "gfx1103"),
    ("AMD Radeon 890M", "gfx1150"),
    ("AMD Radeon 8060S", "gfx1151"),
    ("AMD Radeon 680M", "gfx1035"),
]


@pytest.mark.parametrize(("name", "gfx"), NAMES)
def test_amd_product_names_map_to_their_gfx_target(name: str, gfx: str) -> None:
    assert rocm_tables.amd_gfx(name) == gfx


@pytest.mark.parametrize(
    "name", ["AMD Radeon Graphics", "NVIDIA GeForce RTX 4090", "AMD Ryzen 9 7950X", "", None]
)
def test_unknown_or_generic_names_have_no_target(name) -> None:
    assert rocm_tables.amd_gfx(name) is None


def test_every_gpu_table_row_is_reached_by_a_tested_name() -> None:
    names = [name for name, _ in NAMES]
    reached = set()
    for name in names:
        text = rocm_tables.normalise_amd_name(name)
        for index, row in enumerate(_rows("amd_gpus.csv")):
            if re.search(rf"\b(?:{row['pattern']})\b", text):
                reached.add(index)
    assert reached == set(range(len(_rows("amd_gpus.csv"))))


@pytest.mark.parametrize(
    ("value", "gfx"),
    [("10.3.0", "gfx1030"), ("11.0.0", "gfx1100"), ("9.0.10", "gfx90a"), (" 9.4.2 ", "gfx942")],
)
def test_override_values_name_a_target(value: str, gfx: str) -> None:
    assert rocm_tables.gfx_from_override(value) == gfx


@pytest.mark.parametrize("value", ["", "gfx1030", "10.3", "10.30.0", None])
def test_malformed_override_values_name_nothing(value) -> None:
    assert rocm_tables.gfx_from_override(value) is None


def test_a_line_without_its_release_merges_and_is_never_verified() -> None:
    exact = rocm_tables.rocm_targets("rocm6.1", "2.4")
    assert exact is not None and exact.verified and exact.ships("gfx1101") is False
    merged = rocm_tables.rocm_targets("rocm6.1")
    assert merged is not None and not merged.verified
    assert merged.ships("gfx1100") is True
    assert merged.ships("gfx1101") is None  # only the 2.6 wheels have it
    assert merged.ships("gfx1010") is False
    assert rocm_tables.rocm_targets("+rocm6.1", "2.5.1") == exact
    assert rocm_tables.rocm_targets("rocm9.9") is None
    assert rocm_tables.rocm_targets("rocm6.2.4").index_url == "https://download.pytorch.org/whl/rocm6.2.4"


def test_siblings_belong_to_the_same_family() -> None:
    for gfx, (sibling, value) in rocm_tables.RDNA_SIBLINGS.items():
        assert gfx[:-1] == sibling[:-1]
        assert rocm_tables.gfx_from_override(value) == sibling


# ---------------------------------------------------------------- every line against every target


def _all_targets() -> list[str]:
    targets = {row["gfx"] for row in _rows("amd_gpus.csv")}
    for line in rocm_tables.rocm_lines():
        targets.update(line.targets)
    return sorted(targets)


@pytest.mark.parametrize(
    "line", rocm_tables.rocm_lines(), ids=lambda line: f"{line.variant}-{'-'.join(line.releases)}"
)
def test_every_line_judges_every_reported_target(line: rocm_tables.RocmTargets) -> None:
    """A reported target in the line's list passes; one outside it is TU605, an error exactly
    when the line's row is verified."""
    for release in line.releases:
        latest = next(r.latest for r in kb.releases() if r.release == release)
        torch = f"{latest}+{line.variant}"
        for gfx in _all_targets():
            found = _tu605(_with_arch(torch, gfx))
            if gfx in line.targets:
                assert found is None, (torch, gfx)
            else:
                assert found is not None, (torch, gfx)
                assert found.severity == ("error" if line.verified else "warning"), (torch, gfx)
                assert gfx in found.message and line.variant in found.message


# ---------------------------------------------------------------- cards by name

ROCM60 = "https://download.pytorch.org/whl/rocm6.0"
ROCM63 = "https://download.pytorch.org/whl/rocm6.3"


@pytest.mark.parametrize(
    ("torch", "gpu", "severity", "fix_has"),
    [
        # gfx1100 arrived with the rocm5.5 images (torch 2.1)
        ("2.0.1+rocm5.4.2", "AMD Radeon RX 7900 XTX", "error", "whl/rocm5.6"),
        ("1.13.1+rocm5.2", "AMD Radeon RX 7900 XTX", "error", "whl/rocm5.6"),
        ("2.1.2+rocm5.6", "AMD Radeon RX 7900 XTX", None, None),
        ("2.2.2+rocm5.7", "AMD Radeon PRO W7900", None, None),
        # gfx942 only from ROCm 6.0
        ("2.2.2+rocm5.7", "AMD Instinct MI300X", "error", "torch==2.3.1 --index-url " + ROCM60),
        ("2.3.1+rocm6.0", "AMD Instinct MI300X", None, None),
        ("2.4.1+rocm6.1", "AMD Instinct MI300X", None, None),
        ("2.4.1+rocm6.1", "AMD Instinct MI250X", None, None),
        ("1.13.1+rocm5.2", "AMD Instinct MI250X", None, None),
        ("2.5.1+rocm6.2", "AMD Radeon VII", None, None),
        ("2.5.1+rocm6.2", "Radeon RX Vega 64", None, None),
        ("2.5.1+rocm6.2", "AMD Instinct MI100", None, None),
        # gfx1101: in the wheels from torch 2.6 (UNVERIFIED row), sibling of gfx1100
        ("2.4.1+rocm6.1", "AMD Radeon RX 7800 XT", "error", "whl/rocm6.2.4"),
        ("2.4.1+rocm6.1", "AMD Radeon RX 7700 XT", "error", "HSA_OVERRIDE_GFX_VERSION=11.0.0"),
        ("2.6.0+rocm6.2.4", "AMD Radeon RX 7800 XT", None, None),
        # gfx1102 and RDNA4 only from the 2.7 lines (UNVERIFIED rows)
        ("2.6.0+rocm6.2.4", "AMD Radeon RX 7600", "warning", "torch==2.7.1 --index-url " + ROCM63),
        ("2.5.1+rocm6.2", "AMD Radeon RX 7600 XT", "error", "HSA_OVERRIDE_GFX_VERSION=11.0.0"),
        ("2.6.0+rocm6.2.4", "AMD Radeon RX 9070 XT", "warning", "whl/rocm6.3"),
        ("2.7.1+rocm6.3", "AMD Radeon RX 9070 XT", None, None),
        ("2.8.0+rocm6.4", "AMD Radeon RX 9060 XT", None, None),
        # gfx1031 / gfx1032: no wheel ships them, the gfx1030 sibling runs them
        ("2.5.1+rocm6.2", "AMD Radeon RX 6700 XT", "error", "HSA_OVERRIDE_GFX_VERSION=10.3.0"),
        ("2.4.1+rocm6.1", "AMD Radeon RX 6600", "error", "HSA_OVERRIDE_GFX_VERSION=10.3.0"),
        ("2.8.0+rocm6.4", "AMD Radeon RX 6750 XT", "warning", "HSA_OVERRIDE_GFX_VERSION=10.3.0"),
        ("2.5.1+rocm6.2", "AMD Radeon RX 6800 XT", None, None),
        # no sibling: a source build
        ("2.5.1+rocm6.2", "AMD Radeon RX 5700 XT", "error", "PYTORCH_ROCM_ARCH=gfx1010"),
        # an UNVERIFIED GPU row only warns even against a verified line
        ("2.4.1+rocm6.1", "AMD Radeon RX 6500 XT", "warning", "PYTORCH_ROCM_ARCH=gfx1034"),
        # CDNA4 and Strix Halo from the 2.10 lines (UNVERIFIED rows)
        ("2.9.1+rocm6.4", "AMD Instinct MI355X", "warning", "whl/rocm7.1"),
        ("2.10.0+rocm7.1", "AMD Instinct MI355X", None, None),
        ("2.9.1+rocm6.4", "AMD Radeon 8060S", "warning", "whl/rocm7.1"),
    ],
)
def test_wheel_line_against_card(torch: str, gpu: str, severity: str | None, fix_has) -> None:
    found = _tu605(_rocm(torch, [gpu]))
    if severity is None:
        assert found is None
        return
    assert found is not None
    assert found.severity == severity
    assert found.category == "rocm-build"
    assert rocm_tables.amd_gfx(gpu) in found.message
    assert fix_has in found.fix


def test_a_shipped_target_is_reported_as_checked() -> None:
    diagnosis = run(_rocm("2.6.0+rocm6.2.4", ["AMD Instinct MI250X"]))
    assert "TU605" not in codes(diagnosis)
    assert any("gfx90a" in text for area, text in diagnosis.passed if area == "rocm")


def test_the_fix_is_a_pip_line_for_the_wheel_index() -> None:
    found = _tu605(_rocm("2.0.1+rocm5.4.2", ["AMD Radeon RX 7900 XTX"]))
    assert found.fix.startswith(
        "pip install torch==2.1.2 --index-url https://download.pytorch.org/whl/rocm5.6"
    )


def test_the_wheel_offered_has_wheels_for_the_python() -> None:
    # torch 2.1 has no cp312 wheels: the nearest line for Python 3.12 is 2.2's rocm5.7
    snapshot = machine(
        {"version": "2.0.1+rocm5.4.2", "build": "rocm"},
        None,
        ["AMD Radeon RX 7900 XTX"],
        os="Linux",
        python="3.12.4",
    )
    found = _tu605(snapshot)
    assert "torch==2.2.2 --index-url https://download.pytorch.org/whl/rocm5.7" in found.fix


def test_several_gpus_each_checked() -> None:
    diagnosis = run(_rocm("2.4.1+rocm6.1", ["AMD Instinct MI210", "AMD Radeon RX 7800 XT"]))
    found = only(diagnosis, "TU605")
    assert "RX 7800 XT" in found.message and "MI210" not in found.message


def test_identical_gpus_give_one_finding() -> None:
    diagnosis = run(_rocm("2.4.1+rocm6.1", ["AMD Radeon RX 6700 XT"] * 4))
    assert [f.code for f in diagnosis.findings].count("TU605") == 1


# ---------------------------------------------------------------- where the gfx target comes from


def test_the_reported_target_wins_over_the_name() -> None:
    found = _tu605(_with_arch("2.4.1+rocm6.1", "gfx1031", name="AMD Radeon RX 7900 XTX"))
    assert found is not None and found.severity == "error"
    assert "gfx1031, reported" in found.message


def test_a_reported_target_with_features_is_read() -> None:
    assert _tu605(_with_arch("2.4.1+rocm6.1", "gfx90a:sramecc+:xnack-")) is None


def test_an_unknown_card_is_not_checked() -> None:
    diagnosis = run(_rocm("2.4.1+rocm6.1", ["AMD Radeon Graphics"]))
    assert "TU605" not in codes(diagnosis)
    assert any("gfx target of AMD Radeon Graphics is unknown" in t for _, t in diagnosis.unchecked)


def test_a_collect_env_report_with_the_gfx_annotation() -> None:
    text = "\n".join(
        [
            "PyTorch version: 2.5.1+rocm6.2",
            "Is debug build: False",
            "CUDA used to build PyTorch: N/A",
            "ROCM used to build PyTorch: 6.2.41133-dd7f95766",
            "",
            "OS: Ubuntu 22.04.5 LTS (x86_64)",
            "Python version: 3.11.10 (main) [GCC 11.4.0] (64-bit runtime)",
            "Is CUDA available: True",
            "GPU models and configuration: AMD Radeon RX 6700 XT (gfx1031)",
            "HIP runtime version: 6.2.41133",
            "MIOpen runtime version: 3.2.0",
        ]
    )
    diagnosis = diagnose(read_report(text))
    found = only(diagnosis, "TU605")
    assert found.severity == "error"
    assert "HSA_OVERRIDE_GFX_VERSION=10.3.0" in found.fix


# ---------------------------------------------------------------- HSA_OVERRIDE_GFX_VERSION


def test_an_override_to_a_shipped_sibling_passes() -> None:
    snapshot = _rocm(
        "2.4.1+rocm6.1", ["AMD Radeon RX 6700 XT"], env={"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}
    )
    diagnosis = run(snapshot)
    assert "TU605" not in codes(diagnosis)
    assert any("HSA_OVERRIDE_GFX_VERSION=10.3.0" in t for _, t in diagnosis.passed)


def test_an_override_to_a_target_the_line_lacks_is_still_a_finding() -> None:
    snapshot = _rocm(
        "2.0.1+rocm5.4.2", ["AMD Radeon RX 7800 XT"], env={"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}
    )
    found = _tu605(snapshot)
    assert found is not None and "makes it run as gfx1100" in found.message


# ---------------------------------------------------------------- which builds are judged


def test_a_line_guessed_from_torch_hip_only_warns() -> None:
    found = _tu605(_rocm("2.5.1", ["AMD Radeon RX 7800 XT"], hip="6.2.41133-dd7f95766"))
    assert found is not None and found.severity == "warning"
    assert "torch.version.hip" in found.message


def test_nightly_and_custom_rocm_builds_are_not_judged() -> None:
    for torch in ("2.7.0.dev20250301+rocm6.3", "2.6.0a0+git1234abc", "2.4.0+rocm6.3.4.git7cecbf6d"):
        diagnosis = run(_rocm(torch, ["AMD Radeon RX 6700 XT"]))
        assert "TU605" not in codes(diagnosis), torch
        assert any(area == "rocm" for area, _ in diagnosis.unchecked), torch


def test_a_release_the_line_does_not_name_decides_nothing_it_cannot() -> None:
    # no 2.7 wheels of rocm6.1 in the table: gfx1101 is in some rocm6.1 lists, not in others
    diagnosis = run(_rocm("2.7.0+rocm6.1", ["AMD Radeon RX 7800 XT"]))
    assert "TU605" not in codes(diagnosis)
    # a target no rocm6.1 list has is still a finding, but only a warning
    assert _tu605(_rocm("2.7.0+rocm6.1", ["AMD Radeon RX 5700 XT"])).severity == "warning"


def test_an_unknown_line_is_not_judged() -> None:
    diagnosis = run(_rocm("2.4.1+rocm9.9", ["AMD Radeon RX 6700 XT"]))
    assert "TU605" not in codes(diagnosis)


def test_the_torch_asked_for_is_judged() -> None:
    snapshot = machine({"version": None}, None, ["AMD Radeon RX 7900 XTX"], os="Linux")
    found = _tu605(snapshot, requested_torch="2.0.1+rocm5.4.2")
    assert found is not None and found.severity == "error"


def test_cuda_and_nvidia_cases_keep_their_own_codes() -> None:
    nvidia = run(_rocm("2.6.0+rocm6.2.4", ["NVIDIA GeForce RTX 4090"], hip="6.2.41133"))
    assert "TU602" in codes(nvidia) and "TU605" not in codes(nvidia)
    cuda_build = {"version": "2.4.1+cu121", "build": "cuda", "cuda": "12.1"}
    cuda = run(machine(cuda_build, None, ["AMD Radeon RX 6700 XT"], os="Linux"))
    assert "TU601" in codes(cuda) and "TU605" not in codes(cuda)
