"""A folder tuneup puts first on ``PYTHONPATH`` of the processes it starts (``tuneup watch``'s
job, ``tuneup autotune``'s trials): its ``sitecustomize`` arms the probe each variable below
names, in every Python process of the job, from the interpreter's start."""

from pathlib import Path

SITE_DIR = Path(__file__).parent
ENV_FEED = "TUNEUP_WATCH_FEED"  # the watcher's feed directory: the plain-DataLoader probe
ENV_JOURNAL = "TUNEUP_WRITE_JOURNAL"  # autotune's journal of what a trial writes
PROBES = ((ENV_FEED, "tuneup.watch.plain_probe"), (ENV_JOURNAL, "tuneup.autotune.write_guard"))
