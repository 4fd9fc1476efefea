"""`tuneup doctor --distributed`: 2 gloo ranks timed at small sizes, a bad socket interface
and a rendezvous that does not complete become findings (never a hang), the formulas."""

from __future__ import annotations

import io
import json
import tempfile
import time

import pytest
from click.testing import CliRunner

from tuneup.cli import main
from tuneup.doctor import distributed, messages
from tuneup.doctor.distributed import Measurement, Timing, algbw, busbw, message_bytes
from tuneup.doctor.rules.context import Diagnosis
from tuneup.machine import probe
from tuneup.machine.snapshot import CPU, Snapshot, TorchBuild

SMALL = (1024, 8192)


def invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(main, ["doctor", *args], env=env)


@pytest.fixture
def quiet_sockets(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine as the probe reads it, but with no GPU for torch: the gloo path, on any
    machine."""
    live = probe.snapshot

    def without_gpus() -> Snapshot:
        snapshot = live()
        snapshot.torch.cuda_available, snapshot.torch.device_count = False, 0
        return snapshot

    monkeypatch.setattr(probe, "snapshot", without_gpus)


def test_two_gloo_ranks_time_both_collectives_into_the_json_report(monkeypatch, quiet_sockets,
                                                                    no_gpu) -> None:
    monkeypatch.setattr(distributed, "SIZES", SMALL)
    result = invoke("--distributed", "--nproc", "2", "--format", "json")
    document = json.loads(result.output)
    measured = document["distributed"]
    assert measured["failure"] is None and (measured["backend"], measured["ranks"]) == ("gloo", 2)
    assert "2(n-1)/n" in measured["formula"] and "(n-1)/n" in measured["formula"]
    timings = [Timing(**t) for t in measured["timings"]]
    assert [(t.operation, t.size_bytes) for t in timings] == [
        (op, size) for op in ("all_reduce", "all_gather") for size in SMALL]
    for t in timings:
        assert t.seconds > 0
        assert t.algbw_gbps == pytest.approx(t.size_bytes / t.seconds / 1e9)
        assert t.busbw_gbps == pytest.approx(t.algbw_gbps * (1 if t.operation == "all_reduce"
                                                             else 0.5))
    assert any("2 local gloo ranks joined" in text for text in document["passed"])
    assert measured["note"] == ("no GPU visible to torch: gloo ranks on the CPU (NCCL needs an "
                                "NVIDIA GPU)")
    assert not [f for f in document["findings"] if f["code"] in ("TU420", "TU421", "TU422")]


def test_a_bad_gloo_socket_ifname_is_a_finding_not_a_hang(quiet_sockets, monkeypatch,
                                                          tmp_path, no_gpu) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the ranks' files go
    started = time.monotonic()
    result = invoke("--distributed", "--timeout", "30", env={"GLOO_SOCKET_IFNAME": "nosuch0"})
    assert time.monotonic() - started < 30
    assert result.exit_code == 1, result.output
    assert "TU422 GLOO_SOCKET_IFNAME=nosuch0 names nosuch0, which this machine does not have" \
        in result.output
    assert "TU420 2 local gloo ranks could not rendezvous" in result.output
    assert "nosuch0" in result.output.split("TU420")[1].splitlines()[0]  # gloo's own reason
    assert list(tmp_path.iterdir()) == []  # the failed ranks' traceback files are removed


def test_ranks_that_do_not_join_in_time_are_stopped_with_the_reason(quiet_sockets) -> None:
    started = time.monotonic()
    measured = distributed.measure(2, "gloo", timeout=0.2, sizes=SMALL)
    assert time.monotonic() - started < 10  # the ranks were killed, not waited for
    assert measured.phase == "rendezvous" and measured.timings == []
    assert measured.failure == ("ranks 0, 1 of 2 local gloo ranks did not join the process "
                                "group within 0.2 s")


def test_bandwidth_formulas_on_fixed_numbers() -> None:
    assert algbw(64 * 2**20, 0.01) == pytest.approx(6.7108864)
    assert busbw("all_reduce", 10.0, 2) == pytest.approx(10.0)  # 2(n-1)/n = 1
    assert busbw("all_reduce", 10.0, 8) == pytest.approx(17.5)  # 2 * 7/8
    assert busbw("all_gather", 10.0, 4) == pytest.approx(7.5)  # 3/4
    assert message_bytes("all_reduce", 1024, 3) == 1024
    assert message_bytes("all_gather", 1024, 3) == 1020  # whole float32 parts, one per rank


def test_the_table_states_the_formula() -> None:
    timing = Timing("all_reduce", 2**20, 0.001, algbw(2**20, 0.001), algbw(2**20, 0.001))
    gathered = Timing("all_gather", 2**20, 0.002, algbw(2**20, 0.002),
                      busbw("all_gather", algbw(2**20, 0.002), 2))
    out = io.StringIO()
    distributed.write_table(Measurement("gloo", 2, 60.0, [timing, gathered], 1.0), out)
    text = out.getvalue()
    assert "1 MiB" in text and "1,000" in text and "1.049" in text and "0.262" in text
    assert "busbw = algbw * 2(n-1)/n for all_reduce, algbw * (n-1)/n for all_gather" in text


def test_socket_interface_variables_against_the_interfaces() -> None:
    here = {"lo", "eth0", "ib0"}

    def codes(backend: str = "nccl", **environ: str) -> list[tuple[str, str]]:
        return [(f.code, f.severity) for f in
                distributed.interface_findings(environ, here, backend)[0]]

    assert codes(GLOO_SOCKET_IFNAME="eth0,lo", NCCL_SOCKET_IFNAME="eth") == []
    assert codes(GLOO_SOCKET_IFNAME="eth0,eth1") == [("TU422", "error")]  # gloo: exact names
    assert codes(NCCL_SOCKET_IFNAME="=eth") == [("TU422", "error")]  # "=": an exact name
    assert codes(NCCL_SOCKET_IFNAME="enp,ib") == []  # a prefix that matches is enough
    assert codes(NCCL_SOCKET_IFNAME="^docker,lo") == []  # exclusions name nothing to find
    assert codes("gloo", NCCL_SOCKET_IFNAME="enp") == [("TU422", "warning")]  # NCCL unused


def test_shm_below_what_nccl_advises() -> None:
    small = distributed.shm_finding(64 * 2**20, in_container=True)
    assert small is not None and small.code == "TU423" and small.severity == "warning"
    assert "in this container is 64 MiB" in small.message and "--ipc=host" in small.fix
    assert distributed.shm_finding(2**31, in_container=True) is None
    assert distributed.shm_finding(None, in_container=None) is None


@pytest.mark.parametrize(("args", "says"), [
    (["--nproc", "2"], "--nproc is an option of --distributed"),
    (["--timeout", "5"], "--timeout is an option of --distributed"),
    (["--distributed", "--from", "report.txt"], "cannot be used with --from"),
    (["--distributed", "--nproc", "1"], "--nproc"),
])
def test_distributed_options_misused_are_one_line_usage_errors(args, says) -> None:
    result = invoke(*args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], result.output


class _Store:
    """The parent's store as a rank left it: the keys it set."""

    def __init__(self, keys: set[str]) -> None:
        self.keys = keys

    def check(self, keys: list[str]) -> bool:
        return all(key in self.keys for key in keys)

    def get(self, key: str) -> bytes:
        return b"all_reduce of 1 KiB"


class _Exited:
    """A process context whose rank 1 ended by a signal."""

    def join(self, timeout: float) -> bool:
        raise distributed.mp.ProcessExitedException(
            "process 1 terminated with signal SIGABRT", error_index=1, error_pid=2,
            exit_code=-6, signal_name="SIGABRT")


@pytest.mark.parametrize(("keys", "failure"), [
    # every rank had reported its timings: a crash while tearing down spoils nothing
    ({"joined/0", "joined/1", "result/0", "result/1"}, None),
    ({"joined/0", "joined/1", "result/0", "at/1"}, "rank 1"),
])
def test_a_rank_that_dies_after_reporting_does_not_fail_the_measurement(keys, failure) -> None:
    result = Measurement("gloo", 2, 10.0)
    distributed._watch(_Exited(), _Store(keys), result, time.monotonic())
    assert result.failure is None if failure is None else failure in result.failure


def test_more_cpu_ranks_than_the_host_holds_are_refused_before_any_starts(no_gpu) -> None:
    """64 gloo ranks on 2 cores took 8.6 GB, then timed out and blamed the network."""
    import psutil

    before = len(psutil.Process().children(recursive=True))
    started = time.monotonic()
    result = invoke("--distributed", "--nproc", "100000")
    assert result.exit_code == 2 and "hold at most" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert time.monotonic() - started < 30
    assert len(psutil.Process().children(recursive=True)) == before
    with pytest.raises(distributed.UsageError, match="2 usable cores hold at most 8"):
        distributed.plan(9, cores=2)
    assert distributed.plan(8, cores=2) == ("gloo", 8)


@pytest.mark.parametrize(("nproc", "gpus", "nccl", "planned", "says"), [
    (None, 0, False, ("gloo", 2), "no GPU visible to torch: gloo ranks on the CPU"),
    (None, 0, True, ("gloo", 2), "no GPU visible to torch"),
    (None, 2, False, ("gloo", 2), "2 GPU(s), but this torch build has no NCCL"),
    (None, 1, True, ("nccl", 1), "bus bandwidth needs two GPUs"),
    (None, 8, True, ("nccl", 8), None),
    (2, 8, True, ("nccl", 2), None),
])
def test_nccl_wherever_torch_sees_a_gpu_gloo_only_without(nproc, gpus, nccl, planned, says):
    assert distributed.plan(nproc, 16, gpus, nccl) == planned
    note = distributed.plan_note(*planned, gpus, "2.28.9" if nccl else None)
    assert note is None if says is None else says in note


def test_more_ranks_than_gpus_is_a_usage_error() -> None:
    with pytest.raises(distributed.UsageError, match="--nproc 2 needs 2 GPUs for NCCL"):
        distributed.plan(2, 16, gpus=1, nccl=True)


def _gpus(count: int) -> Snapshot:
    return Snapshot(torch=TorchBuild(cuda_available=True, device_count=count, nccl="2.28.9"),
                    cpu=CPU(usable_cores=16, shm_total_bytes=2**31))


def _measured(ranks: int) -> Measurement:
    timings = [Timing(op, 2**20, 1e-4, 10.5, busbw(op, 10.5, ranks))
               for op in ("all_reduce", "all_gather")]
    return Measurement("nccl", ranks, 60.0, timings, joined_s=2.0)


@pytest.mark.parametrize("gpus", [1, 2])
def test_the_report_on_one_gpu_and_on_two(monkeypatch, quiet_sockets, gpus) -> None:
    started: list[tuple[int, str]] = []

    def measure(ranks: int, backend: str, timeout: float, sizes) -> Measurement:
        started.append((ranks, backend))
        return _measured(ranks)

    monkeypatch.setattr(distributed, "measure", measure)
    diagnosis = Diagnosis()
    result = distributed.check(_gpus(gpus), diagnosis, None, 60.0)
    assert started == [(gpus, "nccl")]  # one rank per GPU
    (passed,) = [text for area, text in diagnosis.passed if "joined" in text]
    out = io.StringIO()
    distributed.write_table(result, out)
    if gpus == 1:
        assert passed == ("1 local nccl rank joined in 2.0 s and ran all_reduce and all_gather: "
                          "NCCL loads and runs on this GPU; bus bandwidth needs two GPUs")
        assert "one-rank NCCL 2.28.9 communicator" in result.note
        assert "bus bandwidth needs two GPUs" in out.getvalue()
    else:
        assert passed.startswith("2 local nccl ranks joined in 2.0 s; all_reduce bus bandwidth "
                                 "up to 10.50 GB/s")
        assert result.note is None


def test_nccl_errors_become_findings_with_the_registry_fix() -> None:
    failed = Measurement("nccl", 2, 60.0, phase="collectives",
                         failure="2 local nccl ranks joined, but rank 0 failed: DistBackendError")
    failed.evidence = [
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3356, "
        "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.28.9",
        "host:123:456 [0] NCCL WARN Error while creating shared memory segment "
        "/dev/shm/nccl-3pDs0r (size 9637888)",
    ]
    found = distributed.failure_finding(failed)
    shm = messages.BY_NAME["nccl-shm-segment"]  # NCCL's own line before torch's summary
    assert (found.code, found.severity, found.fix) == ("TU421", "error", shm.fix)
    assert "the rank said 'host:123:456 [0] NCCL WARN Error while creating shared memory" \
        in found.message and shm.means in found.message
    failed.evidence = ["RuntimeError: something no registry row knows"]
    assert distributed.failure_finding(failed).fix == distributed._FIXES["TU421"]


def test_nccl_warnings_are_read_from_the_ranks_debug_files(tmp_path) -> None:
    (tmp_path / "rank0.log").write_text(
        "h:1:1 [0] NCCL INFO Bootstrap : Using eth0\n"
        "h:1:1 [0] NCCL WARN Call to ibv_open_device failed\n"
        "h:1:1 [0] NCCL WARN Call to ibv_open_device failed\n")
    (tmp_path / "rank1.log").write_text("h:2:2 [1] NCCL WARN \x1b]0;title\x07Cuda failure\n")
    assert distributed.nccl_warnings(tmp_path) == [
        "h:1:1 [0] NCCL WARN Call to ibv_open_device failed",
        "h:2:2 [1] NCCL WARN Cuda failure",  # what could act on a terminal is gone
    ]


def test_nccl_writes_its_warnings_where_the_doctor_reads_unless_the_user_chose() -> None:
    environ: dict[str, str] = {}
    distributed.nccl_warnings_to("/tmp/logs", 1, environ)
    assert environ == {"NCCL_DEBUG": "WARN", "NCCL_DEBUG_FILE": "/tmp/logs/rank1.log"}
    for chosen in ({"NCCL_DEBUG": "INFO"}, {"NCCL_DEBUG_FILE": "/var/log/nccl.%p"}):
        environ = dict(chosen)
        distributed.nccl_warnings_to("/tmp/logs", 0, environ)
        assert environ == chosen
