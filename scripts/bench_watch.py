"""What watching costs: the watcher's own CPU, and the watched job's extra time per step.

1. **The watcher's CPU**, in % of one core at the default interval (1 s), while a real job
   trains (docs/examples/train_mlp.py): for ``tuneup watch -- python train_mlp.py`` (plain
   lines to a pipe, no NVML on a machine without it) and for the daemon (``tuneup watch
   --daemon``, which also scans every process on the machine each tick). The watcher's own
   CPU time (not its children's) is read with psutil from its first sample to the job's
   last moments. Target: < 2 % of a core.
2. **The job's extra cost per step while watched**, in one process: the train_mlp workload
   under ``tuned_loop`` / ``tuned_loader`` runs in rounds, unwatched (no observer) and
   watched (the feed observer installed, and ``tuneup watch --pid`` sampling this process
   and reading its feed at the default interval; the same watcher, stopped with SIGSTOP
   during unwatched rounds), interleaved A B B A so drift cancels; the ratio is the median
   over adjacent pairs, with a 95 % interval of that median. Target: < 1 %.

    .venv/bin/python scripts/bench_watch.py [--steps 300] [--pairs 60] [--round-steps 20]

The figures printed are what this run measured on this machine (which may be shared: the
spread over pairs is printed with the median).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "train_mlp.py"
TUNEUP = [sys.executable, "-m", "tuneup.cli", "watch"]
FEED_ENV = "TUNEUP_WATCH_FEED"
OBSERVERS_ENV = "TUNEUP_OBSERVERS"
FEED_OBSERVER = "tuneup.watch.feed:install"


def own_cpu(process: psutil.Process) -> float:
    """CPU seconds of ``process`` itself (its children's not counted)."""
    times = process.cpu_times()
    return times.user + times.system


def cpu_share_while(watcher: psutil.Process, alive: Callable[[], bool]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of ``watcher`` from now until ``alive()`` turns false,
    read every 0.2 s: the last reading while the job was alive closes the span."""
    start_cpu, start = own_cpu(watcher), time.monotonic()
    cpu, wall = 0.0, 0.0
    while alive():
        cpu, wall = own_cpu(watcher) - start_cpu, time.monotonic() - start
        time.sleep(0.2)
    return cpu, wall


def job_environment() -> dict[str, str]:
    """PyTorch's defaults whatever settings file lies beside the example, and none of this
    process's own feed (part 2's)."""
    env = {k: v for k, v in os.environ.items() if k not in (OBSERVERS_ENV, FEED_ENV)}
    return {**env, "TUNEUP_DISABLE": "1"}


def foreground_watcher(steps: int) -> tuple[float, float]:
    """``tuneup watch -- python train_mlp.py``: the watcher's CPU over the training."""
    watcher = subprocess.Popen([*TUNEUP, "--", sys.executable, str(EXAMPLE), "--steps",
                                str(steps)], env=job_environment(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        while not line.startswith("["):  # the first sample: imports and setup are done
            line = watcher.stderr.readline()
            if not line:
                raise SystemExit("the watcher ended before its first sample")
        process = psutil.Process(watcher.pid)
        job = process.children()[0]
        measured = cpu_share_while(process, job.is_running)
        watcher.stderr.read()
    finally:
        watcher.wait()
    return measured


def daemon_watcher(steps: int) -> tuple[float, float, int]:
    """The daemon, watching the same job (found because it imports tuneup): its CPU over
    the training, and how many processes the machine ran (the daemon scans them all)."""
    with tempfile.TemporaryDirectory(prefix="bench-watch-") as state:
        subprocess.run([*TUNEUP, "--daemon", "--state-dir", state], check=True,
                       stdout=subprocess.DEVNULL)
        daemon = psutil.Process(int(Path(state, "daemon.pid").read_text()))
        try:
            job = subprocess.Popen([sys.executable, str(EXAMPLE), "--steps", str(steps)],
                                   env=job_environment(), stdout=subprocess.DEVNULL)
            time.sleep(3.0)  # found, and the daemon's first samples of it taken
            cpu, wall = cpu_share_while(daemon, lambda: job.poll() is None)
            processes = len(psutil.pids())
        finally:
            subprocess.run([*TUNEUP, "stop", "--state-dir", state], check=True,
                           stdout=subprocess.DEVNULL)
    return cpu, wall, processes


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("train_mlp", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Workload:
    """The train_mlp example's work under the runtime, made once; :meth:`run` times
    ``steps`` steps from a fresh pass over the loader (observers are looked up there)."""

    def __init__(self) -> None:
        from tuneup import tuned_loader, tuned_loop

        example = load_example()
        self.loss = example.compute_loss
        model = example.make_model()
        self.loop = tuned_loop(model, example.make_optimizer(model))
        self.loader = tuned_loader(example.make_dataset(), batch_size=example.DEFAULT_BATCH,
                                   shuffle=True, drop_last=True, loop=self.loop)

    def _batches(self) -> Iterator[Any]:
        while True:
            yield from self.loader

    def run(self, steps: int) -> float:
        """Seconds per step over ``steps`` steps."""
        batches = self._batches()
        started = time.perf_counter()
        for _, batch in zip(range(steps), batches):
            self.loop.train_step(batch, lambda b: self.loss(self.loop.model, b))
        elapsed = time.perf_counter() - started
        batches.close()
        return elapsed / steps


def attach_watcher() -> tuple[subprocess.Popen, psutil.Process]:
    """``tuneup watch --pid <this process>`` at the default interval, once it samples. It
    runs under a shell: the watcher refuses to attach to its own parent."""
    shell = subprocess.Popen(["sh", "-c", '"$@" & wait', "sh", *TUNEUP, "--pid",
                              str(os.getpid())], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    if not shell.stdout.readline().startswith("["):
        raise SystemExit("the attached watcher did not start sampling")
    return shell, psutil.Process(shell.pid).children()[0]


def per_step_cost(pairs: int, round_steps: int) -> tuple[list[float], list[float]]:
    """Seconds per step, unwatched and watched, for ``pairs`` adjacent pairs (A B, B A...).

    One watcher stays attached throughout, stopped (SIGSTOP: no CPU at all) while a round
    runs unwatched and with the feed observer out; continued (SIGCONT) and with the observer
    in while a round runs watched. Rounds are short and back to back, so a pair's two rounds
    see the same machine."""
    from tuneup.runtime import hooks

    workload = Workload()
    feed = hooks.current()  # the feed observer TUNEUP_OBSERVERS installed
    if feed is hooks.NOBODY:
        raise SystemExit("the feed observer is not installed")
    hooks.uninstall(feed)
    shell, watcher = attach_watcher()
    watcher.suspend()
    workload.run(round_steps)  # warm-up: allocator, caches

    def unwatched() -> float:
        return workload.run(round_steps)

    def watched() -> float:
        watcher.resume()
        hooks.install(feed)
        try:
            return workload.run(round_steps)
        finally:
            hooks.uninstall(feed)
            watcher.suspend()

    plain, observed = [], []
    try:
        for index in range(pairs):
            order = (unwatched, watched) if index % 2 == 0 else (watched, unwatched)
            results = {run: run() for run in order}
            plain.append(results[unwatched])
            observed.append(results[watched])
    finally:
        watcher.resume()
        watcher.send_signal(signal.SIGTERM)
        shell.communicate()
    return plain, observed


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval for the median: the order statistics whose ranks a
    Binomial(n, 1/2) count stays between with ``confidence`` (wide when n is small)."""
    ordered, n = sorted(values), len(values)
    low, below = 0, 0.0
    while low < n // 2:
        below += math.comb(n, low) / 2 ** n
        if below > (1 - confidence) / 2:
            break
        low += 1
    return ordered[max(low - 1, 0)], ordered[min(n - low, n - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300,
                        help="train_mlp.py steps while the watcher's CPU is measured")
    parser.add_argument("--pairs", type=int, default=60, help="unwatched/watched round pairs")
    parser.add_argument("--round-steps", type=int, default=20, help="steps in one round")
    args = parser.parse_args()
    if FEED_OBSERVER not in os.environ.get(OBSERVERS_ENV, ""):
        # Run again with the feed in the environment: the runtime installs its observer, and
        # an attached watcher finds the feed directory there, as for a job it started.
        feed_directory = tempfile.mkdtemp(prefix="bench-watch-feed-")
        env = {**job_environment(), OBSERVERS_ENV: FEED_OBSERVER, FEED_ENV: feed_directory}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)

    cores = len(os.sched_getaffinity(0))
    print(f"tuneup watch benchmark: {cores} usable cores, torch threads default, "
          f"train_mlp.py batch 256")
    cpu, wall = foreground_watcher(args.steps)
    print(f"watcher CPU at the default interval (1 s), train_mlp.py --steps {args.steps}:")
    print(f"  tuneup watch -- ...     {cpu / wall:7.2%} of one core "
          f"({cpu:.2f} s CPU over {wall:.1f} s)")
    cpu, wall, processes = daemon_watcher(args.steps)
    print(f"  tuneup watch --daemon   {cpu / wall:7.2%} of one core "
          f"({cpu:.2f} s CPU over {wall:.1f} s; {processes} processes on the machine)")

    plain, observed = per_step_cost(args.pairs, args.round_steps)
    ratios = [w / u for u, w in zip(plain, observed)]
    median = statistics.median(ratios)
    print(f"job's time per step, watched / unwatched ({args.pairs} interleaved pairs of "
          f"{args.round_steps} steps, one process):")
    print(f"  unwatched {statistics.median(plain) * 1e3:.1f} ms/step, watched "
          f"{statistics.median(observed) * 1e3:.1f} ms/step (medians)")
    low, high = median_interval(ratios)
    print(f"  ratio median {median:.4f} ({median - 1:+.2%} per step), 95 % interval of the "
          f"median {low:.4f} .. {high:.4f}; pairs {min(ratios):.4f} .. {max(ratios):.4f}")


if __name__ == "__main__":
    main()
