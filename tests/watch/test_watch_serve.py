"""``--serve HOST:PORT``: the latest samples scraped over HTTP in Prometheus' text format,
from a watched job and from the daemon (GPU figures through the fake NVML, under the DCGM
exporter's names and units), and the one-line errors: no prometheus-client, a bad address,
a port already taken."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request

import pytest
from click.testing import CliRunner
from fake_nvml import FakeNvml, tick_clock
from watch_helpers import load

from tuneup.cli import main
from tuneup.errors import EXIT_USAGE
from tuneup.machine.probe import probe_nvidia
from tuneup.watch.daemon import Daemon
from tuneup.watch.discover import Finder
from tuneup.watch.state import StateDir

WATCH = [sys.executable, "-m", "tuneup.cli", "watch"]
needs_client = pytest.mark.skipif(
    importlib.util.find_spec("prometheus_client") is None,
    reason="prometheus-client is not installed (pip install 'tuneup[prometheus]')")

TRAINS = textwrap.dedent("""
    import sys, time, torch
    from pathlib import Path
    from tuneup import tuned_loader, tuned_loop

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 64
        def __getitem__(self, index):
            time.sleep(0.002)
            return torch.randn(8), index % 2

    model = torch.nn.Linear(8, 2)
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
    while not Path(sys.argv[1]).exists():
        for batch in tuned_loader(Slow(), batch_size=8, loop=loop):
            loop.train_step(batch, lambda b: torch.nn.functional.cross_entropy(model(b[0]), b[1]))
""")


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the endpoint: (name, sorted labels) -> value, as Prometheus parses it."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(metrics: dict, metric: str, **labels: str) -> float | None:
    """The one sample named ``metric`` whose labels include ``labels``."""
    found = [v for (n, have), v in metrics.items()
             if n == metric and set(labels.items()) <= set(have)]
    assert len(found) <= 1, (metric, labels, found)
    return found[0] if found else None


@needs_client
@pytest.mark.slow
def test_a_watched_job_s_samples_are_scraped(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAINS)
    stop = tmp_path / "stop"
    watcher = subprocess.Popen([*WATCH, "--interval", "0.2", "--serve", "127.0.0.1:0", "--",
                                sys.executable, str(script), str(stop)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line = watcher.stderr.readline()
        assert line.startswith("tuneup watch: metrics at http://127.0.0.1:"), line
        url = line.split(" at ")[1].strip()
        deadline, metrics = time.monotonic() + 60, {}
        while time.monotonic() < deadline:
            metrics = scrape(url)
            if (value(metrics, "tuneup_watch_steps_total") or 0) > 0 and value(
                    metrics, "tuneup_watch_verdict", kind="input-bound"):
                break
            time.sleep(0.2)
    finally:
        stop.touch()
        watcher.stderr.read()
        watcher.wait(timeout=60)
    assert watcher.returncode == 0
    assert value(metrics, "tuneup_watch_jobs") == 1
    labels, steps = next((dict(have), v) for (n, have), v in metrics.items()
                         if n == "tuneup_watch_steps_total")
    assert steps > 0 and labels["script"] == str(script) and labels["pid"].isdigit()
    pid = labels["pid"]
    # published as a batch is handed out: the step on it may not be counted yet
    assert 8 * steps <= value(metrics, "tuneup_watch_samples_total", pid=pid) <= 8 * (steps + 1)
    assert 0 < value(metrics, "tuneup_watch_data_wait_seconds_total", pid=pid) <= value(
        metrics, "tuneup_watch_loop_seconds_total", pid=pid)
    assert value(metrics, "tuneup_watch_data_wait_ratio", pid=pid) >= 0.1
    assert value(metrics, "tuneup_watch_verdict", pid=pid, kind="input-bound") == 1
    assert value(metrics, "tuneup_watch_job_processes", pid=pid, role="main") == 1
    assert value(metrics, "tuneup_watch_job_cpu_percent", pid=pid, role="main") > 0
    assert value(metrics, "tuneup_watch_job_rss_bytes", pid=pid) > 1 << 20
    assert value(metrics, "tuneup_watch_host_usable_cores") >= 1
    assert value(metrics, "tuneup_watch_host_memory_total_bytes") > 0
    # one utilisation per GPU NVML sees on this machine: none without a GPU
    utilization = [v for (n, _), v in metrics.items() if n == "DCGM_FI_DEV_GPU_UTIL"]
    assert len(utilization) == len(probe_nvidia()[1] or []), utilization
    assert all(0 <= v <= 100 for v in utilization)


def serve_daemon(tmp_path, recording: dict, pid: int) -> dict:
    """A daemon that watches ``pid`` with ``recording`` for its GPUs: a scrape after 3 ticks."""
    nvml = FakeNvml(recording)
    daemon = Daemon(StateDir(tmp_path / "state"), 0.1, serve="127.0.0.1:0",
                    finder=Finder(list_pids=lambda: [pid]), nvml=nvml)
    try:
        assert daemon.serve_url.startswith("http://127.0.0.1:")
        assert value(scrape(daemon.serve_url), "tuneup_watch_jobs") == 0
        for _ in range(3):
            nvml.advance()
            daemon.tick()
            time.sleep(0.05)
        metrics = scrape(daemon.serve_url)
    finally:
        daemon.close()
    assert (daemon.state.read_status() or {})["serve"] == daemon.serve_url
    with pytest.raises(OSError):  # closed with the daemon
        scrape(daemon.serve_url)
    return metrics


@needs_client
def test_the_daemon_serves_every_job_and_the_gpus(tmp_path):
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        recording = {"devices": [{"name": "NVIDIA A100-PCIE-40GB", "max_sm_clock": 1410,
                                  "pcie_gen": 4, "pcie_width": 16, "power_limit_mw": 250000,
                                  "memory_total": 40 << 30, "uuid": "GPU-a100"}],
                     "ticks": [[{"util": 55, "memory_used": 30 << 30, "power_mw": 240000,
                                 "sm_clock": 1100, "reasons": 4, "rx_kbs": 1000, "tx_kbs": 100,
                                 "temp": 83, "processes": [[job.pid, 20 << 30]]}]] * 3}
        metrics = serve_daemon(tmp_path, recording, job.pid)
    finally:
        job.kill()
        job.wait()
    gpu = {"gpu": "0", "UUID": "GPU-a100", "modelName": "NVIDIA A100-PCIE-40GB"}
    assert value(metrics, "tuneup_watch_jobs") == 1
    assert value(metrics, "DCGM_FI_DEV_GPU_UTIL", **gpu) == 55
    assert value(metrics, "DCGM_FI_DEV_FB_USED", **gpu) == 30 * 1024  # MiB, as DCGM's
    assert value(metrics, "DCGM_FI_DEV_FB_FREE", **gpu) == 10 * 1024
    assert value(metrics, "DCGM_FI_DEV_FB_TOTAL", **gpu) == 40 * 1024
    assert value(metrics, "DCGM_FI_DEV_POWER_USAGE", **gpu) == 240
    assert value(metrics, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", **gpu) == 250
    assert value(metrics, "DCGM_FI_DEV_SM_CLOCK", **gpu) == 1100
    assert value(metrics, "DCGM_FI_DEV_MAX_SM_CLOCK", **gpu) == 1410
    assert value(metrics, "DCGM_FI_DEV_GPU_TEMP", **gpu) == 83
    assert value(metrics, "DCGM_FI_PROF_PCIE_RX_BYTES", **gpu) == 1000 * 1024
    assert value(metrics, "DCGM_FI_PROF_PCIE_TX_BYTES", **gpu) == 100 * 1024
    assert value(metrics, "DCGM_FI_PROF_SM_ACTIVE") is None  # no GPM before Hopper
    assert value(metrics, "tuneup_watch_gpu_throttle_reason", gpu="0", reason="SwPowerCap") == 1
    tuneup_gpu = {name for name, _ in metrics if name.startswith("tuneup_watch_gpu_")}
    assert tuneup_gpu == {"tuneup_watch_gpu_throttle_reason"}  # DCGM's names, not two of each
    assert value(metrics, "tuneup_watch_job_gpu_memory_bytes", pid=str(job.pid),
                 gpu="0") == 20 << 30
    assert value(metrics, "tuneup_watch_verdict", pid=str(job.pid), kind="throttled") == 1
    assert value(metrics, "tuneup_watch_steps_total") is None  # no feed: no runtime counters


@needs_client
def test_gpm_figures_are_served_as_dcgm_s_profiling_ratios(tmp_path, monkeypatch):
    tick_clock(monkeypatch)
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        recording = load("host-bound-h100")
        for tick in recording["ticks"]:
            tick[0]["processes"] = [[job.pid, 18 << 30]]
        metrics = serve_daemon(tmp_path, recording, job.pid)
    finally:
        job.kill()
        job.wait()
    device, last = recording["devices"][0], recording["ticks"][2][0]
    gpu = {"gpu": "0", "UUID": device["uuid"], "modelName": device["name"]}
    assert value(metrics, "DCGM_FI_DEV_GPU_UTIL", **gpu) == last["util"]
    assert value(metrics, "DCGM_FI_PROF_SM_ACTIVE", **gpu) == pytest.approx(
        last["sm_active"] / 100)
    assert value(metrics, "DCGM_FI_PROF_SM_OCCUPANCY", **gpu) == pytest.approx(
        last["sm_occupancy"] / 100)
    assert value(metrics, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", **gpu) == pytest.approx(
        last["tensor_active"] / 100)


@needs_client
def test_children_of_unknown_role_are_served_as_their_own_role():
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    from tuneup.watch.samples import CHILD, MAIN, HostSample, ProcessSample
    from tuneup.watch.samples import Sample as WatchSample
    from tuneup.watch.serve import JobView, _jobs

    processes = (ProcessSample(10, MAIN, 1.0, 0, 3, 1 << 20, None),
                 *(ProcessSample(pid, CHILD, 90.0, 1, 1, 1 << 20, None) for pid in (11, 12)))
    sample = WatchSample(t=1.0, gpus=(), processes=processes, runtime=(),
                         host=HostSample(None, None, None, None, None, None))
    families = list(_jobs([JobView(10, "hogwild.py", sample, None, None)], GaugeMetricFamily,
                          CounterMetricFamily))
    served = {(f.name, s.labels["role"]): s.value for f in families for s in f.samples
              if "role" in s.labels}
    assert served[("tuneup_watch_job_processes", "child")] == 2
    assert served[("tuneup_watch_job_processes", "worker")] == 0
    assert served[("tuneup_watch_job_cpu_percent", "child")] == 180.0


def test_without_prometheus_client_serve_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import raises ImportError
    result = CliRunner().invoke(main, ["watch", "--serve", "127.0.0.1:0", "--", sys.executable,
                                       "-c", "raise SystemExit(9)"])
    assert result.exit_code == EXIT_USAGE
    assert result.output == ("tuneup watch: --serve needs the prometheus-client package: "
                             "pip install 'tuneup[prometheus]'\n")


@pytest.mark.parametrize("address", ["9400", "localhost:http", "127.0.0.1:70000"])
def test_a_bad_address_is_a_usage_error(address):
    result = CliRunner().invoke(main, ["watch", "--serve", address, "--", "true"])
    assert result.exit_code == EXIT_USAGE and "--serve takes HOST:PORT" in result.output


@needs_client
@pytest.mark.slow
def test_a_daemon_whose_port_is_taken_says_so_and_leaves_nothing_running(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        state = StateDir(tmp_path / "state")
        result = CliRunner().invoke(main, ["watch", "--daemon", "--state-dir", str(state.path),
                                           "--serve", f"127.0.0.1:{port}"])
    assert result.exit_code == EXIT_USAGE, result.output
    assert result.output.startswith(f"tuneup watch: --serve 127.0.0.1:{port}: cannot listen")
    assert state.read_pid() is None and state.running_pid() is None
