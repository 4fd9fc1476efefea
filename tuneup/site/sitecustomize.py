"""Loaded by every Python process tuneup starts with this folder first on ``PYTHONPATH``: arms
the probes whose variables are set (:data:`tuneup.site.PROBES`), then runs the process's own
``sitecustomize``, if any, as Python would have without this folder. Only ``tuneup`` itself is
made importable (never the other packages beside it, which would change the job), and a
``tuneup`` of the job's own wins. Any failure leaves the process unprobed, never broken."""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.realpath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))  # the folder that holds the tuneup package


class _TuneupOnly:
    """Finds the top-level ``tuneup`` package in :data:`_ROOT` and nothing else."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "tuneup":
            return None
        return importlib.machinery.PathFinder.find_spec(name, [_ROOT])


def _arm_probes():
    sys.meta_path.append(_TuneupOnly)  # last: a tuneup installed in the job's own env wins
    try:
        from tuneup.site import PROBES
    except Exception:  # noqa: BLE001
        return
    for variable, module in PROBES:
        if os.environ.get(variable):
            try:
                importlib.import_module(module).install_from_environment()
            except Exception:  # noqa: BLE001 - the runner sees an unarmed guard: no journal
                pass


def _chain():
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
