"""Run a function right after a module is first imported, without importing it: how the
probes tuneup puts inside a job (the watcher's DataLoader timing, autotune's write guard)
reach torch only in processes that load it."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


class _After(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        original, callback = spec.loader.exec_module, self.callback  # type: ignore[union-attr]

        def exec_module(module: ModuleType) -> None:
            original(module)
            sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
            try:
                callback(module)
            except Exception:  # noqa: BLE001 - another version of the module: no probe, no harm
                pass

        spec.loader.exec_module = exec_module  # type: ignore[method-assign,union-attr]
        return spec


def after_import(name: str, callback: Callable[[ModuleType], None]) -> None:
    """``callback(module)`` once ``name`` has been executed (now, if it already was)."""
    if name in sys.modules:
        callback(sys.modules[name])
        return
    sys.meta_path.insert(0, _After(name, callback))
