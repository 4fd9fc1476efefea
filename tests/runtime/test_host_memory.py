"""Pinned malloc thresholds: a block freed and allocated again is reused, not faulted in again.

Each case runs in its own process: pinning is process-wide and cannot be undone. glibc is
started with its static 128 KiB mmap threshold (``MALLOC_MMAP_THRESHOLD_``), so without
pinning every 8 MiB block is a fresh mapping whose pages fault in on first touch.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tuneup.runtime import host_memory
from tuneup.settings import Knobs, SettingsError

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only")

FAULTS = textwrap.dedent("""
    import ctypes, resource, sys
    {setup}
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    size = 8 << 20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        block = libc.malloc(size)
        ctypes.memset(block, 1, size)  # touch every page, as a tensor's fill does
        libc.free(block)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")
PAGES = (8 << 20) // os.sysconf("SC_PAGE_SIZE")


def faults(setup: str, env: dict[str, str] | None = None) -> int:
    """Minor page faults of 20 rounds of an 8 MiB block touched and freed, after ``setup``."""
    done = subprocess.run([sys.executable, "-c", FAULTS.format(setup=setup)], check=True,
                          capture_output=True, text=True,
                          env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", **(env or {})})
    return int(done.stdout.split()[-1])


@glibc
def test_pinned_thresholds_reuse_a_freed_block():
    assert faults("") >= 10 * PAGES  # every round maps and faults the block in again
    pinned = faults("from tuneup.runtime.host_memory import pin_malloc_thresholds as pin\n"
                    "assert pin() is None and pin() is None")
    assert pinned <= 2 * PAGES  # faulted in once, then reused


@glibc
def test_a_settings_file_pins_them_when_the_loop_is_created(tmp_path: Path):
    settings = tmp_path / "s.tuneup.json"
    settings.write_text(json.dumps({"schema_version": 1, "knobs": {"pin_host_malloc": True}}))
    setup = ("import torch; from tuneup import tuned_loop\n"
             "m = torch.nn.Linear(2, 2)\n"
             "tuned_loop(m, torch.optim.SGD(m.parameters(), lr=0.1))")
    assert faults(setup, {"TUNEUP_SETTINGS": str(settings)}) <= 2 * PAGES
    settings.write_text(json.dumps({"schema_version": 1, "knobs": {}}))
    assert faults(setup, {"TUNEUP_SETTINGS": str(settings)}) >= 10 * PAGES


def test_elsewhere_it_says_why_not(monkeypatch):
    monkeypatch.setattr(host_memory, "_pinned", False)
    monkeypatch.setattr(platform, "libc_ver", lambda: ("", ""))
    assert host_memory.pin_malloc_thresholds() == "the C library is not glibc"


def test_the_knob_is_a_bool():
    assert Knobs.from_dict({"pin_host_malloc": True}).pin_host_malloc is True
    with pytest.raises(SettingsError, match="pin_host_malloc must be true, false or null"):
        Knobs.from_dict({"pin_host_malloc": "yes"})
