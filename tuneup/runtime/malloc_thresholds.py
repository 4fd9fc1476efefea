"""glibc malloc's thresholds fixed, so a step's freed host memory is reused, not faulted in again.

glibc serves a block above its mmap threshold (128 KiB at start) with a fresh ``mmap`` and
unmaps it when freed, and gives the heap's free top back to the system above its trim
threshold: a training step that allocates and frees tensors of a few MiB then faults their
pages in again on every step. glibc raises both thresholds itself as it frees such blocks,
up to the largest block freed (at most 32 MiB and 64 MiB), so a step's speed depends on
what the process allocated before it. Fixing both at those ceilings before the first step
makes it not (measured: docs/autotune.md, Host memory).
"""

from __future__ import annotations

import ctypes
import os
import platform

MMAP_THRESHOLD = 32 * 2**20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # what glibc pairs with a raised mmap threshold
_M_TRIM_THRESHOLD = -1  # mallopt parameters, <malloc.h>
_M_MMAP_THRESHOLD = -3
# the user's own choice of thresholds or allocator wins
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
_OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")

_fixed = False


def fix() -> str | None:
    """Fix the thresholds in this process (and in the loader workers it forks later): None
    when done, otherwise why not. Idempotent."""
    global _fixed
    if _fixed:
        return None
    problem = _why_not()
    if problem is not None:
        return problem
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return "glibc's mallopt is not reachable"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if not (mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and
            mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return "glibc's mallopt refused the thresholds"
    _fixed = True
    return None


def _why_not() -> str | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "the C library is not glibc"
    preload = os.environ.get("LD_PRELOAD", "")
    other = next((name for name in _OTHER_ALLOCATORS if name in preload), None)
    if other is not None:
        return f"{other} is preloaded (LD_PRELOAD) and manages memory instead"
    own = [name for name in _USER_SETTINGS if name in os.environ]
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        own.append("GLIBC_TUNABLES")
    if own:
        return f"your {', '.join(own)} kept"
    return None
