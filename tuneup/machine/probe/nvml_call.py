"""Every NVML call with a deadline: a wedged driver cannot hang tuneup.

A GPU fallen off the bus or a wedged driver (the "nvidia-smi hangs" case) blocks ``nvmlInit``
or any query forever, inside C, where no signal or exception reaches it. So NVML is only ever
called through :func:`bounded`: the calls run one after another on one daemon thread per NVML
module, and the caller waits at most the deadline (``TUNEUP_NVML_TIMEOUT`` seconds).

A call that does not return in time marks that NVML stuck for the rest of the process: every
later call raises :class:`NvmlTimeout` at once, so no thread piles up behind the stuck one and
``nvmlShutdown`` is never called into a driver that still holds the stuck call. The stuck
thread is a daemon: it does not keep the interpreter from exiting.
"""

from __future__ import annotations

import math
import os
import queue
import threading
from collections.abc import Callable, Mapping
from typing import Any

ENV = "TUNEUP_NVML_TIMEOUT"
DEFAULT_TIMEOUT_S = 10.0  # nvmlInit on 8 GPUs without persistence mode takes a few seconds


class NvmlTimeout(Exception):
    """NVML did not answer within the deadline (the call is left running on its thread)."""

    def __init__(self, call: str, timeout_s: float) -> None:
        self.call, self.timeout_s = call, timeout_s
        super().__init__(f"NVML did not answer within {timeout_s:g} s ({call})")


def timeout_s(environ: Mapping[str, str] = os.environ) -> float:
    """The deadline of one NVML call: ``TUNEUP_NVML_TIMEOUT`` seconds when it is a positive
    number, else :data:`DEFAULT_TIMEOUT_S`."""
    try:
        value = float(environ.get(ENV, ""))
    except ValueError:
        return DEFAULT_TIMEOUT_S
    return value if math.isfinite(value) and value > 0 else DEFAULT_TIMEOUT_S


class _Worker:
    """One daemon thread that runs one NVML module's calls in turn."""

    def __init__(self) -> None:
        self.pid = os.getpid()  # a forked child has no thread: it gets its own worker
        self.jobs: queue.SimpleQueue[tuple[Callable[[], Any], list[Any], threading.Event]] = (
            queue.SimpleQueue())
        self.stuck: NvmlTimeout | None = None
        threading.Thread(target=self._serve, name="tuneup-nvml", daemon=True).start()

    def _serve(self) -> None:
        while True:
            call, box, done = self.jobs.get()
            try:
                box.append((True, call()))
            except BaseException as error:  # handed to the caller, who raises it
                box.append((False, error))
            done.set()

    def call(self, name: str, call: Callable[[], Any], deadline_s: float) -> Any:
        if self.stuck is not None:
            raise NvmlTimeout(self.stuck.call, self.stuck.timeout_s)
        box: list[tuple[bool, Any]] = []
        done = threading.Event()
        self.jobs.put((call, box, done))
        if not done.wait(deadline_s):
            self.stuck = NvmlTimeout(name, deadline_s)
            raise NvmlTimeout(name, deadline_s)
        ok, value = box[0]
        if ok:
            return value
        raise value


_workers: dict[int, tuple[Any, _Worker]] = {}  # id(module) -> (module, its worker)
_workers_lock = threading.Lock()


def _worker(module: Any) -> _Worker:
    with _workers_lock:
        held = _workers.get(id(module))
        if held is None or held[1].pid != os.getpid():
            held = (module, _Worker())  # the module is held so that its id is not reused
            _workers[id(module)] = held
        return held[1]


class BoundedNvml:
    """``module`` (pynvml, or a stand-in with its functions) whose ``nvml*`` functions return
    within the deadline or raise :class:`NvmlTimeout`; constants, structures and error classes
    pass through."""

    def __init__(self, module: Any, deadline_s: float | None = None) -> None:
        self.module = module
        self.deadline_s = timeout_s() if deadline_s is None else deadline_s
        self._worker = _worker(module)

    @property
    def stuck(self) -> NvmlTimeout | None:
        """The call that did not answer in this process, if one did not."""
        return self._worker.stuck

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.module, name)
        if not (name.startswith("nvml") and callable(value)):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._worker.call(name, lambda: value(*args, **kwargs), self.deadline_s)

        return call


def bounded_call(what: str, call: Callable[[], Any], deadline_s: float | None = None) -> Any:
    """``call()`` on a daemon thread of its own, for code that asks NVML behind its own API
    (``torch.cuda.device_count()`` loads libnvidia-ml and calls ``nvmlInit``): its value, its
    exception, or :class:`NvmlTimeout` naming ``what`` after the deadline."""
    deadline_s = timeout_s() if deadline_s is None else deadline_s
    box: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            box.append((True, call()))
        except BaseException as error:  # handed to the caller, who raises it
            box.append((False, error))

    thread = threading.Thread(target=run, name="tuneup-nvml-call", daemon=True)
    thread.start()
    thread.join(deadline_s)
    if not box:
        raise NvmlTimeout(what, deadline_s)
    ok, value = box[0]
    if ok:
        return value
    raise value


def bounded(module: Any = None, deadline_s: float | None = None) -> BoundedNvml:
    """NVML (``pynvml`` unless a stand-in is given) with a deadline on every call; raises
    ImportError when nvidia-ml-py is not installed."""
    if module is None:
        import pynvml as module
    if isinstance(module, BoundedNvml):
        return module
    return BoundedNvml(module, deadline_s)
