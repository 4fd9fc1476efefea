"""The version a system cuDNN states: its cudnnGetVersion, its real file name, its header;
a soname alone (libcudnn.so.9) is only a major."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tuneup.machine import versions
from tuneup.machine.probe import cudnn
from tuneup.machine.snapshot import LibraryVersion, Snapshot

HEADER = """
#ifndef CUDNN_VERSION_H_
#define CUDNN_MAJOR 9
#define CUDNN_MINOR 1
#define CUDNN_PATCHLEVEL 0
#define CUDNN_VERSION (CUDNN_MAJOR * 10000 + CUDNN_MINOR * 100 + CUDNN_PATCHLEVEL)
#endif
"""


def test_cudnn_get_version_numbers() -> None:
    assert versions.cudnn_from_int(91900) == "9.19.0"
    assert versions.cudnn_from_int(90100) == "9.1.0"
    assert versions.cudnn_from_int(8902) == "8.9.2"
    assert versions.cudnn_from_int(7605) == "7.6.5"
    assert versions.cudnn_from_int(0) is None


def test_the_header_gives_major_minor_patch() -> None:
    assert cudnn.parse_header(HEADER) == "9.1.0"
    assert cudnn.parse_header("#define CUDNN_MAJOR 8\n") is None


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build a library")
def test_the_library_is_asked_its_version(tmp_path: Path) -> None:
    source = tmp_path / "fake.c"
    source.write_text("unsigned long cudnnGetVersion(void) { return 91900; }\n")
    library = tmp_path / "libcudnn.so.9"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    assert cudnn.read_version(str(library)) == LibraryVersion(str(library), "9.19.0",
                                                              "cudnnGetVersion")


def test_the_file_a_soname_links_to_gives_the_version(tmp_path: Path) -> None:
    (tmp_path / "libcudnn.so.9.1.0").write_bytes(b"not a library")  # cudnnGetVersion fails
    (tmp_path / "libcudnn.so.9").symlink_to("libcudnn.so.9.1.0")
    (tmp_path / "other.so.9").symlink_to("libcudnn.so.9.1.0")
    read = cudnn.library_versions([str(tmp_path / "libcudnn.so.9"), "/x/libcudnn.so.8.9.2",
                                   str(tmp_path / "other.so.9")], [])
    assert read == [  # the full-named one needs no reading; one file, read once, two names
        LibraryVersion(str(tmp_path / "libcudnn.so.9"), "9.1.0", "file name"),
        LibraryVersion(str(tmp_path / "other.so.9"), "9.1.0", "file name"),
    ]


def test_the_header_beside_the_library_when_nothing_else_says(tmp_path: Path,
                                                               monkeypatch) -> None:
    monkeypatch.setattr(cudnn, "HEADER_DIRS", ("../include",))  # not this machine's headers
    (tmp_path / "lib").mkdir()
    (tmp_path / "include").mkdir()
    library = tmp_path / "lib" / "libcudnn.so.9"
    library.write_bytes(b"not a library")
    assert cudnn.read_version(str(library)) is None
    (tmp_path / "include" / "cudnn_version.h").write_text(HEADER.replace("MAJOR 9", "MAJOR 8"))
    assert cudnn.read_version(str(library)) is None  # another copy's header: not this one's
    (tmp_path / "include" / "cudnn_version.h").write_text(HEADER)
    read = cudnn.read_version(str(library))
    assert (read.version, read.read_from) == ("9.1.0",
                                              str(tmp_path / "include" / "cudnn_version.h"))


def test_the_versions_read_back_from_json() -> None:
    snapshot = Snapshot(cudnn_library_versions=[LibraryVersion("/lib/libcudnn.so.9", "9.1.0",
                                                               "cudnnGetVersion")])
    assert Snapshot.from_dict(snapshot.to_dict()) == snapshot
    with pytest.raises(ValueError):
        Snapshot.from_dict({"cudnn_library_versions": [{"version": 9}]})
