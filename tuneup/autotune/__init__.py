"""``tuneup autotune``: probe a training script in child processes and keep the fastest knobs.

Parent side: :mod:`space` (candidate values), :mod:`search` (staged, budgeted decisions),
:mod:`runner` (process isolation and the probe protocol), :mod:`report` (progress and
result), :mod:`command` (the CLI). The child side lives in :mod:`tuneup.autotune.child`.
"""
