"""The GPU tables: every row is reachable from a real product name and agrees with the
architecture table, so an old card is never left at "compute capability unknown"."""

from __future__ import annotations

import csv
import re

import pytest

from tuneup.doctor import knowledge as kb
from tuneup.doctor.rules.context import Context
from tuneup.machine import versions
from tuneup.machine.snapshot import GPU, Snapshot

# Product names as nvidia-smi, torch.cuda.get_device_name() or collect_env print them.
PRODUCTS: dict[str, str] = {
    # Blackwell
    "NVIDIA GB10": "12.1",
    "NVIDIA GeForce RTX 5090": "12.0",
    "NVIDIA GeForce RTX 5090 D": "12.0",
    "NVIDIA GeForce RTX 5090 D v2": "12.0",
    "NVIDIA GeForce RTX 5090 Laptop GPU": "12.0",
    "NVIDIA GeForce RTX 5080": "12.0",
    "NVIDIA GeForce RTX 5070 Ti": "12.0",
    "NVIDIA GeForce RTX 5070": "12.0",
    "NVIDIA GeForce RTX 5060 Ti": "12.0",
    "NVIDIA GeForce RTX 5060 Laptop GPU": "12.0",
    "NVIDIA GeForce RTX 5050": "12.0",
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition": "12.0",
    "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition": "12.0",
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": "12.0",
    "NVIDIA RTX PRO 4000 Blackwell SFF Edition": "12.0",
    "NVIDIA RTX PRO 2000 Blackwell": "12.0",
    "NVIDIA RTX PRO 3000 Blackwell Generation Laptop GPU": "12.0",
    "NVIDIA Thor": "11.0",
    "NVIDIA Jetson AGX Thor": "11.0",
    "NVIDIA Jetson T4000": "11.0",
    "NVIDIA B300 SXM6 AC": "10.3",
    "NVIDIA GB300": "10.3",
    "NVIDIA B200": "10.0",
    "NVIDIA GB200": "10.0",
    "NVIDIA B100": "10.0",
    # Hopper
    "NVIDIA H100 80GB HBM3": "9.0",
    "NVIDIA H100 PCIe": "9.0",
    "NVIDIA H100 NVL": "9.0",
    "NVIDIA H200": "9.0",
    "NVIDIA GH200 480GB": "9.0",
    "NVIDIA H800": "9.0",
    "NVIDIA H20": "9.0",
    # Ada Lovelace
    "NVIDIA L40S": "8.9",
    "NVIDIA L40": "8.9",
    "NVIDIA L4": "8.9",
    "NVIDIA L20": "8.9",
    "NVIDIA L2": "8.9",
    "NVIDIA GeForce RTX 4090": "8.9",
    "NVIDIA GeForce RTX 4090 D": "8.9",
    "NVIDIA GeForce RTX 4090 Laptop GPU": "8.9",
    "NVIDIA GeForce RTX 4080 SUPER": "8.9",
    "NVIDIA GeForce RTX 4070 Ti SUPER": "8.9",
    "NVIDIA GeForce RTX 4070": "8.9",
    "NVIDIA GeForce RTX 4060 Ti": "8.9",
    "NVIDIA GeForce RTX 4060 Laptop GPU": "8.9",
    "NVIDIA GeForce RTX 4050 Laptop GPU": "8.9",
    "NVIDIA RTX 6000 Ada Generation": "8.9",
    "NVIDIA RTX 5880 Ada Generation": "8.9",
    "NVIDIA RTX 5000 Ada Generation": "8.9",
    "NVIDIA RTX 4500 Ada Generation": "8.9",
    "NVIDIA RTX 4000 SFF Ada Generation": "8.9",
    "NVIDIA RTX 4000 Ada Generation": "8.9",
    "NVIDIA RTX 2000 Ada Generation Laptop GPU": "8.9",
    "NVIDIA RTX 3500 Ada Generation Laptop GPU": "8.9",
    "NVIDIA GeForce RTX 3050 A Laptop GPU": "8.9",
    # Ampere
    "Orin": "8.7",
    "NVIDIA Jetson AGX Orin": "8.7",
    "NVIDIA Jetson Orin Nano Developer Kit": "8.7",
    "NVIDIA A40": "8.6",
    "NVIDIA A10": "8.6",
    "NVIDIA A10G": "8.6",
    "NVIDIA A16": "8.6",
    "NVIDIA A2": "8.6",
    "NVIDIA RTX A6000": "8.6",
    "NVIDIA RTX A5000": "8.6",
    "NVIDIA RTX A4000": "8.6",
    "NVIDIA RTX A3000 Laptop GPU": "8.6",
    "NVIDIA RTX A2000 12GB": "8.6",
    "NVIDIA RTX A5500": "8.6",
    "NVIDIA RTX A4500 Laptop GPU": "8.6",
    "NVIDIA RTX A1000 6GB Laptop GPU": "8.6",
    "NVIDIA RTX A400": "8.6",
    "NVIDIA GeForce RTX 3090 Ti": "8.6",
    "NVIDIA GeForce RTX 3090": "8.6",
    "NVIDIA GeForce RTX 3080 Ti Laptop GPU": "8.6",
    "NVIDIA GeForce RTX 3070 Ti": "8.6",
    "NVIDIA GeForce RTX 3060 Laptop GPU": "8.6",
    "NVIDIA GeForce RTX 3060 Ti": "8.6",
    "NVIDIA GeForce RTX 3050 Ti Laptop GPU": "8.6",
    "NVIDIA GeForce RTX 3050 6GB Laptop GPU": "8.6",
    "NVIDIA GeForce RTX 2050": "8.6",
    "NVIDIA GeForce MX570": "8.6",
    "NVIDIA A100-SXM4-80GB": "8.0",
    "NVIDIA A100-PCIE-40GB": "8.0",
    "NVIDIA A100 80GB PCIe": "8.0",
    "NVIDIA A800-SXM4-80GB": "8.0",
    "NVIDIA A30": "8.0",
    # Turing
    "Tesla T4": "7.5",
    "NVIDIA T4G": "7.5",
    "Quadro RTX 8000": "7.5",
    "Quadro RTX 6000": "7.5",
    "Quadro RTX 5000 with Max-Q Design": "7.5",
    "Quadro RTX 3000": "7.5",
    "NVIDIA T1000 8GB": "7.5",
    "NVIDIA T400 4GB": "7.5",
    "Quadro T2000": "7.5",
    "NVIDIA T1200 Laptop GPU": "7.5",
    "NVIDIA T550 Laptop GPU": "7.5",
    "NVIDIA TITAN RTX": "7.5",
    "NVIDIA GeForce RTX 2080 Ti": "7.5",
    "NVIDIA GeForce RTX 2080 Super with Max-Q Design": "7.5",
    "NVIDIA GeForce RTX 2070 SUPER": "7.5",
    "NVIDIA GeForce RTX 2060": "7.5",
    "NVIDIA GeForce GTX 1660 Ti": "7.5",
    "NVIDIA GeForce GTX 1660 SUPER": "7.5",
    "NVIDIA GeForce GTX 1650 Ti with Max-Q Design": "7.5",
    "NVIDIA GeForce GTX 1650": "7.5",
    "NVIDIA GeForce GTX 1630": "7.5",
    "NVIDIA GeForce MX450": "7.5",
    "NVIDIA GeForce MX550": "7.5",
    # Volta
    "Xavier": "7.2",
    "NVIDIA Jetson Xavier NX": "7.2",
    "Tesla V100-SXM2-32GB": "7.0",
    "Tesla V100-PCIE-16GB": "7.0",
    "Tesla V100S-PCIE-32GB": "7.0",
    "Quadro GV100": "7.0",
    "NVIDIA TITAN V": "7.0",
    # Pascal
    "NVIDIA Tegra X2": "6.2",
    "Jetson TX2": "6.2",
    "Tesla P40": "6.1",
    "Tesla P4": "6.1",
    "Tesla P6": "6.1",
    "Quadro P1000": "6.1",
    "Quadro P6000": "6.1",
    "Quadro P620": "6.1",
    "Quadro P5200 with Max-Q Design": "6.1",
    "Quadro P520": "6.1",
    "TITAN Xp": "6.1",
    "NVIDIA TITAN X (Pascal)": "6.1",
    "NVIDIA GeForce GTX 1080 Ti": "6.1",
    "NVIDIA GeForce GTX 1080 with Max-Q Design": "6.1",
    "NVIDIA GeForce GTX 1070 Ti": "6.1",
    "NVIDIA GeForce GTX 1060 6GB": "6.1",
    "NVIDIA GeForce GTX 1050 Ti": "6.1",
    "NVIDIA GeForce GT 1030": "6.1",
    "NVIDIA GeForce GT 1010": "6.1",
    "NVIDIA GeForce MX150": "6.1",
    "NVIDIA GeForce MX250": "6.1",
    "NVIDIA GeForce MX350": "6.1",
    "Tesla P100-PCIE-16GB": "6.0",
    "Tesla P100-SXM2-16GB": "6.0",
    "Quadro GP100": "6.0",
    # Maxwell
    "NVIDIA Tegra X1": "5.3",
    "Jetson Nano": "5.3",
    "Tesla M60": "5.2",
    "Tesla M40 24GB": "5.2",
    "Tesla M4": "5.2",
    "Quadro M6000 24GB": "5.2",
    "Quadro M4000": "5.2",
    "Quadro M5500M": "5.2",
    "Quadro M2200": "5.2",
    "Quadro M4000M": "5.2",
    "GeForce GTX TITAN X": "5.2",
    "GeForce GTX 980 Ti": "5.2",
    "GeForce GTX 970": "5.2",
    "GeForce GTX 950": "5.2",
    "GeForce GTX 980M": "5.2",
    "GeForce GTX 965M": "5.2",
    "Quadro K2200": "5.0",
    "Quadro K620": "5.0",
    "Quadro K2200M": "5.0",
    "Quadro M1000M": "5.0",
    "Quadro M1200": "5.0",
    "Quadro M620": "5.0",
    "Tesla M10": "5.0",
    "NVS 810": "5.0",
    "GeForce GTX 750 Ti": "5.0",
    "GeForce GTX 745": "5.0",
    "GeForce GTX 960M": "5.0",
    "GeForce 940M": "5.0",
    "GeForce 830M": "5.0",
    "GeForce 940MX": "5.0",
    "GeForce 920MX": "5.0",
    "GeForce GTX 850M": "5.0",
    "GeForce GTX 860M": "5.0",
    "NVIDIA GeForce MX130": "5.0",
    # Kepler
    "Tesla K80": "3.7",
    "Tesla K40m": "3.5",
    "Tesla K40c": "3.5",
    "Tesla K20Xm": "3.5",
    "Tesla K20c": "3.5",
    "Quadro K6000": "3.5",
    "Quadro K5200": "3.5",
    "Quadro K610M": "3.5",
    "GeForce GTX TITAN": "3.5",
    "GeForce GTX TITAN Black": "3.5",
    "GeForce GTX TITAN Z": "3.5",
    "GeForce GTX 780 Ti": "3.5",
    "GeForce GT 710": "3.5",
    "GeForce GT 730": "3.5",
    "GeForce 920M": "3.5",
    "GeForce 910M": "3.5",
    "GeForce 825M": "3.5",
    "GK20A": "3.2",
    "Jetson TK1": "3.2",
    "Tesla K10.G1.8GB": "3.0",
    "Tesla K8": "3.0",
    "GRID K520": "3.0",
    "GRID K2": "3.0",
    "Quadro K5000": "3.0",
    "Quadro K2000D": "3.0",
    "Quadro K420": "3.0",
    "Quadro 410": "3.0",
    "Quadro K3100M": "3.0",
    "Quadro K1000M": "3.0",
    "NVS 510": "3.0",
    "GeForce GTX 770": "3.0",
    "GeForce GTX 760 Ti": "3.0",
    "GeForce GT 740": "3.0",
    "GeForce GTX 680": "3.0",
    "GeForce GTX 650 Ti BOOST": "3.0",
    "GeForce GT 640": "3.0",
    "GeForce GTX 780M": "3.0",
    "GeForce GT 750M": "3.0",
    "GeForce GT 730M": "3.0",
    "GeForce GTX 880M": "3.0",
    "GeForce GTX 675MX": "3.0",
    "GeForce GT 650M": "3.0",
    "GeForce GT 640M LE": "3.0",
    # Fermi
    "GeForce GTX 560 Ti": "2.1",
    "GeForce GTX 550 Ti": "2.1",
    "GeForce GTX 460": "2.1",
    "GeForce GTS 450": "2.1",
    "GeForce GT 430": "2.1",
    "GeForce GT 620": "2.1",
    "GeForce GT 630": "2.1",
    "Quadro 2000": "2.1",
    "Quadro 600": "2.1",
    "Quadro 2000M": "2.1",
    "NVS 5400M": "2.1",
    "NVS 315": "2.1",
    "GeForce GTX 580M": "2.1",
    "GeForce GTX 675M": "2.1",
    "GeForce GT 540M": "2.1",
    "GeForce GT 420M": "2.1",
    "GeForce GT 630M": "2.1",
    "GeForce 610M": "2.1",
    "GeForce GT 720M": "2.1",
    "GeForce 820M": "2.1",
    "GeForce GTX 580": "2.0",
    "GeForce GTX 480": "2.0",
    "GeForce GTX 480M": "2.0",
    "Tesla C2050": "2.0",
    "Tesla M2090": "2.0",
    "Quadro 6000": "2.0",
    "Quadro 5010M": "2.0",
    # Tesla (the architecture)
    "Tesla C1060": "1.3",
    "Tesla T10 Processor": "1.3",
    "GeForce GTX 285": "1.3",
    "GeForce GTX 260": "1.3",
    "Quadro FX 5800": "1.3",
    "GeForce GT 240": "1.2",
    "GeForce 210": "1.2",
    "GeForce GT 330M": "1.2",
    "Quadro FX 380 Low Profile": "1.2",
    "NVS 3100M": "1.2",
    "GeForce 9800 GTX+": "1.1",
    "GeForce GTS 250": "1.1",
    "GeForce 8800 GT": "1.1",
    "GeForce 8800 GTS 512": "1.1",
    "GeForce 9800M GTS": "1.1",
    "GeForce GTX 280M": "1.1",
    "Quadro FX 580": "1.1",
    "Quadro FX 3700M": "1.1",
    "NVS 295": "1.1",
    "GeForce 8800 GTX": "1.0",
    "Tesla C870": "1.0",
    "Quadro FX 5600": "1.0",
}

# Made-up models of known series: the family fallback answers, and says so.
UNLISTED: dict[str, tuple[str, str]] = {
    "NVIDIA GeForce RTX 5095": ("12.0", "GeForce RTX 50"),
    "NVIDIA RTX PRO 7000 Blackwell": ("12.0", "RTX PRO Blackwell"),
    "NVIDIA GeForce RTX 4075": ("8.9", "GeForce RTX 40"),
    "NVIDIA RTX 7000 Ada Generation": ("8.9", "RTX Ada"),
    "NVIDIA GeForce RTX 3055": ("8.6", "GeForce RTX 30"),
    "NVIDIA RTX A7000": ("8.6", "RTX A"),
    "NVIDIA GeForce RTX 2065": ("7.5", "GeForce RTX 20"),
    "Quadro RTX 7000": ("7.5", "Quadro RTX"),
    "NVIDIA GeForce GTX 1670": ("7.5", "GeForce GTX 16"),
    "Quadro T3000": ("7.5", "Quadro T"),
    "NVIDIA GeForce MX470": ("7.5", "GeForce MX400"),
    "Tesla V200": ("7.0", "Tesla V"),
    "NVIDIA GeForce GTX 1090": ("6.1", "GeForce 10"),
    "Quadro P7000": ("6.1", "Quadro P"),
    "Tesla P30": ("6.1", "Tesla P"),
    "NVIDIA GeForce MX270": ("6.1", "GeForce MX200/MX300"),
    "GeForce GTX 985": ("5.2", "GeForce 900"),
    "Quadro M7000": ("5.2", "Quadro M"),
    "Tesla M80": ("5.2", "Tesla M"),
    "GeForce GTX 790": ("3.0", "GeForce 700"),
    "GeForce GTX 685": ("3.0", "GeForce 600"),
    "Tesla K30": ("3.5", "Tesla K"),
    "Quadro K7000": ("3.0", "Quadro K"),
    "GeForce GTX 595": ("2.0", "GeForce 400/500"),
    "Tesla C2080": ("2.0", "Tesla 20"),
}

NOT_NVIDIA = [
    "AMD Radeon RX 7900 XTX",
    "AMD Radeon 840M",
    "AMD Instinct MI300X",
    "Intel Arc A770",
    "Intel(R) UHD Graphics 630",
    "Apple M4 Max",
    "Matrox G200eW",
    "llvmpipe (LLVM 15.0.7, 256 bits)",
    "",
]


def _table(name: str) -> list[dict[str, str]]:
    with open(kb.DATA_DIR / name, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _arch_ccs() -> set[str]:
    return {row["cc"] for row in _table("architectures.csv")}


@pytest.mark.parametrize(("name", "cc"), PRODUCTS.items())
def test_product_names_resolve_exactly(name: str, cc: str) -> None:
    match = kb.gpu_lookup(name)
    assert match is not None, kb.normalise_gpu_name(name)
    assert (match.cc, match.fallback) == (cc, False), kb.normalise_gpu_name(name)
    assert kb.compute_capability(name) == cc


@pytest.mark.parametrize("row", _table("gpus.csv"), ids=lambda row: row["pattern"])
def test_every_gpu_row_is_reached_by_a_product_name(row: dict[str, str]) -> None:
    pattern = re.compile(rf"\b(?:{row['pattern']})\b")
    reached = [
        name
        for name, cc in PRODUCTS.items()
        if cc == row["cc"] and pattern.search(kb.normalise_gpu_name(name))
    ]
    assert reached, f"no product name in PRODUCTS exercises {row['pattern']!r}"


@pytest.mark.parametrize("row", _table("gpu_families.csv"), ids=lambda row: row["pattern"])
def test_every_family_row_is_reached_by_an_unlisted_model(row: dict[str, str]) -> None:
    pattern = re.compile(rf"\b(?:{row['pattern']})\b")
    assert any(pattern.search(kb.normalise_gpu_name(name)) for name in UNLISTED)


@pytest.mark.parametrize(("name", "expected"), UNLISTED.items())
def test_unlisted_model_of_a_known_series_uses_the_flagged_family_fallback(
    name: str, expected: tuple[str, str]
) -> None:
    match = kb.gpu_lookup(name)
    assert match is not None and match.fallback
    assert match.cc == expected[0] and expected[1] in (match.family or "")
    assert kb.compute_capability(name) == expected[0]


@pytest.mark.parametrize("name", NOT_NVIDIA)
def test_other_vendors_have_no_nvidia_compute_capability(name: str) -> None:
    assert kb.gpu_lookup(name) is None
    assert kb.compute_capability(name) is None


def test_the_context_says_where_each_compute_capability_came_from() -> None:
    gpus = [
        GPU(index=0, name="NVIDIA GeForce RTX 3055"),
        GPU(index=1, name="Tesla K80"),
        GPU(index=2, name="Some Future Board", compute_capability="12.0"),
    ]
    facts = Context(Snapshot(gpus=gpus)).gpus
    assert [(f.vendor, f.cc, f.cc_basis) for f in facts] == [
        ("nvidia", "8.6", "family fallback (GeForce RTX 30 series (Ampere))"),
        ("nvidia", "3.7", "table"),
        ("nvidia", "12.0", "report"),
    ]


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        ("NVIDIA GeForce RTX 3060 Laptop GPU", "rtx 3060"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA GeForce RTX 4090 D", "rtx 4090"),
        ("NVIDIA GeForce GTX 1080 with Max-Q Design", "gtx 1080"),
        ("GeForce GTX 1060 Mobile", "gtx 1060"),
        ("Tesla V100-PCIE-16GB", "tesla v100"),
        ("NVIDIA TITAN X (Pascal)", "titan x pascal"),
    ],
)
def test_name_normalisation(raw: str, normalised: str) -> None:
    assert kb.normalise_gpu_name(raw) == normalised


@pytest.mark.parametrize("table", ["gpus.csv", "gpu_families.csv"])
def test_gpu_rows_have_a_source_and_a_known_architecture(table: str) -> None:
    known = _arch_ccs()
    for row in _table(table):
        assert row["source"].strip(), row
        assert row["cc"] in known, f"{table}: {row['pattern']} has CC {row['cc']}"


def test_architecture_rows_name_an_ordered_toolkit_range() -> None:
    for row in _table("architectures.csv"):
        first = versions.major_minor(row["first_cuda"])
        last = versions.major_minor(row["last_cuda"])
        if first and last:
            assert first <= last, row


def test_every_toolkit_row_targets_architectures_its_cuda_can_build() -> None:
    """A wheel's arch list must name known CCs inside their first..last CUDA toolkit range."""
    for variant in kb._variants().values():
        cuda = versions.major_minor(variant.cuda)
        for target in variant.arches + variant.ptx:
            arch = kb.architecture(target)
            assert arch is not None, (variant, target)
            first = versions.major_minor(arch.first_cuda)
            last = versions.major_minor(arch.last_cuda)
            where = (variant.release, variant.name, variant.platform, target)
            assert cuda is None or first is None or first <= cuda, where
            assert cuda is None or last is None or cuda <= last, where
