"""Loading what this run's own processes saved: the reference state and the check batches.

Weights-only loading refuses any class it does not know, and batches are often of one (a
tokenizer's ``BatchEncoding``, ``DataCollatorWithPadding``'s output, a script's own
dataclass): refused, a run had no check losses, so amp, compile and micro-batches all lost
as "not comparable". Such a file is unpickled fully only when nobody else could have
written it: a regular file of this user's in a folder of this user's that no one else may
write (the run's work folder, made by ``mkdtemp``)."""

from __future__ import annotations

import os
import pickle
import stat
from pathlib import Path
from typing import Any

import torch


def load_own(path: Path) -> Any:
    """``path`` loaded weights-only, or fully where that refuses a type and the file is
    this user's alone; ``None`` where it is refused and could be someone else's."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        if not written_by_us(path):
            return None
        return torch.load(path, map_location="cpu", weights_only=False)


def written_by_us(path: Path) -> bool:
    """A regular file (not a link) of this user's, in a folder of this user's that no one
    else can write."""
    try:
        file, folder = os.lstat(path), os.stat(path.parent)
    except OSError:
        return False
    me = os.geteuid()
    return (stat.S_ISREG(file.st_mode) and file.st_uid == me and folder.st_uid == me
            and not folder.st_mode & (stat.S_IWGRP | stat.S_IWOTH))
