"""tuneup: make PyTorch training fast on the machine it lands on.

``tuned_loader`` and ``tuned_loop`` are imported lazily so that ``tuneup doctor --from``
never imports torch.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "tuned_loader", "tuned_loop"]


def __getattr__(name: str) -> Any:
    if name in ("tuned_loader", "tuned_loop"):
        from tuneup import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'tuneup' has no attribute {name!r}")
