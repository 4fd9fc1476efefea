"""How long the training loop waits for data against the whole run, and the exit summary."""

from __future__ import annotations

import atexit
import math
import os
import sys
import warnings
from dataclasses import dataclass

from tuneup.settings import Measurement

ENV_VERBOSE = "TUNEUP_VERBOSE"
STALL_HINT = 0.10  # above this share of waiting, the summary suggests `tuneup autotune`
# A file without the wait measured at tuning time (written before tuneup recorded it): above
# this share the line says so, without claiming the settings stopped fitting.
STALE_HINT = 0.20
CLEAR_RISE = 0.10  # a tuned run's wait must exceed tuning's by this share at least,
NOISE_MULTIPLE = 2.0  # and by this many times the spread tuning's trials showed,
SLOWER = 0.9  # while its speed stays under this share of tuning's, to be "no longer fit"


@dataclass(frozen=True)
class AtTuning:
    """What the tuned settings measured when autotune chose them (the settings file's
    ``measured``), per process: the figures a run's own are compared with."""

    data_wait_share: float
    data_wait_noise: float
    samples_per_s: float | None

    @classmethod
    def from_measurement(cls, measured: Measurement) -> AtTuning | None:
        """None for a file without the wait measured at tuning time, or with odd values."""
        share, noise = measured.data_wait_share, measured.data_wait_noise or 0.0
        if not (_number(share) and 0 <= share <= 1 and _number(noise) and noise >= 0):
            return None
        speed = measured.tuned_samples_per_s
        ranks = measured.local_ranks if _number(measured.local_ranks) else 1
        per_process = speed / max(1, ranks) if _number(speed) and speed > 0 else None
        return cls(float(share), float(noise), per_process)

    def clearly_worse(self, stats: Stats) -> bool:
        """The run waited clearly longer than tuning measured, and was slower for it."""
        rise = max(CLEAR_RISE, NOISE_MULTIPLE * self.data_wait_noise)
        slower = (self.samples_per_s is None or stats.samples_per_s is None
                  or stats.samples_per_s < SLOWER * self.samples_per_s)
        return stats.data_wait_share > self.data_wait_share + rise and slower


def _number(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


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

    def summary(self, tuned: bool = False, at_tuning: AtTuning | None = None) -> str:
        """One line for the end of the run. It suggests tuning only when no tuned knob was
        applied (a run that already uses them is not told to do what was just done; a file
        that kept PyTorch's defaults tuned nothing). A tuned run is told its settings no
        longer fit only when it waited for data clearly longer than they did at tuning time
        (``at_tuning``) and ran slower; without those figures, a long wait is only named."""
        if not self.elapsed_s:
            return "tuneup: no batches were loaded"
        text = (f"tuneup: {self.steps} steps, {self.samples_per_s:.0f} samples/s, "
                f"waited for data {self.data_wait_share:.0%} of the time")
        if not tuned:
            stalled = self.data_wait_share >= STALL_HINT
            return text + (" — run `tuneup autotune`" if stalled else "")
        if at_tuning is None:
            if self.data_wait_share >= STALE_HINT:
                return text + (" with the tuned settings (their file does not say how long "
                               "they waited when tuned; if the data or machine changed since, "
                               "re-run `tuneup autotune`)")
            return text + " (tuned settings applied)"
        then = f"{at_tuning.data_wait_share:.0%} when tuned"
        if at_tuning.clearly_worse(self):
            return text + (f" with the tuned settings ({then}): they no longer fit this data "
                           "or machine — re-run `tuneup autotune`")
        return text + f" (tuned settings applied; {then})"


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
            at_tuning = _at_tuning() if searched else None
            print(self.stats().summary(tuned=bool(searched), at_tuning=at_tuning),
                  file=sys.stderr, flush=True)


def _at_tuning() -> AtTuning | None:
    """The settings file's figures from tuning time (read again at exit, silently: loading
    it for the knobs already said whatever was wrong with it)."""
    from tuneup.settings import store

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        settings = store.load()
    return AtTuning.from_measurement(settings.measured) if settings is not None else None
