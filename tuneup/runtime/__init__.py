"""The runtime wrappers: ``tuned_loop`` and ``tuned_loader`` (see docs/runtime.md).

Imported lazily, so that ``tuneup.runtime.hooks`` (what observers and their parents name)
is importable without torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Stats", "TunedLoader", "TunedLoop", "tuned_loader", "tuned_loop"]

_HOMES = {"Stats": "telemetry", "TunedLoader": "loader", "tuned_loader": "loader",
          "TunedLoop": "loop", "tuned_loop": "loop"}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(f"tuneup.runtime.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'tuneup.runtime' has no attribute {name!r}")
