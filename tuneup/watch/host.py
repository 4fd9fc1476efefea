"""The machine's side of a sample: CPU saturation, iowait, swapping and free memory."""

from __future__ import annotations

import time
from collections.abc import Callable

import psutil

from tuneup.watch.samples import HostSample


class Host:
    """Machine figures over the time since the previous :meth:`sample`."""

    def __init__(self, usable_cores: float | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.usable_cores = usable_cores
        self.clock = clock
        psutil.cpu_times_percent(interval=None)  # the reference the first sample compares to
        self._swapped, self._when = self._swap_total(), clock()

    @staticmethod
    def _swap_total() -> int | None:
        try:
            swap = psutil.swap_memory()
        except (psutil.Error, OSError, RuntimeError):  # no /proc/swaps in some containers
            return None
        return int(swap.sin + swap.sout)

    def sample(self) -> HostSample:
        times = psutil.cpu_times_percent(interval=None)
        iowait = getattr(times, "iowait", None)  # Linux only
        swapped, now = self._swap_total(), self.clock()
        rate = None
        if swapped is not None and self._swapped is not None and now > self._when:
            rate = max(0, swapped - self._swapped) / (now - self._when)
        self._swapped, self._when = swapped, now
        memory = psutil.virtual_memory()
        return HostSample(
            cpu_percent=max(0.0, 100.0 - times.idle - (iowait or 0.0)),
            iowait_percent=iowait, swap_bytes_s=rate,
            memory_available=int(memory.available), memory_total=int(memory.total),
            usable_cores=self.usable_cores,
        )
