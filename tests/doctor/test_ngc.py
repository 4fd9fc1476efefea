"""NGC PyTorch container table: the ``.nvYY.MM`` tag of a torch version names its container."""

from __future__ import annotations

from tuneup.doctor import ngc


def test_the_tag_is_read_as_ngc_prints_it_and_as_pip_normalises_it() -> None:
    assert ngc.container_tag("2.7.0a0+ecf3bae40a.nv25.02") == "25.02"
    assert ngc.container_tag("2.7.0a0+ecf3bae40a.nv25.2") == "25.02"
    assert ngc.container_tag("2.7.0+cu128") is None and ngc.container_tag(None) is None


def test_the_25_02_container_ships_nccl_2_25_1() -> None:
    row = ngc.container("2.7.0a0+ecf3bae40a.nv25.02")
    assert row is not None and row.verified
    assert (row.torch, row.nccl, row.cudnn) == ("2.7.0a0+ecf3bae40a", "2.25.1", "9.7.1")


def test_every_row_has_a_source_and_its_torch_matches_its_release_line() -> None:
    for row in ngc.containers():
        assert row.source and "a0+" in row.torch, row
        assert row.verified or "not re-read" in row.source or "not read" in row.source, row
