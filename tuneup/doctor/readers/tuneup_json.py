"""Read tuneup's own JSON (``tuneup doctor --format json``) back into a Snapshot."""

from __future__ import annotations

from typing import Any

from tuneup.machine.snapshot import Snapshot

# Keys only a Snapshot dict has; a bare environment object must carry some of them.
SNAPSHOT_KEYS = {"platform", "torch", "driver", "gpus", "cpu"}


def environment_of(document: Any) -> dict[str, Any] | None:
    """The environment object of a tuneup JSON document, or ``None`` if it is not one.

    Accepts the full ``{"tuneup": ..., "environment": {...}, ...}`` output or a bare
    environment dict (``Snapshot.to_dict()``).
    """
    if not isinstance(document, dict):
        return None
    environment = document.get("environment")
    if isinstance(environment, dict):
        return environment
    if len(SNAPSHOT_KEYS & set(document)) >= 2:
        return document
    return None


def snapshot_from_json(environment: dict[str, Any]) -> Snapshot:
    """Rebuild the Snapshot; raises ``ValueError`` when a field has the wrong shape."""
    snapshot = Snapshot.from_dict(environment)
    snapshot.source = "json"
    return snapshot
