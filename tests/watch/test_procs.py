"""The job's process tree: workers told apart from trainers only on evidence, CPU from each
process's own times, busy threads counted."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from tuneup.watch.procs import ProcessTree, role_of, settle
from tuneup.watch.samples import CHILD, HELPER, MAIN, WORKER

PYTHON = ["/usr/bin/python3", "train.py", "--lr", "3"]


@pytest.mark.parametrize(("cmdline", "parent", "role"), [
    (PYTHON, None, MAIN),  # the job itself
    (PYTHON, PYTHON, CHILD),  # forked: the parent's command line (worker or trainer)
    (["python3", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)",
      "--multiprocessing-fork"], PYTHON, CHILD),
    (["python3", "-c", "from multiprocessing.resource_tracker import main;main(6)"], PYTHON,
     HELPER),
    (["python3", "/x/torch/_inductor/compile_worker/__main__.py", "--workers=2"], PYTHON, HELPER),
    (PYTHON, ["torchrun", "--nproc-per-node", "2", "train.py"], MAIN),  # a launcher's trainer
    (["bash", "run.sh"], None, MAIN),
])
def test_roles_from_command_lines(cmdline, parent, role):
    assert role_of(cmdline, parent) == role


# Recorded trees as (pid, parent, candidate role); feeds as pid -> its training loader's
# num_workers. Hogwild (pytorch/examples mnist_hogwild): the main process 100 makes no loader,
# its forked trainers 101 and 102 each a loader without workers, 103 is the resource tracker.
HOGWILD = [(100, None, MAIN), (101, 100, CHILD), (102, 100, CHILD), (103, 100, HELPER)]
# A single trainer 200 whose loader has two forked workers.
ONE_TRAINER = [(200, None, MAIN), (201, 200, CHILD), (202, 200, CHILD)]
# Hogwild whose trainers each have one DataLoader worker (grandchildren of the main process).
NESTED = [(300, None, MAIN), (301, 300, CHILD), (302, 300, CHILD), (311, 301, CHILD),
          (312, 302, CHILD)]


@pytest.mark.parametrize(("tree", "loaders", "roles"), [
    # set-up: no feed yet, so the trainers are neither workers nor trainers
    (HOGWILD, {}, [MAIN, CHILD, CHILD, HELPER]),
    (HOGWILD, {101: 0}, [MAIN, MAIN, CHILD, HELPER]),  # one trainer made its loader
    (HOGWILD, {101: 0, 102: None}, [MAIN, MAIN, MAIN, HELPER]),
    (ONE_TRAINER, {}, [MAIN, CHILD, CHILD]),  # --pid attach, no feed: no evidence
    (ONE_TRAINER, {200: 2}, [MAIN, WORKER, WORKER]),  # the parent's loader has workers
    (ONE_TRAINER, {200: 0}, [MAIN, CHILD, CHILD]),  # its loader has none: not its workers
    (NESTED, {301: 1, 302: 1}, [MAIN, MAIN, MAIN, WORKER, WORKER]),
    (NESTED, {300: 2}, [MAIN, WORKER, WORKER, CHILD, CHILD]),  # workers of workers: unknown
])
def test_roles_settled_by_evidence_on_recorded_trees(tree, loaders, roles):
    assert [settle(role, pid, parent, loaders) for pid, parent, role in tree] == roles


# "ready" once both workers are burning: a spawned worker imports for a while first, and
# the test's first sample must already see it
JOB = textwrap.dedent("""
    import multiprocessing as mp, sys, time
    def burn(seconds, started):
        started.set()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
    if __name__ == "__main__":
        contexts = [mp.get_context(kind) for kind in ("fork", "spawn")]
        started = [context.Event() for context in contexts]
        workers = [context.Process(target=burn, args=(30, event))
                   for context, event in zip(contexts, started)]
        for worker in workers:
            worker.start()
        for event in started:
            event.wait(60)
        print("ready", flush=True)
        time.sleep(30)
""")


def test_a_real_tree_with_forked_and_spawned_workers(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    job = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert job.stdout.readline().strip() == "ready"
        tree = ProcessTree(job.pid)
        first = tree.sample()
        assert all(p.cpu_percent is None and p.busy_threads is None for p in first)
        time.sleep(0.8)
        roles = {p.pid: p for p in tree.sample()}
        main = roles.pop(job.pid)
        assert main.role == MAIN and main.cpu_percent < 20 and main.busy_threads == 0
        workers = [p for p in roles.values() if p.role == CHILD]  # no feed: no evidence
        assert len(workers) == 2, roles
        # busy workers, told apart from the idle main process (a loaded machine shares the cores)
        assert all(p.cpu_percent > 10 and p.busy_threads == 1 for p in workers), workers
        assert [p.role for p in roles.values() if p not in workers] == [HELPER]  # the tracker
        assert {p.role for p in tree.sample(trainers={workers[0].pid})
                if p.pid == workers[0].pid} == {MAIN}
        fed = {p.pid: p.role for p in tree.sample(loaders={job.pid: 2})}  # a loader's workers
        assert [fed[p.pid] for p in workers] == [WORKER, WORKER]
    finally:
        job.kill()
        job.wait()
    assert tree.sample() == ()  # the root is gone: nothing to sample, no error
