"""Trainer jobs nobody changed: a transformers ``Trainer`` and a ``lightning.Trainer`` iterate
plain torch DataLoaders, so the plain-DataLoader probe measures their data wait and names the
trainer, as ``tuneup watch -- python train.py`` runs them (the feed observer named, the probe
on PYTHONPATH). Tiny models built from a config, generated data, a few steps, no download."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from watch_helpers import published

from tuneup.runtime.hooks import ENV_OBSERVERS
from tuneup.site import SITE_DIR
from tuneup.watch import feed

pytestmark = pytest.mark.slow
pytest.importorskip("transformers")
pytest.importorskip("lightning")

SLOW_SAMPLES = textwrap.dedent("""
    import time
    import torch

    class Slow(torch.utils.data.Dataset):
        '''Each sample costs 5 ms of "decoding": the loop waits for it.'''
        def __len__(self): return 48
        def __getitem__(self, i):
            time.sleep(0.005)
            ids = torch.arange(i, i + 16) % 32
            return {"input_ids": ids, "labels": ids.clone(), "x": torch.randn(8)}
""")

HF_JOB = SLOW_SAMPLES + textwrap.dedent("""
    import tempfile
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    from tuneup.integrations.transformers import tuned_trainer

    class Tokens(Slow):
        def __getitem__(self, i):
            item = super().__getitem__(i)
            return {"input_ids": item["input_ids"], "labels": item["labels"]}

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1,
                                       n_head=2, bos_token_id=0, eos_token_id=0))
    with tempfile.TemporaryDirectory() as output_dir:
        args = TrainingArguments(output_dir=output_dir, per_device_train_batch_size=8,
                                 max_steps=6, save_strategy="no", report_to=[],
                                 disable_tqdm=True, use_cpu=True)
        # tuned_trainer loads tuneup's runtime (and, under the watcher, its feed observer),
        # which follows no tuned_loader here: the probe must still measure the DataLoader
        tuned_trainer(Trainer(model=model, args=args, train_dataset=Tokens())).train()
""")

LIGHTNING_JOB = SLOW_SAMPLES + textwrap.dedent("""
    import lightning as L

    class Regressor(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(8, 1)
        def train_dataloader(self):
            return torch.utils.data.DataLoader(Slow(), batch_size=8)
        def training_step(self, batch, index):
            return self.net(batch["x"]).square().mean()
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    L.Trainer(max_steps=6, logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False, accelerator="cpu").fit(Regressor())
""")


def run_watched(tmp_path: Path, source: str) -> feed.RuntimeSample:
    """The job as ``tuneup watch -- python job.py`` starts it; its one feed record."""
    script = tmp_path / "job.py"
    script.write_text(source)
    directory = tmp_path / "feed"
    directory.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEUP_")}
    env.update({"PYTHONPATH": str(SITE_DIR), feed.ENV_FEED: str(directory),
                ENV_OBSERVERS: feed.OBSERVER, "TOKENIZERS_PARALLELISM": "false"})
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (record,) = feed.read(directory, published(directory))
    return record


def assert_measured(record: feed.RuntimeSample, trainer: str) -> None:
    assert record.trainer == trainer
    assert record.steps >= 6 and record.samples == 8 * record.steps
    assert record.batch_size == 8 and record.num_workers == 0
    # 8 samples x 5 ms a batch: at least 40 ms of each batch's wait
    assert record.data_wait_s >= 0.8 * 0.040 * record.steps
    assert 0 < record.data_wait_s <= record.elapsed_s


def test_a_transformers_trainer_is_measured_by_the_probe(tmp_path):
    assert_measured(run_watched(tmp_path, HF_JOB), "transformers")


def test_a_lightning_trainer_is_measured_by_the_probe(tmp_path):
    assert_measured(run_watched(tmp_path, LIGHTNING_JOB), "lightning")
