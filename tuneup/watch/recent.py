"""The live verdict of one job: its last :data:`WINDOW_S` seconds of samples, reduced and
judged. The foreground watcher and the daemon (one per job) share it."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from tuneup.machine.snapshot import printable
from tuneup.watch.samples import Sample
from tuneup.watch.verdict import Figures, Verdict, decide, reduce

WINDOW_S = 10.0  # recent enough to follow a job's phases, long enough to hold
MAX_SCRIPT_CHARS = 256  # of a script's path, in the verdicts' text and the metrics' labels


def script_of(command: Sequence[str] | None) -> str:
    """The training script a command runs, for the actions' commands (``train.py`` if none):
    printable, as it reaches terminals and the metrics' labels (another user's process may
    name its script with escape sequences, or with bytes that are no UTF-8)."""
    for word in command or ():
        if word.endswith(".py"):
            return printable(word, MAX_SCRIPT_CHARS, one_line=True)
    return "train.py"


class Recent:
    """The samples of the last :data:`WINDOW_S` seconds and the verdict over them."""

    def __init__(self, command: Sequence[str] | None) -> None:
        self.script = script_of(command)
        self.window: deque[Sample] = deque()
        self.figures: Figures | None = None
        self.verdict: Verdict | None = None

    def add(self, sample: Sample) -> Verdict | None:
        """Take ``sample``; the verdict over the window (none before two samples)."""
        self.window.append(sample)
        while self.window[0].t < sample.t - WINDOW_S:
            self.window.popleft()
        self.figures = reduce(self.window) if len(self.window) > 1 else None
        self.verdict = decide(self.figures, self.script) if self.figures is not None else None
        return self.verdict

    @property
    def latest(self) -> Sample | None:
        return self.window[-1] if self.window else None
