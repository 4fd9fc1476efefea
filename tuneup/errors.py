"""One error root for everything tuneup reports to a user, and its exit codes.

Commands raise these; ``tuneup.cli`` prints ``tuneup <command>: <message>`` (one line, no
traceback) and exits with the error's code, in one place, as pip's ``base_command`` does.
Exit codes: 0 fine; 1 the work found a problem or could not be done (the doctor's error
findings, a script that cannot be tuned); 2 bad usage or unreadable input; 130 interrupted
(128 + the signal for SIGTERM / SIGHUP); 141 standard output closed mid-report (as SIGPIPE).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class TuneupError(Exception):
    """Something a user must hear about, in one line that names the fix."""

    exit_code = EXIT_FAILED


class UsageError(TuneupError):
    """Bad arguments or unreadable input: nothing was done."""

    exit_code = EXIT_USAGE


class ScriptError(TuneupError):
    """The training script cannot be probed or tuned (never reached the wrappers, fails
    with PyTorch's defaults)."""


class Interrupted(TuneupError):
    """A signal asked tuneup to stop (Ctrl-C, SIGTERM, SIGHUP); everything was cleaned up."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum
