"""The last counters of a multiprocessing child. Hogwild's trainers (``mp.Process``) end
through ``os._exit``: ``atexit`` never runs there, so their feed kept the figures of up to a
period before the end (a 1 s loop's summary read its first batch's 100 % data wait).
multiprocessing runs its own finalizers before that exit; this registers with them."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

_registered: set[tuple[int, int]] = set()  # (pid, id of the callback's owner): once each


def publish_when_child_ends(owner: object, publish: Callable[[], None]) -> None:
    """Call ``publish`` as this process ends, if it is a multiprocessing child (in the
    child: the registry it inherits is cleared when it starts). Cheap to call per batch."""
    key = (os.getpid(), id(owner))
    if key in _registered:
        return
    _registered.add(key)
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is None or multiprocessing.parent_process() is None:
        return  # not a multiprocessing child: atexit publishes
    from multiprocessing import util

    util.Finalize(None, publish, exitpriority=100)
