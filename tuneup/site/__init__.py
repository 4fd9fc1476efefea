"""A folder tuneup puts first on ``PYTHONPATH`` of the processes it starts (``tuneup watch``'s
job, ``tuneup autotune``'s trials): its ``sitecustomize`` arms the probe each variable below
names, in every Python process of the job, from the interpreter's start.

Every Python the job starts imports this module, so it imports nothing (``SITE_DIR`` is
made on first use)."""

import os

ENV_FEED = "TUNEUP_WATCH_FEED"  # the watcher's feed directory: the plain-DataLoader probe
ENV_JOURNAL = "TUNEUP_WRITE_JOURNAL"  # autotune's journal of what a trial writes
# (variable, the probe's module, the import that arms it: None at once). The watcher's probe
# times DataLoaders: a process that never imports torch pays nothing for it. The write guard
# must see every write from the start, whatever the process imports.
PROBES = ((ENV_FEED, "tuneup.watch.plain_probe", "torch"),
          (ENV_JOURNAL, "tuneup.autotune.write_guard", None))


def __getattr__(name: str) -> object:
    if name == "SITE_DIR":  # a Path, for the parents that put it on PYTHONPATH
        from pathlib import Path

        return Path(os.path.dirname(os.path.abspath(__file__)))
    raise AttributeError(f"module 'tuneup.site' has no attribute {name!r}")
