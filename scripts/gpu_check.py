"""Issue 37's acceptance on a GPU machine: every CUDA path of tuneup, one command.

    .venv/bin/python scripts/gpu_check.py --out DIR [--quick] [--budget 60]

Each check runs in its own processes under their own time limits, and no check starts that
would usually end past the whole run's limit (8 minutes with a GPU, 170 s without): the live
doctor; ``doctor --distributed`` (NCCL across the GPUs); the examples autotuned (60 s each:
autotune's default of 300 s would not fit two of them in 8 minutes), then run with
PyTorch's defaults and with the settings alternately (speed ratio, losses within AMP's
tolerance); float16 with its GradScaler; a micro-batch under a batch that does not fit (the
gradient check's out-of-memory fallback); pinned memory with non-blocking copies;
``torch.compile`` default and reduce-overhead; ``tuneup watch`` on a plain GPU script
(verdict, SM activity); the daemon and its Prometheus endpoint for 10 s; the transformers and
Lightning integrations on CUDA for a few steps.

Without a GPU it runs its CPU parts (the doctor, gloo ranks, one 30 s autotune of the MLP
example, without the plain and tuned runs) and marks the others "not run (no GPU)";
``--quick`` runs only the checks that take seconds. Writes DIR/gpu_check.json and prints a
table; exits 1 only when a check that ran failed. DIR keeps each check's files (settings,
summaries, logs).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tuneup.files import write_atomic
from tuneup.settings import Knobs, Settings, save

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs" / "examples"
PY = sys.executable
GPU_TOTAL_S, CPU_TOTAL_S = 480.0, 170.0  # the whole run's limit
LOSS_TOLERANCE = 0.10  # relative: AMP's rounding and the workers' own random draws
OK, FAILED, NO_GPU, QUICK, NO_TIME = "ok", "failed", "not run (no GPU)", "not run (--quick)", \
    "not run (time limit)"


@dataclass
class Result:
    name: str
    status: str
    seconds: float = 0.0
    summary: str = ""
    details: dict[str, Any] = field(default_factory=dict)


class CheckFailed(Exception):
    """A check ran and found something wrong; the message is its one-line summary."""

    def __init__(self, summary: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(summary)
        self.details = details or {}


@dataclass
class Run:
    """What every check shares: where its files go, whether there is a GPU, the options."""

    out: Path
    gpu: bool
    budget: float

    def python(self, args: list[str], limit: float, env: dict[str, str] | None = None,
               name: str = "") -> subprocess.CompletedProcess[str]:
        """``python args`` with its output kept in DIR/name.log; a timeout is a failure."""
        try:
            done = subprocess.run([PY, *args], capture_output=True, text=True, timeout=limit,
                                  cwd=ROOT, env={**os.environ, **(env or {})}, check=False)
        except subprocess.TimeoutExpired as exc:
            raise CheckFailed(f"{' '.join(args[:3])} ran past its {limit:.0f} s limit") from exc
        if name:
            (self.out / f"{name}.log").write_text(done.stdout + "\n--- stderr\n" + done.stderr)
        return done

    def snippet(self, code: str, limit: float, knobs: dict[str, Any] | None = None,
                args: tuple[str, ...] = (), name: str = "") -> dict[str, Any]:
        """Run one of the snippets below with ``knobs`` as its settings file; its last stdout
        line is its JSON report."""
        env = {}
        if knobs is not None:
            path = self.out / f"{name}.tuneup.json"
            save(Settings(knobs=Knobs(**knobs)), path)
            env["TUNEUP_SETTINGS"] = str(path)
        done = self.python(["-c", PRELUDE + textwrap.dedent(code), *args], limit, env, name)
        if done.returncode != 0:
            raise CheckFailed(f"exit {done.returncode}: {last_line(done.stderr)}")
        return json.loads(done.stdout.strip().splitlines()[-1])


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def tuneup_json(run: Run, args: list[str], limit: float, name: str) -> tuple[int, dict[str, Any]]:
    done = run.python(["-m", "tuneup.cli", *args], limit, name=name)
    text = done.stdout
    try:
        return done.returncode, json.loads(text[:text.rindex("}") + 1])
    except ValueError as exc:
        raise CheckFailed(f"exit {done.returncode}, no JSON: {last_line(done.stderr)}") from exc


# -- the checks --------------------------------------------------------------------------

def doctor(run: Run) -> Result:
    code, report = tuneup_json(run, ["doctor", "--format", "json"], 120, "doctor")
    counts = report["summary"]
    gpus = [gpu.get("name") for gpu in report["environment"].get("gpus") or []]
    findings = [f"{f['code']} {f['severity']}" for f in report["findings"]
                if f["severity"] != "info"]
    summary = (f"exit {code}: {counts['errors']} errors, {counts['warnings']} warnings; "
               f"GPUs {gpus or 'none'}")
    if code not in (0, 1) or (run.gpu and not gpus):
        raise CheckFailed(summary, {"findings": findings})
    return Result("doctor", OK, summary=summary, details={"findings": findings, "gpus": gpus})


def distributed(run: Run) -> Result:
    code, report = tuneup_json(run, ["doctor", "--distributed", "--format", "json"], 180,
                               "doctor_distributed")
    found = report.get("distributed", {})
    backend = found.get("backend")
    summary = (f"exit {code}: {backend} with {found.get('ranks')} rank(s); "
               f"{found.get('failure') or found.get('note') or 'no failure'}")
    details = {key: found.get(key) for key in ("backend", "ranks", "failure", "note", "timings")}
    if code != 0 or found.get("failure") or backend != ("nccl" if run.gpu else "gloo"):
        raise CheckFailed(summary, details)
    return Result("doctor --distributed", OK, summary=summary, details=details)


RUN_LINE = re.compile(r"(\d+) iterations, loss ([-\d.naif]+), (\d+) samples/s")


def example(run: Run, script: str, steps: int, budget: float, extra: list[str],
            script_args: tuple[str, ...] = (), rounds: int = 2) -> Result:
    """Autotune ``script``, then run it plain and tuned alternately, ``rounds`` times each."""
    name = Path(script).stem
    settings = run.out / f"{name}.tuneup.json"
    code, summary = tuneup_json(run, ["autotune", str(EXAMPLES / script), "--budget",
                                      f"{budget:g}", "--format", "json", "--output",
                                      str(settings), *extra, "--", "--steps", "100000",
                                      *script_args],
                                budget + 60, f"autotune_{name}")
    if code != 0:
        raise CheckFailed(f"autotune exit {code}: {summary.get('error') or summary}")
    changed = {k: v["chosen"] for k, v in summary.get("knobs", {}).items()
               if v.get("chosen") != v.get("default")}
    details = {"device": summary["device"], "knobs": changed,
               "autotune_speedup": summary.get("speedup"), "confirmed": summary.get("confirmed"),
               "baseline_samples_per_s": summary.get("baseline_samples_per_s")}
    if not rounds:
        return Result(f"autotune {name}", OK, details=details, summary=(
            f"{summary['device']}: {changed or 'defaults kept'} in {summary['elapsed_s']:.0f} s; "
            f"defaults {summary['baseline_samples_per_s']:.0f} samples/s"))
    runs: dict[str, list[tuple[float, float]]] = {"plain": [], "tuned": []}
    for form in ("plain", "tuned") * rounds:
        env = {"TUNEUP_DISABLE": "1"} if form == "plain" else {"TUNEUP_SETTINGS": str(settings)}
        done = run.python([str(EXAMPLES / script), "--steps", str(steps), *script_args], 120,
                          env, f"{name}_{form}_{len(runs[form])}")
        match = RUN_LINE.search(done.stdout)
        if done.returncode != 0 or match is None:
            raise CheckFailed(f"{form} run exit {done.returncode}: {last_line(done.stderr)}")
        runs[form].append((float(match.group(2)), float(match.group(3))))
    speed = {form: statistics.fmean(s for _, s in pairs) for form, pairs in runs.items()}
    loss = {form: statistics.fmean(loss for loss, _ in pairs) for form, pairs in runs.items()}
    ratio = speed["tuned"] / speed["plain"]
    close = abs(loss["tuned"] - loss["plain"]) <= LOSS_TOLERANCE * max(1.0, abs(loss["plain"]))
    text = (f"{summary['device']}: {changed or 'defaults kept'}; tuned/plain {ratio:.2f}x "
            f"({speed['tuned']:.0f} / {speed['plain']:.0f} samples/s); loss "
            f"{loss['tuned']:.4f} / {loss['plain']:.4f}")
    details.update(runs=runs, ratio=ratio)
    if not close or (run.gpu and summary["device"] != "cuda"):
        raise CheckFailed(text, details)
    return Result(f"autotune {name}", OK, summary=text, details=details)


PRELUDE = textwrap.dedent("""
    import json, math, sys, time, warnings
    import torch
    import torch.nn.functional as F
    from tuneup import tuned_loader, tuned_loop
    device = torch.device("cuda")
    def report(**facts):
        print(json.dumps(facts))
    def mlp(width_in, width, classes):
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(width_in, width), torch.nn.GELU(),
                                   torch.nn.Linear(width, width), torch.nn.GELU(),
                                   torch.nn.Linear(width, classes)).to(device)
    def cross_entropy(loop):
        return lambda b: F.cross_entropy(loop.model(b[0]), b[1])
""")

FP16 = """
    model = mlp(256, 1024, 10)
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.05))
    x = torch.randn(8192, 256, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())
    losses = [float(loop.train_step(b, cross_entropy(loop)))
              for _ in range(3) for b in tuned_loader(data, batch_size=512, loop=loop)]
    scaler = loop.scaler
    report(amp=str(loop.amp_dtype), scaler=scaler is not None and scaler.is_enabled(),
           scale=scaler.get_scale() if scaler is not None else None, first=losses[0],
           last=losses[-1], finite=all(map(math.isfinite, losses)), steps=len(losses))
"""

MICRO_UNDER_OOM = """
    # a 3 GiB cap: the whole batch's saved activations (4.25 GiB) do not fit, an eighth does;
    # micro-batches apply to a tuned_loader's batches (it knows which dimension holds samples)
    # (the fraction's device must carry an index: torch refuses a bare "cuda")
    cap, index = 3 * 2**30, torch.cuda.current_device()
    torch.cuda.set_per_process_memory_fraction(
        cap / torch.cuda.get_device_properties(index).total_memory, index)
    batch, micro = 65536, 8192
    model = mlp(1024, 4096, 10)
    data = torch.utils.data.TensorDataset(torch.randn(2 * batch, 1024),
                                          torch.randint(0, 10, (2 * batch,)))
    x, y = (tensor.to(device) for tensor in data[:batch])
    try:
        F.cross_entropy(model(x), y).backward()
        whole_fits = True
    except torch.cuda.OutOfMemoryError:
        whole_fits = False
    del x, y
    model.zero_grad(set_to_none=True)
    torch.cuda.empty_cache()
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.01))
    losses = [float(loop.train_step(b, cross_entropy(loop)))
              for b in tuned_loader(data, batch_size=batch, loop=loop)]
    report(whole_fits=whole_fits, applied=loop.applied_micro_batch,
           blocked=loop.micro_batch_blocked, losses=losses,
           finite=all(map(math.isfinite, losses)),
           peak_gib=torch.cuda.max_memory_allocated(device) / 2**30, cap_gib=cap / 2**30)
"""

PINNED = """
    model = mlp(1024, 1024, 10)
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.05))
    data = torch.utils.data.TensorDataset(torch.randn(16384, 1024),
                                          torch.randint(0, 10, (16384,)))
    loader = tuned_loader(data, batch_size=1024, shuffle=True, loop=loop,
                          generator=torch.Generator().manual_seed(0))
    devices = set()
    for _ in range(2):
        for batch in loader:
            devices.add(batch[0].device.type)
            loop.train_step(batch, cross_entropy(loop))
    stats = loop.stats()
    report(pin_memory=loader.pin_memory, workers=loader.num_workers, devices=sorted(devices),
           copy_s=stats.copy_s, samples_per_s=stats.samples_per_s)
"""

COMPILED = """
    model = mlp(1024, 2048, 10)
    loop = tuned_loop(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    x, y = torch.randn(1024, 1024, device=device), torch.randint(0, 10, (1024,), device=device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        started = time.perf_counter()
        first = float(loop.train_step((x, y), cross_entropy(loop)))
        first_s = time.perf_counter() - started
        for _ in range(5):
            loop.train_step((x, y), cross_entropy(loop))
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(30):
            last = loop.train_step((x, y), cross_entropy(loop))
        torch.cuda.synchronize()
        step_ms = (time.perf_counter() - started) / 30 * 1000
    ours = [str(w.message) for w in caught if str(w.message).startswith("tuneup")]
    report(compiled=type(loop.model).__name__, first_step_s=first_s, step_ms=step_ms,
           first=first, last=float(last), warnings=ours)
"""

PLAIN_GPU_JOB = textwrap.dedent("""
    import sys, time, torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset
    model = torch.nn.Sequential(torch.nn.Linear(2048, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 10)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(16384, 2048), torch.randint(0, 10, (16384,))),
                        batch_size=1024, shuffle=True)
    end = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < end:
        for x, y in loader:
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            if time.monotonic() >= end:
                break
""")


def fp16(run: Run) -> Result:
    found = run.snippet(FP16, 120, {"amp_dtype": "float16"}, name="fp16")
    text = (f"{found['amp']}, GradScaler enabled={found['scaler']} (scale {found['scale']}), "
            f"loss {found['first']:.3f} -> {found['last']:.3f} over {found['steps']} steps")
    if not (found["scaler"] and found["finite"] and found["last"] < found["first"]):
        raise CheckFailed(text, found)
    return Result("float16 + GradScaler", OK, summary=text, details=found)


def micro_batch(run: Run) -> Result:
    found = run.snippet(MICRO_UNDER_OOM, 180, {"micro_batch_size": 8192}, name="micro_batch")
    text = (f"whole batch fits: {found['whole_fits']}; micro-batch applied: {found['applied']}"
            f"{'' if not found['blocked'] else ' (blocked: ' + found['blocked'] + ')'}; "
            f"peak {found['peak_gib']:.1f} GiB under a {found['cap_gib']:.0f} GiB cap")
    if found["whole_fits"] or found["applied"] != 8192 or not found["finite"]:
        raise CheckFailed(text, found)
    return Result("micro-batch under OOM", OK, summary=text, details=found)


def pinned(run: Run) -> Result:
    found = run.snippet(PINNED, 120, {"pin_memory": True, "num_workers": 2}, name="pinned")
    text = (f"pin_memory={found['pin_memory']}, workers {found['workers']}, batches on "
            f"{found['devices']}, copies {found['copy_s'] * 1000:.0f} ms in all, "
            f"{found['samples_per_s']:.0f} samples/s")
    if found["pin_memory"] is not True or found["devices"] != ["cuda"]:
        raise CheckFailed(text, found)
    return Result("pin_memory + non_blocking", OK, summary=text, details=found)


def compiled(run: Run, mode: str) -> Result:
    found = run.snippet(COMPILED, 200, {"compile_mode": mode}, name=f"compile_{mode}")
    text = (f"{found['compiled']}: first step {found['first_step_s']:.1f} s, then "
            f"{found['step_ms']:.2f} ms a step; loss {found['first']:.3f} -> {found['last']:.3f}")
    if found["warnings"] or not found["last"] < found["first"]:
        raise CheckFailed(text + f"; {found['warnings']}", found)
    return Result(f"compile {mode}", OK, summary=text, details=found)


def watch_plain(run: Run) -> Result:
    job = run.out / "plain_gpu_job.py"
    job.write_text(PLAIN_GPU_JOB)
    summary_path = run.out / "watch_summary.json"
    done = run.python(["-m", "tuneup.cli", "watch", "--interval", "0.5", "--summary",
                       str(summary_path), "--", PY, str(job), "15"], 120, name="watch")
    if done.returncode != 0 or not summary_path.exists():
        raise CheckFailed(f"exit {done.returncode}: {last_line(done.stderr)}")
    summary = json.loads(summary_path.read_text())
    verdict = summary.get("verdict") or {}
    evidence = verdict.get("evidence") or {}
    gpu = {k: v for k, v in evidence.items() if "gpu" in k or "sm_" in k}
    text = f"{verdict.get('kind')}; {gpu}"
    details = {"verdict": verdict, "notes": summary.get("notes")}
    if not verdict.get("kind") or not gpu:
        raise CheckFailed(text, details)
    return Result("watch (plain GPU job)", OK, summary=text, details=details)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def daemon(run: Run) -> Result:
    job_path = run.out / "plain_gpu_job.py"
    job_path.write_text(PLAIN_GPU_JOB)
    state = run.out / "daemon_state"
    url = f"http://127.0.0.1:{free_port()}/metrics"
    job = subprocess.Popen([PY, str(job_path), "25"], cwd=ROOT, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    watch = [PY, "-m", "tuneup.cli", "watch"]
    try:
        subprocess.run([*watch, "--daemon", "--interval", "0.5", "--state-dir", str(state),
                        "--serve", url.split("/")[2]], cwd=ROOT, check=True, timeout=30,
                       capture_output=True)
        time.sleep(10)
        with urllib.request.urlopen(url, timeout=10) as response:
            metrics = response.read().decode()
        status = subprocess.run([*watch, "status", "--state-dir", str(state), "--format",
                                 "json"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    finally:
        subprocess.run([*watch, "stop", "--state-dir", str(state)], cwd=ROOT, timeout=60,
                       capture_output=True)
        job.kill()
        job.wait()
    (run.out / "daemon_metrics.txt").write_text(metrics)
    samples = [line for line in metrics.splitlines() if line and not line.startswith("#")]
    gpu_util = [line for line in samples if line.startswith("DCGM_FI_DEV_GPU_UTIL")]
    jobs = [line for line in samples if line.startswith("tuneup_watch_jobs")]
    text = f"{len(samples)} samples served; {jobs or 'no job count'}; GPU util {gpu_util}"
    details = {"status": status.stdout[-2000:], "gpu_util": gpu_util, "jobs": jobs}
    if not gpu_util or not jobs:
        raise CheckFailed(text, details)
    return Result("daemon + Prometheus (10 s)", OK, summary=text, details=details)


def integration(run: Run, script: str, args: list[str]) -> Result:
    done = run.python([str(EXAMPLES / script), *args], 240, name=Path(script).stem)
    match = re.search(r"steps (\d+)\s+final loss ([-\d.naif]+)", done.stdout)
    text = match.group(0) if match else last_line(done.stderr)
    if done.returncode != 0 or match is None or int(match.group(1)) < 1:
        raise CheckFailed(f"exit {done.returncode}: {text}")
    return Result(f"{Path(script).stem} on CUDA", OK, summary=" ".join(text.split()))


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Run], Result]
    usual_s: float  # what it takes on the H200 (estimated; its processes have their own limits)
    needs_gpu: bool = True
    quick: bool = False  # runs under --quick (seconds)


def checks(gpu: bool, budget: float) -> list[Check]:
    """The checks, in the order they run. Without a GPU, one short autotune of the MLP."""
    def cpu_example(r: Run) -> Result:  # the autotune alone: each run starts torch again
        return example(r, "train_mlp.py", 0, 30, ["--skip", "compile"],
                       ("--dataset-size", "2048"), rounds=0)

    return [
        Check("doctor", doctor, 10, needs_gpu=False, quick=True),
        Check("float16 + GradScaler", fp16, 10, quick=True),
        Check("micro-batch under OOM", micro_batch, 15, quick=True),
        Check("pin_memory + non_blocking", pinned, 10, quick=True),
        Check("doctor --distributed", distributed, 30, needs_gpu=False),
        Check("autotune train_mlp", (lambda r: example(r, "train_mlp.py", 200, budget, []))
              if gpu else cpu_example, budget + 30, needs_gpu=False),
        Check("autotune train_images",
              lambda r: example(r, "train_images.py", 100, budget, []), budget + 40),
        Check("compile default", lambda r: compiled(r, "default"), 30),
        Check("compile reduce-overhead", lambda r: compiled(r, "reduce-overhead"), 40),
        Check("watch (plain GPU job)", watch_plain, 25),
        Check("daemon + Prometheus (10 s)", daemon, 20),
        Check("train_hf on CUDA", lambda r: integration(
            r, "train_hf.py", ["--samples", "128", "--epochs", "1"]), 25),
        Check("train_lightning on CUDA", lambda r: integration(
            r, "train_lightning.py", ["--samples", "2048", "--epochs", "1"]), 25),
    ]


def run_all(run: Run, quick: bool) -> list[Result]:
    """Every check in turn; one that is not run says why. A check starts only while the
    whole run's limit leaves it the time it usually takes."""
    deadline = time.monotonic() + (GPU_TOTAL_S if run.gpu else CPU_TOTAL_S)
    results = []
    for check in checks(run.gpu, run.budget):
        if check.needs_gpu and not run.gpu:
            results.append(Result(check.name, NO_GPU))
            continue
        if quick and not check.quick:
            results.append(Result(check.name, QUICK))
            continue
        if time.monotonic() + check.usual_s > deadline:
            results.append(Result(check.name, NO_TIME))
            continue
        print(f"gpu_check: {check.name} ...", file=sys.stderr, flush=True)
        started = time.monotonic()
        try:
            result = check.run(run)
        except CheckFailed as exc:
            result = Result(check.name, FAILED, summary=str(exc), details=exc.details)
        except Exception as exc:  # a check's own bug must not hide the other checks
            result = Result(check.name, FAILED, summary=f"{type(exc).__name__}: {exc}")
        result.seconds = round(time.monotonic() - started, 1)
        results.append(result)
    return results


def machine() -> dict[str, Any]:
    import torch

    gpu = torch.cuda.is_available()
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": gpu,
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            if gpu else [], "python": sys.version.split()[0], "cpus": os.cpu_count()}


def table(results: list[Result]) -> str:
    rows = ["| check | status | s | result |", "| --- | --- | --- | --- |"]
    rows += [f"| {r.name} | {r.status} | {r.seconds:.0f} | {r.summary.replace('|', '/')} |"
             for r in results]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON and logs")
    parser.add_argument("--quick", action="store_true", help="only the checks of seconds")
    parser.add_argument("--budget", type=float, default=60.0,
                        help="autotune's budget per example on a GPU (default 60, so that the "
                             "run fits 8 minutes; autotune's own default is 300)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    facts = machine()
    started = time.monotonic()
    results = run_all(Run(args.out, facts["gpu"], args.budget), args.quick)
    report = {"machine": facts, "quick": args.quick,
              "total_s": round(time.monotonic() - started, 1),
              "checks": [asdict(r) for r in results]}
    write_atomic(args.out / "gpu_check.json", json.dumps(report, indent=2) + "\n")
    print(table(results))
    print(f"\n{facts['gpus'] or 'no GPU'}, torch {facts['torch']}: {report['total_s']:.0f} s; "
          f"{args.out / 'gpu_check.json'}")
    return 1 if any(r.status == FAILED for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
