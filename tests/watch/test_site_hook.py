"""The figures a job's processes publish, and what the site hook does to them (issue 40,
item 12): a forked helper never publishes its parent's counters under its own pid; the job's
own ``sitecustomize`` runs as Python would run it (a package too, importable afterwards by
its name, its classes picklable); a Python that never imports torch loads nothing of
tuneup's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

from tuneup import tuned_loader, tuned_loop
from tuneup.site import ENV_FEED, SITE_DIR
from tuneup.watch import feed, plain_probe


@pytest.fixture
def base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("TUNEUP_", "PYTHONPATH"))}


def under_watch(env: dict[str, str], feed_directory: Path, *extra: Path) -> dict[str, str]:
    return {**env, ENV_FEED: str(feed_directory),
            "PYTHONPATH": os.pathsep.join([str(SITE_DIR), *map(str, extra)])}


def run(code: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=60)


def in_a_fork(child: callable) -> int:
    """Run ``child`` in a forked process that then exits; its pid once it has."""
    pid = os.fork()
    if pid == 0:
        try:
            child()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    return pid


def trained(directory: Path, steps: int) -> feed.Feed:
    observer = feed.Feed(directory)
    model = torch.nn.Linear(4, 1)
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
    loader = tuned_loader(TensorDataset(torch.randn(8 * steps, 4), torch.randn(8 * steps, 1)),
                          batch_size=8, loop=loop)
    for batch in observer.batches(loader, iter(loader.dataloader)):
        loop.train_step(batch, lambda b: ((loop.model(b[0]) - b[1]) ** 2).mean())
    return observer


def records(directory: Path) -> dict[str, dict]:
    return {path.name: json.loads(path.read_text()) for path in directory.glob("*.json")}


def test_a_forked_helper_publishes_no_counters_and_a_forked_trainer_its_own(tmp_path):
    observer = trained(tmp_path, steps=3)
    observer.publish()
    parent = records(tmp_path)
    helper = in_a_fork(observer.publish)  # what its atexit does when it exits normally
    assert records(tmp_path) == parent and f"{helper}.json" not in records(tmp_path)

    def trains() -> None:  # a trainer forked by a launcher, with the observer inherited
        trained_again = observer
        model = torch.nn.Linear(4, 1)
        loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
        loader = tuned_loader(TensorDataset(torch.randn(40, 4), torch.randn(40, 1)),
                              batch_size=8, loop=loop)
        for batch in trained_again.batches(loader, iter(loader.dataloader)):
            loop.train_step(batch, lambda b: ((loop.model(b[0]) - b[1]) ** 2).mean())

    trainer = in_a_fork(trains)
    assert records(tmp_path)[f"{trainer}.json"]["steps"] == 5
    assert records(tmp_path)[f"{os.getpid()}.json"] == parent[f"{os.getpid()}.json"]


def test_the_plain_probe_publishes_no_parent_counters_from_a_fork(tmp_path):
    probe = plain_probe._Probe(tmp_path)
    iterator = type("Iterator", (), {"_tuneup_batch": 8})()
    for step in range(4):
        probe.count(iterator, float(step), step + 0.5)
    probe.publish()
    before = records(tmp_path)
    helper = in_a_fork(probe.publish)
    assert records(tmp_path) == before and f"{helper}.json" not in records(tmp_path)


@pytest.mark.parametrize("layout", ["module", "package"])
def test_the_job_s_own_sitecustomize_runs_as_python_would(tmp_path, base_env, layout):
    own = tmp_path / "own"
    code = textwrap.dedent("""
        import builtins
        builtins.JOB_SITE = "ran"
        MARK = "the job's"
        class Setting:
            pass
    """)
    if layout == "package":
        (own / "sitecustomize").mkdir(parents=True)
        (own / "sitecustomize" / "__init__.py").write_text(code)
    else:
        own.mkdir()
        (own / "sitecustomize.py").write_text(code)
    job = ("import builtins, pickle, sitecustomize\n"
           "again = pickle.loads(pickle.dumps(sitecustomize.Setting()))\n"
           "print(builtins.JOB_SITE, sitecustomize.MARK, type(again).__module__)")
    done = run(job, under_watch(base_env, tmp_path / "feed", own), tmp_path)
    assert done.stdout.strip() == "ran the job's sitecustomize", done.stderr


def test_a_python_that_never_imports_torch_loads_nothing_of_tuneup(tmp_path, base_env):
    job = "import json, sys; print(json.dumps(sorted(set(sys.modules) - {'json'})))"
    plain = set(json.loads(run(job, base_env, tmp_path).stdout))
    watched = run(job, under_watch(base_env, tmp_path / "feed"), tmp_path)
    assert set(json.loads(watched.stdout)) - plain <= {"sitecustomize"}, watched.stderr
    stand_in = tmp_path / "stand-in"  # a torch that imports fast: what arms the probe is the name
    (stand_in / "torch").mkdir(parents=True)
    (stand_in / "torch" / "__init__.py").write_text("")
    armed = run("import torch, sys; print('tuneup.watch.plain_probe' in sys.modules)",
                under_watch(base_env, tmp_path / "feed", stand_in), tmp_path)
    assert armed.stdout.strip() == "True", armed.stderr


def test_an_error_in_the_job_s_sitecustomize_is_reported_as_python_reports_it(tmp_path,
                                                                              base_env):
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("raise RuntimeError('broken on purpose')\n")
    done = run("import sys; print(type(sys.meta_path[0]).__name__)",
               under_watch(base_env, tmp_path / "feed", own), tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "_When"  # the probe stays armed
    assert done.stderr == ("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                           "RuntimeError: broken on purpose\n")
