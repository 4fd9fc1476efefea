"""The budgeted, staged search: which knobs to try, in what order, and what to keep.

Not a grid. After one baseline trial (plain PyTorch), stages run in order of expected
impact, each starting from the best settings so far (the *incumbent*) and measuring it
again in the same process as its candidates, so every comparison is like for like:

* ``amp``      autocast dtypes the device supports (CUDA also TF32 matmuls), loss-checked;
* ``batch``    smaller micro-batches (same effective batch), early stop; skipped when the
               script cannot be micro-batched (the child says why);
* ``loader``   ``num_workers`` upwards with early stop, then ``prefetch_factor`` /
               ``pin_memory`` where they matter and ``persistent_workers`` from the
               measured worker start-up (only for loaders that do not shuffle);
* ``threads``  intra-op threads on a CPU run, where workers and threads share the cores;
* ``compile``  last (but for the deeper prefetch below) and amortised: kept only when the
               saved step time times the expected steps exceeds the measured compile
               time, and its losses match eager;
* ``deeper_prefetch``  after compile, when the compiled loop waits for data.

An input-bound baseline visits ``loader`` and its extras right after ``amp`` (which sets the
compute step the workers must keep up with). A stage that found nothing is visited again
once if later stages moved the incumbent. A stage whose budget held no race rounds adopts a
change only beyond twice the machine's window-to-window spread; on a CPU a micro-batch
is kept only when its race shows it faster beyond noise. Finally the winner, the
defaults and a rival (a doubtful change undone, the other side of the compile race, the
smallest gain undone, or else the fastest other setting measured) are re-run interleaved
until each comparison is settled or the budget is spent: within noise the simpler settings
win, compile is decided on its race's rounds and these together, and the rival is reported
as the runner-up with the confidence that the pick is faster.

Modules: ``budget`` (what fits), ``judge`` (pure verdicts on measurements), ``verdict``
(when interleaved rounds settle a comparison), ``stages`` (the registry), ``confirm``,
``run`` (the orchestration).
"""

from tuneup.autotune.search.budget import Executor
from tuneup.autotune.search.judge import Options, Rejection, loss_drift
from tuneup.autotune.search.labels import complexity, consistent, describe
from tuneup.autotune.search.outcome import Change, Outcome, SearchError
from tuneup.autotune.search.run import Search

__all__ = ["Change", "Executor", "Options", "Outcome", "Rejection", "Search", "SearchError",
           "complexity", "consistent", "describe", "loss_drift"]
