"""The verdict rules on recorded windows (NVML replayed through the fake module) and on
synthesised CPU-only windows: every kind, the order between them, and what each rests on."""

from __future__ import annotations

import dataclasses

import pytest
from fake_nvml import FakeNvml, NVMLError, tick_clock
from watch_helpers import RECORDINGS, load, replay

from tuneup.watch.samples import (CHILD, MAIN, WORKER, GpuSample, HostSample, ProcessSample,
                                  RuntimeSample, Sample, StackCounts)
from tuneup.watch.verdict import RULES, Figures, decide, reduce

KINDS = {"input-bound", "host-bound", "copy-bound", "compute-bound", "throttled",
         "cpu-oversubscribed", "memory-pressure", "idle"}
NAMES = sorted(path.stem for path in RECORDINGS.glob("*.json"))


@pytest.fixture(autouse=True)
def _ticks_a_second_apart(monkeypatch):
    """Recordings replay at once; their ticks were a second apart (GPM needs 100 ms)."""
    tick_clock(monkeypatch)


@pytest.mark.parametrize("name", NAMES)
def test_each_recording_gives_its_verdict(name):
    recording = load(name)
    verdict = decide(reduce(replay(recording)), "train.py")
    assert verdict.kind == recording["expect"], (verdict, recording["about"])
    assert verdict.evidence and verdict.action and verdict.reason


def test_the_recordings_cover_every_kind():
    assert {load(name)["expect"] for name in NAMES} == KINDS


def test_evidence_holds_the_figures_the_rule_read():
    throttled = decide(reduce(replay(load("throttled"))))
    assert throttled.evidence["reasons"] == ["SwPowerCap", "SwThermalSlowdown"]
    assert 0.7 < throttled.evidence["sm_clock_ratio"] < 0.8
    copy = decide(reduce(replay(load("copy-bound"))), "clips.py")
    assert copy.evidence["pin_memory"] is False and copy.evidence["pcie_rx_share"] >= 0.6
    assert "`tuneup autotune clips.py --only loader`" in copy.action
    starved = decide(reduce(replay(load("input-bound"))))
    assert starved.evidence["data_wait_share"] == pytest.approx(0.58)
    assert "num_workers=2" in starved.action and "--only loader" in starved.action


def test_gpu_figures_count_only_the_gpus_the_job_holds():
    recording = load("compute-bound")
    busy = recording["devices"][0]
    recording["devices"] = [busy, {**busy, "name": "someone else's"}]
    recording["ticks"] = [[tick[0], {**tick[0], "util": 0, "processes": [[777, 2**30]]}]
                          for tick in recording["ticks"]]
    figures = reduce(replay(recording))
    assert figures.gpus == 1 and figures.gpu_utilization >= 96


def test_throttling_outranks_a_busy_gpu_and_memory_pressure_outranks_everything():
    hot = reduce(replay(load("throttled")))
    assert hot.gpu_utilization >= 90 and decide(hot).kind == "throttled"
    full = dataclasses.replace(hot, gpu_memory_share=0.99)
    assert decide(full).kind == "memory-pressure"
    assert [rule.__name__ for rule in RULES][:4] == [
        "idle", "memory_pressure", "throttled", "cpu_oversubscribed"]


def test_a_gpu_resting_at_low_clocks_is_not_throttled():
    idle = reduce(replay(load("idle")))
    assert idle.sm_clock_ratio < 0.2 and idle.held_share == 0
    assert decide(idle).kind == "idle"


def test_no_verdict_figure_is_invented_without_a_source():
    figures = reduce(replay(load("input-bound-workers")))
    assert figures.data_wait_share is None and figures.steps is None
    assert figures.runtime is None and figures.workers == 4


# -- CPU-only windows: no NVML ------------------------------------------------------------
HOST = HostSample(cpu_percent=95.0, iowait_percent=0.5, swap_bytes_s=0.0,
                  memory_available=8 * 2**30, memory_total=16 * 2**30, usable_cores=2.0)


def cpu_window(main: float, workers: list[float], wait_s: float | None = None,
               ticks: int = 5, busy: int = 1, **host: float) -> list[Sample]:
    samples = []
    for tick in range(ticks):
        processes = (ProcessSample(10, MAIN, main, busy, 4, 2**30, None), *(
            ProcessSample(11 + n, WORKER, cpu, int(cpu >= 20), 2, 2**29, None)
            for n, cpu in enumerate(workers)))
        runtime = () if wait_s is None else (RuntimeSample(
            pid=10, steps=4 * (tick + 1), samples=512 * (tick + 1), elapsed_s=float(tick + 1),
            data_wait_s=wait_s * (tick + 1), copy_s=0.0, device="cpu", num_workers=len(workers),
            pin_memory=False, prefetch_factor=None, batch_size=128, torch_threads=2),)
        samples.append(Sample(t=float(tick), gpus=(), processes=processes,
                              host=dataclasses.replace(HOST, **host), runtime=runtime))
    return samples


@pytest.mark.parametrize(("wait_s", "kind"), [(0.6, "input-bound"), (0.12, "input-bound"),
                                              (0.05, "compute-bound"), (0.0, "compute-bound")])
def test_without_a_gpu_the_feeds_data_wait_decides(wait_s, kind):
    verdict = decide(reduce(cpu_window(98.0, [], wait_s)))
    assert verdict.kind == kind
    assert verdict.evidence["data_wait_share"] == pytest.approx(wait_s)


def test_without_a_gpu_or_feed_worker_cpu_against_main_cpu_decides():
    assert decide(reduce(cpu_window(30.0, [97.0, 95.0], busy=0))).kind == "input-bound"
    keeping_up = decide(reduce(cpu_window(99.0, [15.0, 10.0], busy=1)))
    assert keeping_up.kind == "compute-bound" and "basis" not in keeping_up.evidence


def test_without_gpu_feed_workers_or_stacks_a_busy_process_is_undetermined():
    verdict = decide(reduce(cpu_window(99.0, [])))  # it may be decoding its data
    assert verdict.kind == "undetermined"
    assert "cannot be told" in verdict.reason and "nothing to gain" not in verdict.action


def test_more_busy_threads_than_cores_on_a_saturated_machine_is_oversubscription():
    crowded = cpu_window(180.0, [90.0, 90.0], wait_s=0.3, busy=2, cpu_percent=99.0)
    verdict = decide(reduce(crowded))
    assert verdict.kind == "cpu-oversubscribed"
    assert verdict.evidence["busy_threads"] == 4 and verdict.evidence["usable_cores"] == 2
    calm = cpu_window(180.0, [90.0, 90.0], wait_s=0.3, busy=2, cpu_percent=60.0)
    assert decide(reduce(calm)).kind == "input-bound"
    exactly_its_cores = cpu_window(196.0, [], wait_s=0.02, busy=2, cpu_percent=99.0)
    assert decide(reduce(exactly_its_cores)).kind == "compute-bound"  # train_mlp.py here


def test_swapping_is_memory_pressure_even_without_a_gpu():
    verdict = decide(reduce(cpu_window(99.0, [], 0.0, swap_bytes_s=50 * 2**20)))
    assert verdict.kind == "memory-pressure" and "swaps 50.0 MiB/s" in verdict.reason


def test_a_job_that_runs_nothing_is_idle_unless_it_waits_for_storage():
    quiet = cpu_window(1.0, [0.5], busy=0)
    assert decide(reduce(quiet)).kind == "idle"
    loading = cpu_window(1.0, [0.5], busy=0, iowait_percent=60.0)
    assert decide(reduce(loading)).kind != "idle"


def test_a_job_whose_feed_trains_on_the_cpu_is_not_judged_by_the_machine_s_gpu():
    """``train_mlp.py --device cpu`` on the H200: the job held no GPU memory, so every GPU
    counted, and the idle one made it host-bound ("the GPU is busy only 0 %")."""
    idle_gpu = GpuSample(index=0, name="NVIDIA H200", utilization=0.0, memory_used=2**30,
                         memory_total=141 * 2**30, job_memory=0)
    on_cpu = [dataclasses.replace(s, gpus=(idle_gpu,)) for s in cpu_window(98.0, [], 0.02)]
    figures = reduce(on_cpu)
    assert figures.gpus == 0 and figures.gpu_utilization is None
    assert decide(figures).kind == "compute-bound"
    on_cuda = [dataclasses.replace(s, runtime=tuple(dataclasses.replace(r, device="cuda")
                                                    for r in s.runtime)) for s in on_cpu]
    assert decide(reduce(on_cuda)).kind == "host-bound"  # its GPU waits: NVML's pids may differ
    unsaid = [dataclasses.replace(s, runtime=tuple(dataclasses.replace(r, device=None)
                                                   for r in s.runtime)) for s in on_cpu]
    assert reduce(unsaid).gpus == 1  # a feed that does not say keeps the GPUs


def test_figures_need_no_sample_to_exist():
    empty = reduce([])
    assert isinstance(empty, Figures) and empty.job_cpu is None and empty.gpus == 0


# -- py-spy's stacks: no GPU, no feed, no workers ----------------------------------------
def stacked(window: list[Sample], loading: int, total: int) -> list[Sample]:
    """``window`` with py-spy's counts on every other sample (its windows outlast a tick)."""
    return [dataclasses.replace(s, stacks=StackCounts(loading, total) if n % 2 else None)
            for n, s in enumerate(window)]


@pytest.mark.parametrize(("loading", "kind"), [(60, "input-bound"), (10, "input-bound"),
                                               (9, "compute-bound"), (0, "compute-bound")])
def test_without_gpu_feed_or_workers_the_stacks_split_loading_from_compute(loading, kind):
    verdict = decide(reduce(stacked(cpu_window(99.0, []), loading, 100)))
    assert verdict.kind == kind
    assert verdict.evidence["basis"] == "py-spy stacks"
    assert verdict.evidence["loading_share"] == pytest.approx(loading / 100)
    assert "(py-spy stacks)" in verdict.reason


def test_the_feed_and_the_workers_outrank_the_stacks():
    fed = decide(reduce(stacked(cpu_window(98.0, [], wait_s=0.02), 90, 100)))
    assert fed.kind == "compute-bound" and "basis" not in fed.evidence
    with_workers = decide(reduce(stacked(cpu_window(99.0, [15.0]), 90, 100)))
    assert with_workers.kind == "compute-bound" and "basis" not in with_workers.evidence


def test_the_loading_share_is_over_all_the_windows_stacks():
    window = stacked(cpu_window(99.0, []), 30, 100)
    window[1] = dataclasses.replace(window[1], stacks=StackCounts(0, 300))
    assert reduce(window).loading_share == pytest.approx(30 / 400)
    assert reduce(cpu_window(99.0, [])).loading_share is None


# -- children of unknown role (Hogwild's trainers in set-up) ------------------------------
def as_children(window: list[Sample]) -> list[Sample]:
    """``window`` with its workers' evidence gone: multiprocessing children, role unknown."""
    return [dataclasses.replace(s, processes=tuple(
        dataclasses.replace(p, role=CHILD) if p.role == WORKER else p for p in s.processes))
        for s in window]


def test_busy_children_of_unknown_role_never_make_the_job_input_bound():
    # the same CPU figures that are input-bound as DataLoader workers
    verdict = decide(reduce(as_children(cpu_window(30.0, [97.0, 95.0], busy=0))))
    assert verdict.kind == "undetermined", verdict
    assert "2 child processes of unknown role" in verdict.reason
    assert verdict.evidence["workers"] == 0 and verdict.evidence["children"] == 2


def test_a_main_process_out_of_the_dataloader_does_not_make_children_compute_bound():
    # Hogwild's main process joins its trainers: its stacks say nothing of their training
    verdict = decide(reduce(stacked(as_children(cpu_window(99.0, [10.0, 10.0])), 0, 100)))
    assert verdict.kind == "undetermined", verdict
    loading = decide(reduce(stacked(as_children(cpu_window(99.0, [90.0])), 60, 100)))
    assert loading.kind == "input-bound" and loading.evidence["basis"] == "py-spy stacks"


def test_trainers_feeds_are_summed_and_counted():
    window = cpu_window(98.0, [], wait_s=0.02)
    twice = [dataclasses.replace(s, runtime=(*s.runtime, dataclasses.replace(s.runtime[0], pid=11)))
             for s in window]
    one, two = reduce(window), reduce(twice)
    assert (one.trainers, two.trainers) == (1, 2)
    assert two.steps == 2 * one.steps and two.samples_per_s == pytest.approx(2 * one.samples_per_s)


# -- SM activity (GPM) against NVML's utilisation -----------------------------------------
def test_a_gpu_99_percent_utilised_but_30_percent_sm_active_is_host_bound():
    verdict = decide(reduce(replay(load("host-bound-h100"))))
    assert verdict.kind == "host-bound"
    assert verdict.evidence["gpu_basis"] == "sm_activity"
    assert verdict.evidence["sm_activity"] == pytest.approx(30, abs=1)
    assert verdict.evidence["gpu_utilization"] >= 98
    assert verdict.reason.startswith("the GPU's SMs are busy only 30 % of the time (SM activity")
    assert "not available" not in verdict.reason


def test_busy_sms_are_compute_bound():
    recording = load("host-bound-h100")
    for tick in recording["ticks"]:
        tick[0]["sm_active"] = 88
    verdict = decide(reduce(replay(recording)))
    assert verdict.kind == "compute-bound" and verdict.evidence["gpu_basis"] == "sm_activity"
    assert verdict.reason == "the GPU's SMs are busy 88 % of the time (SM activity)"


def test_without_gpm_utilisation_decides_and_the_reason_says_so():
    recording = load("host-bound-h100")
    recording["devices"][0]["gpm"] = False
    verdict = decide(reduce(replay(recording)))
    assert verdict.kind == "compute-bound" and verdict.evidence["gpu_basis"] == "utilization"
    assert verdict.evidence["sm_activity"] is None
    assert verdict.reason.endswith(
        "; NVML utilisation (a kernel ran), SM activity not available on this GPU")
    a100 = decide(reduce(replay(load("host-bound"))))
    assert a100.kind == "host-bound" and a100.evidence["gpu_basis"] == "utilization"
    assert "SM activity not available on this GPU" in a100.reason


def test_gpm_that_raises_falls_back_to_utilisation(monkeypatch):
    def lost(self, request):
        raise NVMLError("GPU is lost")

    monkeypatch.setattr(FakeNvml, "nvmlGpmMetricsGet", lost)
    verdict = decide(reduce(replay(load("host-bound-h100"))))
    assert verdict.kind == "compute-bound" and verdict.evidence["gpu_basis"] == "utilization"


def test_sm_activity_counts_only_when_every_gpu_gives_it():
    recording = load("host-bound-h100")
    h100 = recording["devices"][0]
    recording["devices"] = [h100, {**h100, "gpm": False, "uuid": "GPU-other"}]
    recording["ticks"] = [[tick[0], {**tick[0], "processes": [[5200, 2**30]]}]
                          for tick in recording["ticks"]]
    figures = reduce(replay(recording))
    assert figures.gpus == 2 and figures.sm_activity is None
