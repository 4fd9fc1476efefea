"""How long the training loop waits for data against the whole run, and the exit summary."""

from __future__ import annotations

import atexit
import os
import sys
from dataclasses import dataclass

ENV_VERBOSE = "TUNEUP_VERBOSE"
STALL_HINT = 0.10  # above this share of waiting, the summary suggests `tuneup autotune`
STALE_HINT = 0.20  # with tuned settings, a wait above this says they no longer fit


@dataclass(frozen=True)
class Stats:
    """What ``loop.stats()`` returns."""

    steps: int  # optimizer steps (batches for a loader without a loop)
    samples: int  # samples delivered by the loader
    elapsed_s: float  # from the first batch request to the latest one
    data_wait_s: float  # time spent inside the loader waiting for a batch
    copy_s: float  # time spent moving batches to the loop's device (host-to-device)
    samples_per_s: float | None
    data_wait_share: float | None  # the input-stall share, 0..1

    def summary(self, tuned: bool = False) -> str:
        """One line for the end of the run. It suggests tuning only when no tuned knob was
        applied (a run that already uses them is not told to do what was just done; a file
        that kept PyTorch's defaults tuned nothing), or when the tuned run still waits for data
        long enough that the settings no longer fit."""
        if not self.elapsed_s:
            return "tuneup: no batches were loaded"
        text = (f"tuneup: {self.steps} steps, {self.samples_per_s:.0f} samples/s, "
                f"waited for data {self.data_wait_share:.0%} of the time")
        if not tuned and self.data_wait_share >= STALL_HINT:
            text += " — run `tuneup autotune`"
        elif tuned and self.data_wait_share >= STALE_HINT:
            text += (" with the tuned settings: they no longer fit this data or machine — "
                     "re-run `tuneup autotune`")
        elif tuned:
            text += " (tuned settings applied)"
        return text


class Telemetry:
    """Counters the loader updates per batch (plain attributes: this is the hot path)."""

    __slots__ = ("started", "latest", "data_wait_s", "copy_s", "samples", "steps")

    def __init__(self) -> None:
        self.started: float | None = None
        self.latest = 0.0
        self.data_wait_s = 0.0
        self.copy_s = 0.0
        self.samples = 0
        self.steps = 0
        if os.environ.get(ENV_VERBOSE, "").strip() not in ("", "0"):
            atexit.register(self.print_summary)

    def stats(self) -> Stats:
        elapsed = self.latest - self.started if self.started is not None else 0.0
        return Stats(
            steps=self.steps, samples=self.samples, elapsed_s=elapsed,
            data_wait_s=self.data_wait_s, copy_s=self.copy_s,
            samples_per_s=self.samples / elapsed if elapsed > 0 else None,
            data_wait_share=min(1.0, self.data_wait_s / elapsed) if elapsed > 0 else None,
        )

    def print_summary(self) -> None:
        if self.started is not None:
            from tuneup.runtime.apply import settings_knobs  # cached: the file is not re-read
            from tuneup.settings.schema import knob_names

            searched = set(settings_knobs().changed()) - set(knob_names(group=None))
            print(self.stats().summary(tuned=bool(searched)), file=sys.stderr, flush=True)
