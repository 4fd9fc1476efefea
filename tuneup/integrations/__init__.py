"""tuneup's settings applied to the training loops people already have: a transformers
``Trainer`` (:func:`tuneup.integrations.transformers.tuned_trainer`) and a Lightning
``Trainer`` (:func:`tuneup.integrations.lightning.tuned_trainer_kwargs`); see
docs/integrations.md.

Importing this package imports neither library: each is an optional extra
(``pip install tuneup[hf]``, ``tuneup[lightning]``), imported only when its integration runs.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str) -> ModuleType:
    """``module``, or one ImportError line naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"tuneup's {extra} integration needs {module}: "
                          f"pip install tuneup[{extra}]") from None
