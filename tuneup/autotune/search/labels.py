"""How knobs are named and weighed in the search: trial ids, "simpler", valid combinations."""

from __future__ import annotations

from tuneup.settings import Knobs
from tuneup.settings.schema import knob_facts


def describe(knobs: Knobs) -> str:
    """Short label of the knobs that differ from PyTorch defaults: ``workers=2,amp=bfloat16``."""
    parts = [f"{knob_facts(k).label}={v}" for k, v in knobs.changed().items()]
    return ",".join(parts) or "defaults"


def complexity(knobs: Knobs) -> int:
    """Weight of the changes in ``knobs``: fewer and lighter changes win ties (a change of
    no weight, a deeper prefetch, is not decided by weight: docs/autotune.md, The method)."""
    return sum(knob_facts(name).complexity for name in knobs.changed())


def weightless_change(a: Knobs, b: Knobs) -> bool:
    """``a`` and ``b`` differ only in knobs of no weight: neither is the simpler."""
    return all(knob_facts(name).complexity == 0
               for name, value in a.to_dict().items() if getattr(b, name) != value)


def consistent(knobs: Knobs) -> Knobs:
    """Drop the worker-only knobs when there are no workers (the schema refuses them)."""
    if knobs.num_workers:
        return knobs
    return knobs.replace(prefetch_factor=None, persistent_workers=None)
