"""The runtime wrappers: ``tuned_loop`` and ``tuned_loader`` (see docs/runtime.md)."""

from tuneup.runtime.loader import TunedLoader, tuned_loader
from tuneup.runtime.loop import TunedLoop, tuned_loop
from tuneup.runtime.telemetry import Stats

__all__ = ["Stats", "TunedLoader", "TunedLoop", "tuned_loader", "tuned_loop"]
