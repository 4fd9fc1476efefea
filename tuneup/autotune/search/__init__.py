"""The budgeted, staged search: which knobs to try, in what order, and what to keep.

Not a grid. After one baseline trial (plain PyTorch), the step's time split (data wait,
device, host: :attr:`TrialResult.breakdown`) gives each stage a ceiling by Amdahl's law
(:mod:`~tuneup.autotune.search.policy`), and stages run in order of ceiling, recomputed
from the incumbent's latest run after each one; a stage whose ceiling is within the noise
is skipped with a note saying why. Where the breakdown predicts more than one change (the
workers that hide the data wait, pinned memory, a GPU's autocast dtype) that point is
measured first, and the stages verify each part from there. Each stage starts from the best
settings so far (the *incumbent*) and measures it again in the same process as its
candidates, so every comparison is like for like:

* ``amp``      autocast dtypes the device supports (CUDA also TF32 matmuls), loss-checked;
* ``loader``   the predicted ``num_workers`` and its neighbours (half, twice);
* ``loader_extras``  ``pin_memory`` on CUDA, ``prefetch_factor`` while the loop waits;
* ``batch``    smaller micro-batches (same effective batch): for memory headroom, or on a
               CPU where its ceiling (cache effects) clears the noise;
* ``threads``  intra-op threads on a CPU run, where workers and threads share the cores;
* ``cudnn``    cuDNN's autotuner, where the model has convolutions;
* ``compile``  last while the budget holds its share now (stages of smaller ceilings
               keep it), else in its ceiling's turn (the stages end once it is adopted,
               each noted); amortised: kept only when the saved step time times the
               expected steps exceeds the measured compile time, and its losses match
               eager;
* ``loader_after_compile``  when the compiled loop waits for data: the workers its
               breakdown predicts, a deeper prefetch.

A stage whose ceiling is below compile's (or visited again) leaves compile its share of the
budget. Finally the winner, the defaults and a rival are re-run interleaved
(:mod:`~tuneup.autotune.search.confirm`): within noise the simpler settings win.

Modules: ``budget`` (what fits), ``judge`` (pure verdicts on measurements), ``verdict``
(when interleaved rounds settle a comparison), ``stages`` (the registry), ``confirm``,
``policy`` (ceilings, order, spend), ``run`` (the orchestration).
"""

from tuneup.autotune.search.budget import Executor
from tuneup.autotune.search.judge import Options, Rejection, loss_drift
from tuneup.autotune.search.labels import complexity, consistent, describe
from tuneup.autotune.search.outcome import Change, Outcome, SearchError
from tuneup.autotune.search.run import Search

__all__ = ["Change", "Executor", "Options", "Outcome", "Rejection", "Search", "SearchError",
           "complexity", "consistent", "describe", "loss_drift"]
