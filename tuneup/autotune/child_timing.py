"""The device's share of a trial's steps: CUDA events around each measured step.

The child measures each step's wall time and its data wait; on CUDA the events recorded
when the step starts (its batch handed over) and when it ends give the span of the step's
work on the device's timeline, read once after the window's closing synchronize (an event
costs microseconds and no sync). What is left of the wall time is the host's: Python,
launches, ``.item()`` syncs, copies. A span counts the device's idle gaps inside the step
as busy, so a host-bound step shows less host time than it has: the ceilings that read
it (pinned memory, CUDA graphs) are upper bounds on the low side. On a CPU there is no
device timeline: the step less its data wait is the compute (see
:attr:`TrialResult.breakdown`).
"""

from __future__ import annotations

import statistics
from typing import Any

import torch


class DeviceTimer:
    """Event pairs of the measured steps of one trial (nothing off CUDA)."""

    def __init__(self) -> None:
        self.cuda = False
        self.start: Any = None
        self.pairs: list[tuple[Any, Any]] = []

    def reset(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda" and torch.cuda.is_available()
        self.start = None
        self.pairs = []

    def step_started(self) -> None:
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.start.record()

    def step_ended(self, measured: bool) -> None:
        if not self.cuda or self.start is None:
            return
        if measured:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.pairs.append((self.start, end))
        self.start = None

    def device_s(self) -> float | None:
        """Mean device span of the measured steps, in seconds (None off CUDA or unread:
        events are read after the window's synchronize)."""
        if not self.cuda or not self.pairs:
            return None
        try:
            torch.cuda.synchronize()
            return statistics.fmean(s.elapsed_time(e) for s, e in self.pairs) / 1000
        except RuntimeError:  # an event never recorded on this stream: no figure, no failure
            return None
