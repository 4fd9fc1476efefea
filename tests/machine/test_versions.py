"""The one version module: found in free text by a regex, parsed by packaging."""

from __future__ import annotations

import pytest

from tuneup.machine import versions


@pytest.mark.parametrize(("text", "expected"), [
    ("2.6.0+cu126", (2, 6, 0)), ("2.8.0.dev20250301+cu128", (2, 8, 0)),
    ("2.3.0a0+6ddf5cf.nv24.04", (2, 3, 0)), ("570.124.04", (570, 124, 4)),
    ("cuDNN 9.1.0 (found)", (9, 1, 0)), ("V12.1.105", (12, 1, 105)), ("12", (12,)),
    ("", None), (None, None), ("no version here", None),
])
def test_release_of_any_text(text, expected):
    assert versions.release(text) == expected


@pytest.mark.parametrize(("text", "pair", "written"), [
    ("10.1.243", (10, 1), "10.1"), ("12", (12, 0), "12.0"), ("3.10.12", (3, 10), "3.10"),
    (None, None, None),
])
def test_major_minor_as_numbers_and_as_text(text, pair, written):
    assert versions.major_minor(text) == pair and versions.major_minor_text(text) == written


def test_ordering_is_numeric_not_textual():
    assert versions.major_minor("3.10") > versions.major_minor("3.9")
    assert versions.parse("2.10.0") > versions.parse("2.9.1")
    assert versions.parse("2.8.0.dev20250301") < versions.parse("2.8.0")


@pytest.mark.parametrize(("version", "kind"), [
    ("2.6.0+cu126", ("cuda", "12.6")), ("1.7.1+cu92", ("cuda", "9.2")),
    ("2.9.0+cu130", ("cuda", "13.0")), ("2.4.1+rocm6.1", ("rocm", "6.1")),
    ("2.13.0+cpu", ("cpu", None)), ("2.5.0+xpu", ("xpu", None)), ("1.8.1", (None, None)),
    ("2.8.0.dev20250301+cu128", ("cuda", "12.8")),
])
def test_build_kind_from_the_local_label(version, kind):
    assert versions.build_from_version(version) == kind


@pytest.mark.parametrize(("version", "custom"), [
    ("2.6.0+cu126", False), ("2.6.0", False), ("2.4.1+rocm6.1", False),
    ("2.8.0.dev20250301+cu128", True), ("2.3.0a0+6ddf5cf.nv24.04", True),
    ("2.1.0rc1", True), ("1.13.0+git1234", True),
])
def test_custom_builds_are_not_described_by_the_wheel_tables(version, custom):
    assert versions.is_custom_build(version) is custom


def test_cuda_tags_both_ways():
    for cuda in ("9.2", "10.2", "11.8", "12.1", "12.8", "13.0"):
        assert versions.cuda_from_tag(versions.cuda_tag(cuda)) == cuda
    assert versions.cuda_from_tag("cpu") is None and versions.cuda_tag(None) is None


def test_library_versions_and_package_names():
    assert versions.library_version("/usr/lib/x86_64-linux-gnu/libcudnn.so.8.9.2") == "8.9.2"
    assert versions.library_version("cudnn64_9.dll") == "9"
    assert versions.library_version("libcudnn.so") is None
    assert versions.distinct_versions(["libnccl.so.2.21.5", "2.21.5", "libnccl.so.2"]) == \
        ["2.21.5", "2"]
    assert versions.package_name("Nvidia_CUDNN.cu12") == "nvidia-cudnn-cu12"
