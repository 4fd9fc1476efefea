"""Loaded by every Python process tuneup starts with this folder first on ``PYTHONPATH``: arms
the probes whose variables are set (:data:`tuneup.site.PROBES`): at once, or only once the
process imports the module that arms it (torch, for the watcher's), then runs the process's
own ``sitecustomize``, if any, as Python would have without this folder.

A process that never imports torch pays only for this file: it imports nothing Python has not
loaded already (``tuneup`` itself is imported only to arm a probe). Only the ``tuneup``
package is made importable, and only while a probe is armed (never the other packages beside
it, which would change the job); a ``tuneup`` of the job's own wins. Any failure leaves the
process unprobed, never broken."""

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
        import importlib.machinery

        return importlib.machinery.PathFinder.find_spec(name, [_ROOT])


def _import_tuneup(module):
    """``module`` of tuneup, found in the job's environment first, else beside this folder;
    once ``tuneup`` is imported its submodules need no finder of ours."""
    sys.meta_path.append(_TuneupOnly)  # last: a tuneup installed in the job's own env wins
    try:
        __import__(module)
        return sys.modules[module]
    finally:
        sys.meta_path.remove(_TuneupOnly)


def _install(module):
    try:
        _import_tuneup(module).install_from_environment()
    except Exception:  # noqa: BLE001 - the runner sees an unarmed guard: no journal
        pass


class _When:
    """Arms a probe when the process first imports ``trigger`` (before it is loaded), then
    stays in ``sys.meta_path``, inert: removing a finder while the import system iterates the
    list would skip the next one."""

    def __init__(self, trigger, module):
        self.trigger, self.module, self.armed = trigger, module, False

    def find_spec(self, name, path=None, target=None):
        if not self.armed and name == self.trigger:
            self.armed = True
            _install(self.module)
        return None


def _probes():
    """:data:`tuneup.site.PROBES`, read from the file beside this one without importing the
    package: a process that arms no probe at once imports nothing of tuneup (nor ``typing``,
    which the package's ``__init__`` needs)."""
    path = os.path.join(_HERE, "__init__.py")
    namespace = {"__name__": "tuneup.site", "__file__": path}
    with open(path, encoding="utf-8") as source:
        exec(compile(source.read(), path, "exec"), namespace)  # noqa: S102 - our own file
    return namespace["PROBES"]


def _arm_probes():
    try:
        probes = _probes()
    except Exception:  # noqa: BLE001
        return
    for variable, module, trigger in probes:
        if os.environ.get(variable):
            if trigger is None:
                _install(module)
            else:
                sys.meta_path.insert(0, _When(trigger, module))


def _chain():
    """The job's own ``sitecustomize`` as Python would have run it: this folder leaves
    ``sys.path`` and ``sitecustomize`` is imported again, so the first one on the rest (a
    module or a package, source or compiled) becomes ``sys.modules["sitecustomize"]``
    (``import sitecustomize`` then gives it, and its classes pickle); an error in it
    propagates to ``site``, which reports it as it would have. Without one, this module
    stays the process's ``sitecustomize``."""
    sys.path[:] = [entry for entry in sys.path
                   if not entry or os.path.realpath(entry) != _HERE]
    ours = sys.modules.pop(__name__)
    try:
        __import__(__name__)  # this import's lock is this thread's: it re-enters
    except ImportError as error:
        if error.name != __name__:
            raise
        sys.modules[__name__] = ours  # importing it (this file) goes on as without a chain


_arm_probes()
_chain()
