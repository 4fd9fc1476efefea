"""glibc malloc's thresholds pinned, so freed host memory is reused instead of faulted in again.

glibc serves a block above its mmap threshold (128 KiB at start) with a fresh ``mmap`` and
unmaps it on free, and returns the heap's free top to the system above its trim threshold:
a training step that allocates and frees tensors of a few MiB then pays page faults for them
on every step. glibc raises both thresholds itself as it frees such blocks (to 32 MiB and
64 MiB at most), so a step's speed depends on what the process allocated before it: on
docs/examples/train_mlp.py eager bfloat16 ran 4,200-5,500 samples/s with the defaults and
6,100-7,700 pinned, and in a process that alternated eager and compiled windows compile
read 7 % faster than eager, though 2-6 % slower pinned (2026-11-26, docs/autotune.md).
Pinning both at glibc's own ceilings from the start is the state its heuristic reaches
anyway, reached before the first step; memory it keeps is at most the trim threshold per
arena beyond the peak.
"""

from __future__ import annotations

import ctypes
import platform

MMAP_THRESHOLD = 32 * 2**20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # what glibc pairs with a raised mmap threshold
_M_TRIM_THRESHOLD = -1  # mallopt parameters, <malloc.h>
_M_MMAP_THRESHOLD = -3

_pinned = False


def pin_malloc_thresholds() -> str | None:
    """Pin the thresholds in this process (and the workers it forks later); None when done,
    otherwise why it cannot be (not glibc). Idempotent."""
    global _pinned
    if _pinned:
        return None
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "the C library is not glibc"
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return "glibc's mallopt is not reachable"
    if not (mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and
            mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return "glibc's mallopt refused the thresholds"
    _pinned = True
    return None
