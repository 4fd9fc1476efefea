"""Shared helpers: a stand-in child that speaks the probe protocol without torch."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

@pytest.fixture(autouse=True)
def state_home(tmp_path_factory, monkeypatch) -> Path:
    """Versions a folder compare sets aside go to a folder of the test's, not the home's."""
    home = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home


# The child side of docs/probe-protocol.md, scripted: BEHAVIOUR maps a trial id to what the
# "training script" does in that trial. Fast (no torch), deterministic.
FAKE_CHILD = textwrap.dedent('''
    import json, os, signal, sys, time
    BEHAVIOUR = {behaviour!r}
    HELLO = {hello!r}
    plan = json.load(open(os.environ["TUNEUP_PROBE"]))
    waits = HELLO.get("waits_for_next_plan") and plan.get("next_plan")
    out = open(plan["results"], "a")
    def emit(event):
        out.write(json.dumps(event) + "\\n"); out.flush()
    emit(dict(HELLO, event="hello", pid=os.getpid()))
    n = 0  # trials this process started
    while True:
        for trial in plan["trials"]:
            if waits and os.path.exists(plan["next_plan"]):
                break  # stopped early: the next plan replaces this one's rest
            what = BEHAVIOUR.get(trial["id"], "ok")
            emit({{"event": "trial_start", "id": trial["id"], "t": time.time()}})
            n += 1
            if BEHAVIOUR.get("*") == "short" and n > 1:  # the script's own loop ends mid-trial
                emit({{"event": "exit", "reason": "script-ended", "trial": trial["id"]}}); sys.exit(0)
            if what == "crash":
                print("Fatal Python error: Segmentation fault", file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if what == "hang":
                time.sleep(600)
            if what == "slow":
                time.sleep(1.0)
            if what == "alloc":
                hog = bytearray(400 * 2**20); time.sleep(600)
            if what == "error-unless-first":  # fails only after another trial ran in this process
                what = "ok" if n == 1 else "error"
            if what == "slow-error":  # a trial the parent drops, failing in its last step
                time.sleep(0.5); what = "error"
            if what in ("oom", "error"):
                emit({{"event": "trial_end", "id": trial["id"], "status": what,
                       "message": "CUDA out of memory" if what == "oom" else "ValueError: bad"}})
                os._exit(3)
            knobs = trial["knobs"]
            step = 0.01 * (1 + (knobs.get("num_workers") or 0))
            emit({{"event": "trial_end", "id": trial["id"], "status": "ok", "samples_per_s": 64 / step,
                   "step_s": step, "step_s_all": [step] * 6, "warmup_s": 0.1, "pid": os.getpid(),
                   "data_wait_share": 0.0, "check_losses": [2.3, 2.2, 2.1] if trial["check"] else None,
                   "peak_memory_bytes": 1000}})
        else:
            emit({{"event": "done"}})
        if not waits:
            os._exit(0)
        while not os.path.exists(plan["next_plan"]):
            time.sleep(0.01)
        plan = json.load(open(plan["next_plan"]))
        out = open(plan["results"], "a")
''')

HELLO = {"device": "cpu", "effective_batch": 64, "dataset_size": 1024, "amp_dtypes": ["bfloat16"],
         "compile_available": True, "cpu_threads": 2, "usable_cores": 2}


@pytest.fixture
def fake_script(tmp_path: Path):
    """``fake_script({"trial-id": "crash"})`` -> path of a stand-in training script; keywords
    are added to its hello event."""

    def make(behaviour: dict[str, str] | None = None, name: str = "train.py",
             **hello: object) -> Path:
        path = tmp_path / name
        path.write_text(FAKE_CHILD.format(behaviour=behaviour or {}, hello={**HELLO, **hello}))
        return path

    return make
