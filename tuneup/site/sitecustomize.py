"""Loaded by every Python process tuneup starts with this folder first on ``PYTHONPATH``: arms
the probes whose variables are set (the watcher's plain-DataLoader timing,
:mod:`tuneup.watch.plain_probe`; autotune's write guard, :mod:`tuneup.autotune.write_guard`),
then runs the process's own ``sitecustomize``, if any, as Python would have without this
folder. Any failure leaves the process unprobed, never broken."""

import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.realpath(__file__))


def _arm_probes() -> None:
    package_root = os.path.dirname(os.path.dirname(_HERE))
    if package_root not in sys.path:
        sys.path.append(package_root)  # last: another install of tuneup in the job wins
    for variable, module in (("TUNEUP_WATCH_FEED", "tuneup.watch.plain_probe"),
                             ("TUNEUP_WRITE_JOURNAL", "tuneup.autotune.write_guard")):
        if os.environ.get(variable):
            try:
                importlib.import_module(module).install_from_environment()
            except Exception:  # noqa: BLE001
                pass


def _chain() -> None:
    for entry in sys.path:
        if not entry or os.path.realpath(entry) == _HERE:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_job_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


_arm_probes()
_chain()
