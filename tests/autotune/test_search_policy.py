"""The search's policy: ceilings from the step's time split, the predicted first points."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tuneup.autotune import space
from tuneup.autotune.search import policy
from tuneup.autotune.space import ScriptFacts
from tuneup.autotune.trials import Trial, TrialResult
from tuneup.settings import Knobs

GPU = ScriptFacts(device="cuda", effective_batch=256, amp_dtypes=("bfloat16", "float16"),
                  compile_available=True, cpu_threads=16, usable_cores=16)
CPU = replace(GPU, device="cpu", amp_dtypes=("bfloat16",), cpu_threads=2, usable_cores=2)


def run(step: float, wait: float, device: float | None = None, knobs: Knobs = Knobs()
        ) -> TrialResult:
    event = {"status": "ok", "step_s": step, "step_s_all": [step] * 9,
             "data_wait_share": wait, "device_s": device}
    return TrialResult.from_event(Trial("t", knobs), event)


def test_the_breakdown_splits_a_step_into_wait_device_and_host():
    parts = run(0.1, 0.2, device=0.05).breakdown
    assert parts == pytest.approx({"step": 0.1, "data_wait": 0.02, "device": 0.05, "host": 0.03})
    cpu = run(0.1, 0.2).breakdown  # no device time apart: the compute is the rest
    assert cpu == pytest.approx({"step": 0.1, "data_wait": 0.02, "device": 0.08, "host": 0.0})


def test_amp_is_capped_by_the_data_wait_and_says_why():
    """The H200 images: the loop waits 88 % of the step; bfloat16 can at most shrink the
    rest, so its ceiling is small and the note says what holds it down."""
    images = run(0.235, 0.88, device=0.011)
    amp = policy.ceiling("amp", images, GPU, 0, 5000, 20.0)
    loader = policy.ceiling("loader", images, GPU, 0, 5000, 20.0)
    assert amp.factor < 1.05 and loader.factor > 8
    assert not policy.worth_trying(amp, images, 0.03, 0.05)
    assert amp.skipped() == ("amp: at most 1.04x here, the loop waits for data 88% of the "
                             "step; skipped")
    assert [c.stage for c in policy.order([amp, loader])] == ["loader", "amp"]


def test_once_workers_feed_the_gpu_amp_s_ceiling_rises():
    fed = run(0.025, 0.02, device=0.011, knobs=Knobs(num_workers=12))
    assert policy.ceiling("amp", fed, GPU, 12, 5000, 20.0).factor > 1.5
    # host time (the copy, launches): pinned memory and CUDA graphs can remove it
    assert policy.ceiling("loader_extras", fed, GPU, 12, 5000, 20.0).factor > 1.5


def test_pinning_s_ceiling_goes_once_memory_is_pinned():
    """The H200 images beside 16 workers: 12 ms of data wait and 29 ms of host time in a
    44 ms step. Unpinned, pinning could remove the host time; pinned, only a deeper
    prefetch is left, and it can remove the wait alone."""
    unpinned = run(0.0446, 0.27, device=0.0032, knobs=Knobs(num_workers=16))
    pinned = run(0.0446, 0.27, device=0.0032, knobs=Knobs(num_workers=16, pin_memory=True))
    assert policy.ceiling("loader_extras", unpinned, GPU, 16, 5000, 20.0).factor > 2.5
    assert policy.ceiling("loader_extras", pinned, GPU, 16, 5000, 20.0).factor == \
        pytest.approx(1 / (1 - 0.27))


def test_compile_s_ceiling_counts_its_cost_over_the_expected_steps():
    busy = run(0.05, 0.0)
    assert policy.ceiling("compile", busy, CPU, 0, 5000, 20.0).factor > 1.3
    assert policy.ceiling("compile", busy, CPU, 0, 500, 20.0).factor < 1.0


def test_graphs_remove_the_step_s_own_launches_not_host_time_the_workers_brought():
    """The H200 images at --budget 60: 0.2 ms of host time a step alone, 29 ms of a 44 ms
    step beside 16 workers (the main process short of a core). CUDA graphs cannot remove
    what the workers brought: compile's ceiling is the device's share and the launches."""
    fed = run(0.0446, 0.27, device=0.0032, knobs=Knobs(num_workers=16))
    unknown = policy.ceiling("compile", fed, GPU, 16, 5000, 20.0)
    known = policy.ceiling("compile", fed, GPU, 16, 5000, 20.0, launch_s=0.0002)
    assert unknown.factor > 2 and known.factor < 1.05
    assert known.why == ("the step's own launches take 1% of it, the rest of the host's 66% "
                         "came with the workers")
    assert policy.host_bound(fed) and not policy.host_bound(fed, 0.0002)
    assert policy.graphs_first(fed) and not policy.graphs_first(fed, 0.0002)
    # a step whose launches are the host time keeps its ceiling: nothing came with workers
    launch_bound = run(0.01, 0.0, device=0.004, knobs=Knobs(num_workers=4))
    assert policy.launches(launch_bound.breakdown, 0.005) == pytest.approx(0.006)
    assert policy.host_bound(launch_bound, 0.005) and policy.graphs_first(launch_bound, 0.005)


def test_workers_are_predicted_from_the_wait_then_neighbours():
    """0.2 s of data against 0.035 s of the rest: 0.2 / 0.035 x 1.25 -> 8 workers, then 16
    and 4; bounded by the cores."""
    images = run(0.235, 0.2 / 0.235)
    assert policy.predicted_workers(images, GPU, 0) == [8, 16, 4]
    assert policy.predicted_workers(images, CPU, 0) == [2, 1]
    # with 4 workers the loop still waits half the step: each worker takes 4 steps a batch
    assert policy.predicted_workers(run(0.07, 0.5), GPU, 4)[0] == 10


def test_the_predicted_point_on_a_gpu_joins_workers_pinned_memory_and_amp():
    groups = frozenset({"amp", "loader", "batch", "threads", "compile"})
    images = run(0.235, 0.2 / 0.235, device=0.03)
    point = policy.predicted_point(images, GPU, Knobs(), groups, 0.03)
    assert point.num_workers and point.pin_memory and point.amp_dtype == "bfloat16"
    # a CPU's bfloat16 may lose: left to its stage
    assert policy.predicted_point(images, CPU, Knobs(), groups, 0.03).amp_dtype is None
    # pinning a value the incumbent already has (unpinned, taken earlier) is no prediction
    unpinned = Knobs(pin_memory=False)
    assert policy.predicted_point(images, GPU, unpinned, groups, 0.03).pin_memory is False


def test_the_device_timer_gives_no_figure_off_cuda():
    import torch

    from tuneup.autotune.child_timing import DeviceTimer

    timer = DeviceTimer()
    timer.reset(torch.device("cpu"))
    timer.step_started()
    timer.step_ended(measured=True)
    assert timer.device_s() is None


def test_cudnn_is_tried_only_where_the_model_has_convolutions():
    busy = run(0.05, 0.0, device=0.045)
    with_convs = replace(GPU, convolutions=True)
    assert ScriptFacts.from_hello({"device": "cuda", "convolutions": True}) \
        .convolutions is True
    assert policy.ceiling("cudnn", busy, with_convs, 0, 5000, 20.0).factor > 1.05
    plain = policy.ceiling("cudnn", busy, replace(GPU, convolutions=False), 0, 5000, 20.0)
    assert plain.factor == 1.0 and plain.why == "the model has no convolutions"


def test_the_report_notes_each_stage_s_ceiling_and_what_was_measured():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_search import input_bound, search

    outcome = search(input_bound)[0].run()
    (note,) = [n for n in outcome.notes if n.startswith("loader: ceiling")]
    assert "the loop waits for data 70% of the step" in note and "; measured " in note


def test_threads_are_crowded_only_by_the_share_of_the_step_workers_decode():
    """4 threads and 2 workers on 4 cores: workers decoding all the time would time-share
    the cores (1.5x); decoding 0.02 s of a 0.1 s step each, they take a tenth of theirs."""
    cpu4 = replace(CPU, cpu_threads=4, usable_cores=4)
    fed = run(0.1, 0.0, knobs=Knobs(num_workers=2))
    assert policy.ceiling("threads", fed, cpu4, 2, 5000, 20.0).factor == pytest.approx(1.5)
    crowd = policy.ceiling("threads", fed, cpu4, 2, 5000, 20.0, decode_s=0.02)
    assert crowd.factor == pytest.approx(1.05)


def test_on_a_loaded_machine_the_threads_ceiling_counts_only_the_idle_cores():
    """2 cores, one kept busy by other processes: torch's 2 threads time-share one core, so
    the threads stage is worth a trial (it was "at most 1.00x" when the cores counted as
    the script's); the candidates include the one idle core."""
    alone = run(0.1, 0.0)
    idle = policy.ceiling("threads", alone, CPU, 0, 5000, 20.0)
    assert idle.factor == pytest.approx(1.0) and not policy.worth_trying(idle, alone, 0.03, 0.0)
    loaded = replace(CPU, busy_cores=1.0)
    busy = policy.ceiling("threads", alone, loaded, 0, 5000, 20.0)
    assert busy.factor == pytest.approx(2.0) and policy.worth_trying(busy, alone, 0.03, 0.0)
    assert "other processes keep 1.0 of 2 busy" in busy.why
    cpu4 = replace(CPU, cpu_threads=4, usable_cores=4, busy_cores=2.2)
    assert space.thread_counts(cpu4, 0) == [2, 1]


def test_the_hello_s_busy_cores_are_read_within_the_usable_cores():
    hello = {"device": "cpu", "usable_cores": 2, "cpu_threads": 2}
    assert ScriptFacts.from_hello({**hello, "busy_cores": 1.4}).busy_cores == 1.4
    assert ScriptFacts.from_hello({**hello, "busy_cores": 9}).busy_cores == 2.0
    assert ScriptFacts.from_hello({**hello, "busy_cores": "x"}).busy_cores == 0.0
    assert ScriptFacts.from_hello(hello).busy_cores == 0.0
    assert space.free_cores(ScriptFacts.from_hello({**hello, "busy_cores": 9})) == 1


def test_where_the_host_takes_a_third_of_the_step_cuda_graphs_compile_first():
    """A budget often holds one cold compile: where the device idles for the host a third
    of the step, the mode that removes host time (reduce-overhead) is the one tried first."""
    from test_search import CUDA, compute_bound, search

    assert policy.graphs_first(run(0.1, 0.0, device=0.6 * 0.1))
    assert not policy.graphs_first(run(0.1, 0.0, device=0.8 * 0.1))

    def host_third(knobs: Knobs) -> dict:
        data = compute_bound(knobs)
        return {**data, "device_s": 0.6 * data["step_s_all"][0]}

    tuner, recorded = search(host_third, facts=CUDA, budget=600)
    tuner.run()
    modes = [t.knobs.compile_mode for t in recorded.ran if t.knobs.compile_mode]
    assert modes[0] == "reduce-overhead" and "default" in modes


def test_busy_cores_are_the_cores_busy_time_less_the_child_s_own(monkeypatch):
    """Two cores each 0.1 s busier over the interval, the child itself 0.1 s of it: one
    core's worth of other load per 0.1 s interval (the clock is the measured interval)."""
    import itertools
    from collections import namedtuple

    from tuneup.autotune import child_facts

    cpu = namedtuple("cpu", "user system idle")
    own = namedtuple("own", "user system children_user children_system")
    ticks = iter([[cpu(1.0, 0.0, 5.0)] * 2, [cpu(1.1, 0.0, 5.0)] * 2])
    mine = iter([own(0.5, 0.0, 0.0, 0.0), own(0.6, 0.0, 0.0, 0.0)])
    clock = itertools.count(10.0, 0.1)  # the interval's two reads: 0.1 s apart
    monkeypatch.setattr(child_facts.psutil, "cpu_times", lambda percpu: next(ticks))
    monkeypatch.setattr(child_facts.psutil, "Process",
                        lambda: type("P", (), {"cpu_times": lambda self: next(mine)})())
    monkeypatch.setattr(child_facts.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(child_facts.time, "sleep", lambda s: None)
    monkeypatch.setattr(child_facts.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert child_facts.busy_cores() == pytest.approx(1.0)


def test_amp_once_adopted_is_not_visited_again():
    assert not policy.revisit("amp", Knobs(amp_dtype="bfloat16", num_workers=4))
    assert policy.revisit("amp", Knobs(num_workers=4))  # a dtype the data wait hid
    assert policy.revisit("loader", Knobs(amp_dtype="bfloat16"))


def test_only_a_large_ceiling_outweighs_a_confirmation_before_a_find_or_once_shown():
    assert policy.outweighs_confirmation(policy.LARGE_GAIN, None, found=False)
    assert not policy.outweighs_confirmation(1.1, None, found=False)
    assert not policy.outweighs_confirmation(2.0, None, found=True)  # a pick to confirm
    assert policy.outweighs_confirmation(2.0, None, found=True, shown=True)  # claim made
    assert not policy.outweighs_confirmation(1.1, None, found=True, shown=True)
    assert not policy.outweighs_confirmation(1.5, 1.8, found=True, shown=True)  # compile's
    assert not policy.outweighs_confirmation(1.5, 1.8, found=False)  # compile's share
    assert policy.outweighs_confirmation(2.0, 1.8, found=False)


def test_compile_takes_the_confirmation_s_share_only_for_a_large_gain_on_a_shown_find():
    assert policy.compile_outweighs_confirmation(policy.LARGE_GAIN, shown=True)
    assert not policy.compile_outweighs_confirmation(1.1, shown=True)
    assert not policy.compile_outweighs_confirmation(2.0, shown=False)  # the pick rests on it


def test_cudnn_is_skipped_where_the_input_shape_changes():
    """cuDNN's autotuner searches its algorithms again for each new shape: with
    variable-length batches its ceiling is 1 and the note says why."""
    fixed = run(0.05, 0.0, device=0.045)
    varying = replace(fixed, input_shapes=6)
    convolutional = replace(GPU, convolutions=True)
    assert policy.ceiling("cudnn", fixed, convolutional, 0, 5000, 20.0).factor > 1.1
    ceiling = policy.ceiling("cudnn", varying, convolutional, 0, 5000, 20.0)
    assert ceiling.factor == 1.0
    assert ceiling.skipped() == ("cudnn: at most 1.00x here, the input's shape changes between "
                                 "steps (6 shapes in one window): cuDNN's autotuner would "
                                 "search again for each; skipped")
    # a few recurring shapes (buckets) pay one search each: the stage still runs
    buckets = replace(fixed, input_shapes=3)
    assert policy.ceiling("cudnn", buckets, convolutional, 0, 5000, 20.0).factor > 1.1


def test_the_predicted_point_s_ceiling_counts_what_the_point_changes():
    """Workers and bfloat16 at once: the wait removed and the device time shrunk, above
    either stage's ceiling alone; a point of workers only (amp fixed, or a CPU) counts the
    wait alone, and one that keeps the workers not the wait."""
    images = run(0.2, 0.6, device=0.06)
    both = Knobs(num_workers=8, pin_memory=True, amp_dtype="bfloat16")
    joint = policy.predicted_ceiling(images, Knobs(), both).factor
    loader = policy.ceiling("loader", images, GPU, 0, 5000, 20.0).factor
    amp = policy.ceiling("amp", images, GPU, 0, 5000, 20.0).factor
    assert joint == pytest.approx(0.2 / (0.2 - 0.12 - 0.06 * (1 - 1 / policy.AMP_GPU)))
    assert joint > loader > 1 and joint > amp
    workers_only = policy.predicted_ceiling(images, Knobs(), both.replace(amp_dtype=None))
    assert workers_only.factor == pytest.approx(loader)
    amp_only = policy.predicted_ceiling(images, Knobs(num_workers=8), both)
    assert amp_only.factor == pytest.approx(0.2 / (0.2 - 0.06 * (1 - 1 / policy.AMP_GPU)))


def test_a_clear_lead_is_a_large_gain_beyond_the_windows_noise():
    assert policy.clear_lead(policy.LARGE_GAIN, 0.0, 0.0)
    assert not policy.clear_lead(policy.LARGE_GAIN, 0.01, 0.0)  # its own noise
    assert not policy.clear_lead(1.3, 0.0, 0.05)  # 1.2 x 1.1 = 1.32 needed
    assert policy.clear_lead(1.33, 0.0, 0.05)
