"""Loaded by every Python process of a job ``tuneup watch`` started: arms the plain-DataLoader
probe (:mod:`tuneup.watch.plain_probe`), then runs the job's own ``sitecustomize``, if any, as
Python would have without this folder first on the path. Any failure leaves the job unwatched,
never broken."""

import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.realpath(__file__))


def _arm_probe() -> None:
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))
    if package_root not in sys.path:
        sys.path.append(package_root)  # last: another install of tuneup in the job wins
    try:
        from tuneup.watch.plain_probe import install
    except Exception:  # noqa: BLE001
        return
    try:
        install()
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


_arm_probe()
_chain()
