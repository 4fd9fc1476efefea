"""The one table of spellings: every name it writes exists in the library it is written for,
and the integrations import no optional library until they run."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from tuneup.integrations import knobs_as, require
from tuneup.settings import Knobs

EVERY_KNOB = Knobs(num_workers=2, pin_memory=True, prefetch_factor=4, persistent_workers=True,
                   micro_batch_size=8, amp_dtype="bfloat16", compile_mode="max-autotune",
                   cpu_threads=3, cudnn_benchmark=True, float32_matmul_precision="high",
                   fixed_malloc_thresholds=True)


def test_importing_tuneup_the_integrations_and_the_show_command_loads_no_library():
    code = ("import sys, tuneup, tuneup.integrations, tuneup.integrations.knobs_as, "
            "tuneup.integrations.transformers, tuneup.settings.show\n"
            "print(sorted(m for m in ('transformers', 'lightning', 'accelerate', 'torch') "
            "if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert loaded == "[]"


def test_a_missing_library_names_its_extra():
    with pytest.raises(ImportError, match=r"^tuneup's hf integration needs no_such_module: "
                                          r"pip install tuneup\[hf\]$"):
        require("no_such_module", "hf")


def test_every_hf_spelling_is_a_training_arguments_field():
    transformers = pytest.importorskip("transformers")
    names = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    spelled = knobs_as.as_hf(EVERY_KNOB, batch_size=32, accumulation=2)
    assert set(spelled.arguments) <= names
    assert spelled.arguments["per_device_train_batch_size"] == 8
    assert spelled.arguments["gradient_accumulation_steps"] == 8  # 2 × (32 / 8): same 64
    assert set(knobs_as.HF_AMP_FIELDS.values()) <= names


def test_the_env_spelling_of_amp_is_what_training_arguments_reads(monkeypatch, tmp_path):
    transformers = pytest.importorskip("transformers")
    variables = knobs_as.as_env(EVERY_KNOB).arguments
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", variables["ACCELERATE_MIXED_PRECISION"])
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    assert args.mixed_precision == "bf16"


@pytest.mark.parametrize(("batch", "micro", "pieces"), [
    (32, 8, 4), (32, 32, None), (32, 12, None), (8, 16, None)])
def test_a_micro_batch_is_applied_only_when_it_splits_the_batch_exactly(batch, micro, pieces):
    assert knobs_as.micro_batch_split(batch, micro) == pieces


def test_a_micro_batch_no_smaller_than_the_batch_is_no_change():
    assert knobs_as.as_hf(Knobs(micro_batch_size=8), batch_size=8) == knobs_as.Spelled()


def test_without_the_batch_the_hf_micro_batch_says_what_it_needs():
    spelled = knobs_as.as_hf(Knobs(micro_batch_size=8))
    assert spelled.arguments == {} and "needs your batch size" in spelled.left_out[
        "micro_batch_size"]


def test_each_knob_is_spelled_or_said_to_be_left_out_in_every_ecosystem():
    plain, lightning = knobs_as.as_plain(EVERY_KNOB), knobs_as.as_lightning(EVERY_KNOB)
    assert plain.arguments == EVERY_KNOB.loader_kwargs()
    assert lightning.arguments == {"precision": "bf16-mixed"}
    for spelled in (plain, lightning):
        assert {"torch.set_num_threads(3)", "torch.backends.cudnn.benchmark = True",
                "torch.set_float32_matmul_precision('high')"} <= set(spelled.calls)
        assert "model = torch.compile(model, mode='max-autotune')" in " ".join(spelled.calls)
        assert list(spelled.left_out) == ["micro_batch_size"]
    env = knobs_as.as_env(EVERY_KNOB, "/x/train.tuneup.json")
    assert env.arguments["OMP_NUM_THREADS"] == "3"
    assert env.arguments["TUNEUP_SETTINGS"] == "/x/train.tuneup.json"
    spelled_by_env = {"cpu_threads", "amp_dtype", "compile_mode", "fixed_malloc_thresholds"}
    assert set(env.left_out) == set(EVERY_KNOB.changed()) - spelled_by_env
