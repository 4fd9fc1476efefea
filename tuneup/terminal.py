"""The one way tuneup makes a rich console: a reader that goes away is an error, not exit 1."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from rich.console import Console

from tuneup.errors import TuneupError


class OutputClosed(TuneupError):
    """Standard output was closed mid-report (``| head`` exited): the exit code a pipe's
    SIGPIPE would give, never 1, which means "an error finding"."""

    exit_code = 128 + signal.SIGPIPE

    def __init__(self) -> None:
        super().__init__("standard output was closed before the output was complete "
                         "(the reader of the pipe exited); nothing else went wrong")


def stdout_closed() -> OutputClosed:
    """Point standard output at /dev/null (so Python's final flush cannot fail again) and
    return the error to raise."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no usable descriptor behind sys.stdout
        pass
    finally:
        os.close(devnull)
    return OutputClosed()


class _Console(Console):
    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise stdout_closed()


def console(**options: Any) -> Console:
    """A rich ``Console`` (same options) that reports a closed pipe as :class:`OutputClosed`."""
    return _Console(**options)
