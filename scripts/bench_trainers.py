"""Autotune on the Trainer examples, then their real runs with and without the settings.

For each example (docs/examples/train_hf.py, train_lightning.py) made input-bound with
``--prep``: ``tuneup autotune`` writes a settings file within ``--budget``; then the example
runs in full, alternately with the settings (``TUNEUP_SETTINGS``) and with PyTorch's
defaults (``TUNEUP_DISABLE=1``), the order reversed every round, and each run's own
samples/s line is read. Printed: what autotune chose and took, each form's median samples/s,
and the median of the per-round ratios (tuned / defaults), with the final losses, which must
be equal where the knobs cannot change numerics (loader knobs keep the data order).

    .venv/bin/python scripts/bench_trainers.py [--rounds 5] [--budget 120]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {  # example -> its arguments for an input-bound run on 2 cores
    "train_hf.py": ["--prep", "120", "--samples", "2048", "--epochs", "1"],
    "train_lightning.py": ["--prep", "60", "--epochs", "2"],
}
RESULT = re.compile(r"steps (\d+)\s+final loss ([-\d.]+)\s+(\d+) samples/s")
TUNEUP = [sys.executable, "-m", "tuneup.cli"]


def autotune(example: Path, args: list[str], budget: float, output: Path) -> dict:
    """Run ``tuneup autotune`` and return its JSON summary."""
    started = time.monotonic()
    done = subprocess.run([*TUNEUP, "autotune", str(example), "--budget", str(budget),
                           "--format", "json", "--output", str(output), "--", *args],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"autotune {example.name} failed: {done.stderr.strip()[-800:]}")
    summary = json.loads(done.stdout)
    summary["wall_s"] = time.monotonic() - started
    return summary


def run(example: Path, args: list[str], settings: Path | None) -> tuple[int, float, float]:
    """(steps, final loss, samples/s) of one full run, as the example prints them."""
    env = {**os.environ}
    env.pop("TUNEUP_SETTINGS", None)
    if settings is None:
        env["TUNEUP_DISABLE"] = "1"
    else:
        env["TUNEUP_SETTINGS"] = str(settings)
    done = subprocess.run([sys.executable, str(example), *args], capture_output=True,
                          text=True, env=env, check=False)
    match = RESULT.search(done.stdout)
    if done.returncode != 0 or match is None:
        sys.exit(f"{example.name} failed: {done.stderr.strip()[-800:]}")
    return int(match[1]), float(match[2]), float(match[3])


def bench(name: str, args: list[str], rounds: int, budget: float, scratch: Path) -> str:
    example = ROOT / "docs" / "examples" / name
    settings = scratch / f"{example.stem}.tuneup.json"
    print(f"{name}: autotune ({budget:.0f} s budget) ...", file=sys.stderr, flush=True)
    summary = autotune(example, args, budget, settings)
    chosen = {k: v for k, v in json.loads(settings.read_text())["knobs"].items()
              if v is not None}
    tuned, plain, ratios, losses = [], [], [], set()
    for index in range(rounds):
        order = [settings, None] if index % 2 == 0 else [None, settings]
        figures = {}
        for which in order:
            steps, loss, rate = run(example, args, which)
            figures[which is not None] = rate
            losses.add((which is not None, steps, loss))
        tuned.append(figures[True])
        plain.append(figures[False])
        ratios.append(figures[True] / figures[False])
        print(f"  round {index + 1}: defaults {figures[False]:.0f}, tuned {figures[True]:.0f} "
              "samples/s", file=sys.stderr, flush=True)
    return (f"| {name} {' '.join(args)} | {json.dumps(chosen)} | {summary['wall_s']:.0f} s of "
            f"{budget:.0f} | {statistics.median(plain):.0f} | {statistics.median(tuned):.0f} | "
            f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | "
            f"{sorted(losses)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=120.0)
    parser.add_argument("--only", choices=sorted(EXAMPLES), help="one example")
    options = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-trainers-") as scratch:
        for name, args in EXAMPLES.items():
            if options.only in (None, name):
                rows.append(bench(name, args, options.rounds, options.budget, Path(scratch)))
    print("| example | chosen | autotune took | defaults samples/s | tuned samples/s | "
          "tuned / defaults, median (range) | (tuned?, steps, final loss) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
