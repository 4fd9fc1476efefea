"""Candidate values from the hardware facts in a hello event."""

from __future__ import annotations

from dataclasses import replace

from tuneup.autotune import space
from tuneup.autotune.space import ScriptFacts
from tuneup.settings import Knobs

CPU = ScriptFacts(device="cpu", effective_batch=256, amp_dtypes=("bfloat16",), compile_available=True,
               cpu_threads=2, usable_cores=2)
CUDA = replace(CPU, device="cuda", amp_dtypes=("bfloat16", "float16"), usable_cores=16,
               cpu_threads=16)


def test_from_hello_reads_the_event_and_tolerates_junk():
    hw = ScriptFacts.from_hello({"event": "hello", "device": "cuda:0", "effective_batch": 64,
                              "dataset_size": None, "amp_dtypes": ["bfloat16", "int3"],
                              "compile_available": True, "cpu_threads": "x", "usable_cores": 8,
                              "fixed_knobs": ["num_workers"]})
    assert hw == ScriptFacts(device="cuda", effective_batch=64, dataset_size=None,
                          amp_dtypes=("bfloat16",), compile_available=True, cpu_threads=8,
                          usable_cores=8, fixed_knobs=("num_workers",))
    assert ScriptFacts.from_hello({}) == ScriptFacts()


def test_a_trainer_s_accumulation_counts_in_the_samples_per_step():
    """samples/s are per optimizer step: batch 8 accumulated 4 times is 32 samples a step."""
    trainer = ScriptFacts.from_hello({"effective_batch": 8, "samples_per_step": 32})
    assert trainer.effective_batch == 8 and trainer.samples_per_step == 32
    assert ScriptFacts.from_hello({"effective_batch": 8, "ranks": 2}).samples_per_step == 16


def test_what_every_trial_ran_with_goes_into_the_settings():
    hw = ScriptFacts.from_hello({"every_trial": {"fixed_malloc_thresholds": True}})
    pick = Knobs(amp_dtype="bfloat16")
    assert hw.as_run(pick) == pick.replace(fixed_malloc_thresholds=True)
    for junk in ({"no_such_knob": 1}, {"fixed_malloc_thresholds": "yes"}, [1], "x"):
        assert ScriptFacts.from_hello({"every_trial": junk}).as_run(pick) == pick


def test_amp_only_supported_dtypes_and_never_float16_on_cpu():
    assert space.amp_dtypes(CPU) == ["bfloat16"]
    assert space.amp_dtypes(replace(CPU, amp_dtypes=("bfloat16", "float16"))) == ["bfloat16"]
    assert space.amp_dtypes(replace(CPU, amp_dtypes=())) == []
    assert space.amp_dtypes(CUDA) == ["bfloat16", "float16"]
    assert space.matmul_precisions(CPU) == [] and space.matmul_precisions(CUDA) == ["high"]


def test_micro_batches_divide_the_effective_batch():
    assert space.micro_batches(CPU) == [128, 64, 32]
    assert space.micro_batches(replace(CPU, effective_batch=100)) == [50, 25]
    assert space.micro_batches(replace(CPU, effective_batch=24)) == [12]
    assert space.micro_batches(replace(CPU, effective_batch=6)) == [3]
    assert space.micro_batches(replace(CPU, effective_batch=7)) == []


def test_workers_up_to_the_usable_cores():
    assert space.worker_counts(CPU) == [1, 2]
    assert space.worker_counts(replace(CPU, usable_cores=12)) == [1, 2, 4, 8, 12]
    assert space.worker_counts(replace(CPU, usable_cores=96)) == [1, 2, 4, 8, 16, 32]


def test_threads_share_the_cores_with_the_workers():
    assert space.thread_counts(CPU, workers=2) == [1]
    assert space.thread_counts(CPU, workers=0) == [1]
    eight = replace(CPU, usable_cores=8, cpu_threads=8)
    assert space.thread_counts(eight, workers=2) == [6, 4, 1]
    assert space.thread_counts(replace(eight, cpu_threads=4), workers=0) == [8, 1]


def test_compile_modes():
    assert space.compile_modes(CPU) == ["default"]
    assert space.compile_modes(CUDA) == ["default", "reduce-overhead"]
    assert space.compile_modes(replace(CPU, compile_available=False)) == []


def test_defaults_for_the_report():
    assert space.default_value("micro_batch_size", CPU) == 256
    assert space.default_value("cpu_threads", CPU) == 2
    assert space.default_value("amp_dtype", CPU) == "float32"
