"""``--serve HOST:PORT``: the latest samples in Prometheus' text format, for the dashboards
clusters already have.

``prometheus-client`` is an optional extra (``pip install 'tuneup[prometheus]'``), imported
only when an :class:`Exporter` is made. The watcher (or the daemon) hands the latest sample
of each job to :meth:`Exporter.publish` every tick; a scrape turns them into metrics, so
scrapes cost the watcher nothing between them. The runtime's counters are Prometheus
counters (``rate()`` gives steps/s and the data-wait share over any range); everything else
is a gauge of the latest sample.

A GPU figure that NVIDIA's DCGM exporter also exports is served under the exporter's name,
in its units and with its labels (``gpu``, ``UUID``, ``modelName``), so that the dashboards
and alerts written for it read the watcher's too; the rest are ``tuneup_watch_*``.

The labels carry every job's script, so the endpoint listens on a loopback address unless
the user says ``--serve-public``; and it holds at most :data:`MAX_CONNECTIONS` connections
at once, each for at most :data:`CONNECTION_TIMEOUT_S` without a word and
:data:`REQUEST_DEADLINE_S` in all, so idle or trickling clients cannot pile up threads and
descriptors in the watcher (or in a daemon running as root). Labels are printable text
(another user's script name may hold escapes, or bytes that are no UTF-8).
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from tuneup.errors import UsageError
from tuneup.machine.snapshot import printable
from tuneup.watch.samples import CHILD, HELPER, MAIN, WORKER, GpuSample, Sample
from tuneup.watch.verdict import Figures, Verdict

PREFIX = "tuneup_watch_"
MAX_CONNECTIONS = 16  # a scraper or two and a person with curl; more are turned away
CONNECTION_TIMEOUT_S = 10.0  # a scrape's request arrives at once; a silent client is dropped
REQUEST_DEADLINE_S = 10.0  # a whole connection, however it trickles: then it is cut off
GPU_LABELS = ["gpu", "UUID", "modelName"]  # the DCGM exporter's
MIB = 2**20  # DCGM gives framebuffer memory in MiB
Reading = Callable[[GpuSample], "float | None"]


def _field(name: str, scale: float = 1.0) -> Reading:
    """A GpuSample field in the DCGM exporter's unit (``scale`` times tuneup's)."""
    def read(gpu: GpuSample) -> float | None:
        value = getattr(gpu, name)
        return value * scale if value is not None else None
    return read


def _fb_free(gpu: GpuSample) -> float | None:
    if gpu.memory_total is None or gpu.memory_used is None:
        return None
    return (gpu.memory_total - gpu.memory_used) / MIB


GPU_GAUGES: tuple[tuple[str, Reading, str], ...] = (  # (the DCGM exporter's name, value, help)
    ("DCGM_FI_DEV_GPU_UTIL", _field("utilization"),
     "GPU utilization (in %): share of time a kernel ran"),
    ("DCGM_FI_DEV_FB_USED", _field("memory_used", 1 / MIB),
     "Framebuffer memory used (in MiB), all processes"),
    ("DCGM_FI_DEV_FB_FREE", _fb_free, "Framebuffer memory free (in MiB)"),
    ("DCGM_FI_DEV_FB_TOTAL", _field("memory_total", 1 / MIB), "Framebuffer memory (in MiB)"),
    ("DCGM_FI_DEV_POWER_USAGE", _field("power_w"), "Power draw (in W)"),
    ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", _field("power_limit_w"),
     "Enforced power limit (in W)"),
    ("DCGM_FI_DEV_SM_CLOCK", _field("sm_clock_mhz"), "SM clock frequency (in MHz)"),
    ("DCGM_FI_DEV_MAX_SM_CLOCK", _field("sm_clock_max_mhz"),
     "SM clock's maximum frequency (in MHz)"),
    ("DCGM_FI_DEV_GPU_TEMP", _field("temperature_c"), "GPU temperature (in C)"),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", _field("pcie_rx_bytes_s"),
     "Host -> GPU PCIe traffic (in bytes/s), NVML's PCIe throughput"),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", _field("pcie_tx_bytes_s"),
     "GPU -> host PCIe traffic (in bytes/s), NVML's PCIe throughput"),
    ("DCGM_FI_PROF_SM_ACTIVE", _field("sm_activity", 0.01),
     "Ratio of cycles an SM has at least 1 warp assigned (NVML GPM)"),
    ("DCGM_FI_PROF_SM_OCCUPANCY", _field("sm_occupancy", 0.01),
     "Ratio of warps resident on an SM to its maximum (NVML GPM)"),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", _field("tensor_activity", 0.01),
     "Ratio of cycles any tensor pipe is active (NVML GPM)"),
)
HOST_GAUGES = (
    ("host_cpu_percent", "cpu_percent", "all cores busy, 0-100"),
    ("host_iowait_percent", "iowait_percent", "CPU time waiting for storage"),
    ("host_swap_bytes_per_second", "swap_bytes_s", "swapped in + out"),
    ("host_memory_available_bytes", "memory_available", "available RAM"),
    ("host_memory_total_bytes", "memory_total", "RAM"),
    ("host_usable_cores", "usable_cores", "cores of the affinity mask and cgroup quota"),
)
RUNTIME_COUNTERS = (  # the runtime's own counters, summed over a job's training processes
    ("steps", "steps", "optimizer steps"),
    ("samples", "samples", "samples trained on"),
    ("loop_seconds", "elapsed_s", "time in the training loop"),
    ("data_wait_seconds", "data_wait_s", "time waiting for batches"),
    ("copy_seconds", "copy_s", "time copying batches to the device"),
)
WINDOW_GAUGES = (
    ("data_wait_ratio", "data_wait_share", "share of the loop waiting for data, last 10 s"),
    ("copy_ratio", "copy_share", "share of the loop copying to the device, last 10 s"),
    ("samples_per_second", "samples_per_s", "samples/s, last 10 s"),
)


@dataclass(frozen=True)
class JobView:
    """What a scrape shows of one job: its latest sample and its live verdict."""

    pid: int
    script: str
    sample: Sample
    figures: Figures | None
    verdict: Verdict | None


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9400`` for IPv6, ``:9400`` for every interface)."""
    host, colon, port = text.rpartition(":")
    if not colon or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--serve takes HOST:PORT, e.g. 127.0.0.1:9400 (got {text!r})")
    return host.strip("[]") or "0.0.0.0", int(port)


def is_loopback(host: str) -> bool:
    """``host`` (an address or a name) reaches this machine only."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: loopback when every address it has is
        try:
            addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
        except OSError:
            return False
        return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback
                                       for a in addresses)


def check_address(text: str, public: bool) -> tuple[str, int]:
    """``HOST:PORT`` parsed; raises :class:`UsageError` for an address other machines
    reach unless ``public`` (``--serve-public``) says the user means it."""
    host, port = parse_address(text)
    if not public and not is_loopback(host):
        raise UsageError(f"--serve {text}: other machines reach that address, and the metrics "
                         "name every job's command line; serve on 127.0.0.1, or add "
                         "--serve-public to expose them there")
    return host, port


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No line per scrape on the watcher's output."""


class _Server(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most :data:`MAX_CONNECTIONS` at once: one more is closed
    at once rather than given a thread."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 64  # connections the kernel holds until accepted (socketserver: 5)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.deadlines: dict[socket.socket, float] = {}  # connection -> when it is cut off
        self.deadlines_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def get_request(self) -> tuple[socket.socket, Any]:
        """A new connection, whose reads give up after :data:`CONNECTION_TIMEOUT_S`."""
        request, client_address = super().get_request()
        request.settimeout(CONNECTION_TIMEOUT_S)
        return request, client_address

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        with self.deadlines_lock:
            self.deadlines[request] = time.monotonic() + REQUEST_DEADLINE_S
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._done(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._done(request)

    def _done(self, request: Any) -> None:
        with self.deadlines_lock:
            self.deadlines.pop(request, None)
        self.slots.release()

    def service_actions(self) -> None:
        """Cut off every connection past its deadline (``serve_forever`` calls this at
        least every half second): the socket's timeout bounds each read, so a client
        sending a byte every few seconds would otherwise hold its slot forever. Shutting
        the socket down ends whatever read or write its handler waits in."""
        now = time.monotonic()
        with self.deadlines_lock:
            overdue = [request for request, due in self.deadlines.items() if due <= now]
        for request in overdue:
            with contextlib.suppress(OSError):  # the connection ended meanwhile
                request.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out or hung up is no error of the watcher's: no traceback."""


class _Server6(_Server):
    address_family = socket.AF_INET6


class Exporter:
    """Listens on ``address`` in a thread of its own and serves ``/metrics``."""

    def __init__(self, address: str, public: bool = False) -> None:
        host, port = check_address(address, public)
        try:
            from prometheus_client import CollectorRegistry, make_wsgi_app
        except ImportError:
            raise UsageError("--serve needs the prometheus-client package: "
                             "pip install 'tuneup[prometheus]'") from None
        self._jobs: tuple[JobView, ...] = ()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        server_class = _Server6 if ":" in host else _Server
        try:
            self.server = make_server(host, port, make_wsgi_app(registry), server_class,
                                      handler_class=_Quiet)
        except OSError as exc:
            raise UsageError(f"--serve {address}: cannot listen there "
                             f"({exc.strerror or exc})") from None
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.server.server_port}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, name="tuneup-serve",
                                       daemon=True)
        self.thread.start()

    def publish(self, jobs: Sequence[JobView]) -> None:
        """The latest view of every job watched (replaces the previous one whole)."""
        self._jobs = tuple(jobs)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def collect(self) -> Iterator[Any]:
        """The metrics of the latest views (prometheus-client calls this on each scrape)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        jobs = self._jobs
        watched = GaugeMetricFamily(PREFIX + "jobs", "training jobs watched")
        watched.add_metric([], len(jobs))
        yield watched
        if not jobs:
            return
        latest = max(jobs, key=lambda job: job.sample.t).sample
        yield from _machine(latest, GaugeMetricFamily)
        yield from _jobs(jobs, GaugeMetricFamily, CounterMetricFamily)


def _machine(sample: Sample, gauge: Any) -> Iterator[Any]:
    """Per GPU and for the host: the machine's figures, the same for every job."""
    for metric, read, help_text in GPU_GAUGES:
        family = gauge(metric, help_text, labels=GPU_LABELS)
        for gpu in sample.gpus:
            value = read(gpu)
            if value is not None:
                family.add_metric(_gpu_labels(gpu), value)
        yield family
    reasons = gauge(PREFIX + "gpu_throttle_reason", "1 while NVML gives this clock "
                    "throttle reason", labels=[*GPU_LABELS, "reason"])
    for gpu in sample.gpus:
        for reason in gpu.throttle_reasons:
            reasons.add_metric([*_gpu_labels(gpu), reason], 1)
    yield reasons
    for metric, field, help_text in HOST_GAUGES:
        value = getattr(sample.host, field)
        family = gauge(PREFIX + metric, help_text)
        if value is not None:
            family.add_metric([], value)
        yield family


def _gpu_labels(gpu: GpuSample) -> list[str]:
    return [str(gpu.index), gpu.uuid or "", gpu.name or ""]


def _jobs(jobs: Sequence[JobView], gauge: Any, counter: Any) -> Iterator[Any]:
    """Per job (``pid``, ``script``): its processes, the runtime's counters, the verdict."""
    labels = ["pid", "script"]
    cpu = gauge(PREFIX + "job_cpu_percent", "CPU by role, % of one core",
                labels=[*labels, "role"])
    processes = gauge(PREFIX + "job_processes", "processes by role", labels=[*labels, "role"])
    threads = gauge(PREFIX + "job_threads", "threads of all the job's processes", labels=labels)
    rss = gauge(PREFIX + "job_rss_bytes", "resident memory of the job's processes", labels=labels)
    gpu_memory = gauge(PREFIX + "job_gpu_memory_bytes", "GPU memory the job holds",
                       labels=[*labels, "gpu"])
    runtime = [counter(PREFIX + metric, help_text + " (the runtime's feed)", labels=labels)
               for metric, _, help_text in RUNTIME_COUNTERS]
    window = [gauge(PREFIX + metric, help_text, labels=labels)
              for metric, _, help_text in WINDOW_GAUGES]
    verdict = gauge(PREFIX + "verdict", "1 for the job's live verdict (last 10 s)",
                    labels=[*labels, "kind"])
    for job in jobs:
        key = [str(job.pid), printable(job.script, one_line=True)]  # UTF-8 text, always
        for role in (MAIN, WORKER, HELPER, CHILD):
            members = [p for p in job.sample.processes if p.role == role]
            processes.add_metric([*key, role], len(members))
            if any(p.cpu_percent is not None for p in members):
                cpu.add_metric([*key, role], sum(p.cpu_percent or 0.0 for p in members))
        threads.add_metric(key, sum(p.threads for p in job.sample.processes))
        rss.add_metric(key, sum(p.rss for p in job.sample.processes))
        for gpu in job.sample.gpus:
            if gpu.job_memory is not None:
                gpu_memory.add_metric([*key, str(gpu.index)], gpu.job_memory)
        if job.sample.runtime:
            for family, (_, field, _) in zip(runtime, RUNTIME_COUNTERS):
                family.add_metric(key, sum(getattr(r, field) for r in job.sample.runtime))
        for family, (_, field, _) in zip(window, WINDOW_GAUGES):
            value = getattr(job.figures, field) if job.figures is not None else None
            if value is not None:
                family.add_metric(key, value)
        if job.verdict is not None:
            verdict.add_metric([*key, job.verdict.kind], 1)
    yield from (cpu, processes, threads, rss, gpu_memory, *runtime, *window, verdict)
