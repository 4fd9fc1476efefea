"""Fixed malloc thresholds: memory a step frees is reused by the next, not faulted in again.

Each case runs in its own process: fixing the thresholds is process-wide and final. A
"step" allocates four 8 MiB blocks, touches them and frees them, as a training step does
with its activations. With glibc's own thresholds the first free raises the mmap threshold
to the block's size and the trim threshold to twice that, below the 32 MiB a step frees
at the heap's top: every step gives it back and faults it in again.
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

from tuneup.runtime import apply, malloc_thresholds
from tuneup.settings import Knobs, SettingsError, TuneupWarning

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only")

STEPS = textwrap.dedent("""
    import ctypes, resource
    {setup}
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size = 8 << 20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        blocks = [libc.malloc(size) for _ in range(4)]
        for block in blocks:
            ctypes.memset(block, 1, size)  # every page touched, as a tensor's fill does
        for block in reversed(blocks):
            libc.free(block)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")
STEP_PAGES = 4 * (8 << 20) // os.sysconf("SC_PAGE_SIZE")
CLEAN = {k: v for k, v in os.environ.items()
         if k not in ("LD_PRELOAD", "GLIBC_TUNABLES") and not k.startswith("MALLOC_")}


def page_faults(setup: str, **env: str) -> int:
    """Minor page faults of 20 such steps after ``setup``, in a fresh process."""
    done = subprocess.run([sys.executable, "-c", STEPS.format(setup=setup)], check=True,
                          capture_output=True, text=True, env={**CLEAN, **env})
    return int(done.stdout.split()[-1])


FIX = ("from tuneup.runtime import malloc_thresholds as m\n"
       "print(m.fix(), m.fix())")


@glibc
def test_fixed_thresholds_reuse_what_a_step_freed():
    assert page_faults("") >= 10 * STEP_PAGES  # glibc's own: most steps fault it in again
    assert page_faults(FIX) <= 2 * STEP_PAGES  # faulted in once, then reused


@glibc
def test_a_settings_file_fixes_them_when_the_loop_is_created(tmp_path: Path):
    settings = tmp_path / "s.tuneup.json"
    setup = ("import torch; from tuneup import tuned_loop\n"
             "m = torch.nn.Linear(2, 2)\n"
             "tuned_loop(m, torch.optim.SGD(m.parameters(), lr=0.1))")
    settings.write_text(json.dumps({"schema_version": 1,
                                    "knobs": {"fixed_malloc_thresholds": True}}))
    assert page_faults(setup, TUNEUP_SETTINGS=str(settings)) <= 2 * STEP_PAGES
    settings.write_text(json.dumps({"schema_version": 1, "knobs": {}}))
    assert page_faults(setup, TUNEUP_SETTINGS=str(settings)) >= 10 * STEP_PAGES


@glibc
@pytest.mark.parametrize(("env", "kept"), [
    ({"MALLOC_TRIM_THRESHOLD_": "131072"}, "your MALLOC_TRIM_THRESHOLD_ kept"),
    ({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}, "your GLIBC_TUNABLES kept"),
    ({"LD_PRELOAD": "/nonexistent/libjemalloc.so.2"}, "jemalloc is preloaded"),
])
def test_the_users_own_choice_wins(env, kept):
    done = subprocess.run([sys.executable, "-c", FIX], capture_output=True, text=True,
                          env={**CLEAN, **env}, check=True)
    assert kept in done.stdout


def test_elsewhere_it_says_why_not(monkeypatch):
    monkeypatch.setattr(malloc_thresholds, "_fixed", False)
    monkeypatch.setattr(platform, "libc_ver", lambda: ("", ""))
    assert malloc_thresholds.fix() == "the C library is not glibc"
    with pytest.warns(TuneupWarning, match="fixed_malloc_thresholds ignored: the C library is "
                                           "not glibc"):
        apply.apply_process_knobs(Knobs(fixed_malloc_thresholds=True))


def test_the_knob_is_a_bool():
    assert Knobs.from_dict({"fixed_malloc_thresholds": True}).fixed_malloc_thresholds is True
    with pytest.raises(SettingsError, match="fixed_malloc_thresholds must be true, false or null"):
        Knobs.from_dict({"fixed_malloc_thresholds": "yes"})
