"""Autotune on scripts built on a trainer that owns its loop (transformers, Lightning): each
trial a fresh process of the real script, timed on the trainer's own steps, from the same
weights and batches. Tiny models built from a config in the test, generated data, CPU."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tuneup.autotune.runner import Runner
from tuneup.autotune.search.budget import CONFIRM_ROUNDS, Budget
from tuneup.autotune.space import ScriptFacts
from tuneup.autotune.trials import Trial
from tuneup.cli import main
from tuneup.settings import Knobs, read

pytest.importorskip("transformers")
pytest.importorskip("lightning")

# the sample's work runs PREP times in Python: input-bound, as on-the-fly tokenising is
HF_SCRIPT = textwrap.dedent('''
    import sys, tempfile, time
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    from tuneup.integrations.transformers import tuned_trainer

    PREP = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    EXTRA = {k: int(v) if v.isdigit() else v for k, v in (a.split("=") for a in sys.argv[2:])}

    class SlowEval(torch.utils.data.Dataset):  # an evaluation pass of about 1.6 s
        def __len__(self):
            return 16
        def __getitem__(self, i):
            time.sleep(0.1)
            ids = torch.arange(16) % 32
            return {"input_ids": ids, "labels": ids.clone()}

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 4096
        def __getitem__(self, i):
            for _ in range(PREP):
                tokens = [(i * 7 + k * k) % 32 for k in range(16)]
            ids = torch.tensor(tokens)
            return {"input_ids": ids, "labels": ids.clone()}

    model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=16, n_embd=32, n_layer=1,
                                       n_head=2, bos_token_id=0, eos_token_id=0))
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=16,
                                 num_train_epochs=3, save_strategy="no", report_to=[],
                                 disable_tqdm=True, use_cpu=True, logging_steps=1000,
                                 **EXTRA)
        evaluated = SlowEval() if "eval_strategy" in EXTRA else None
        trainer = tuned_trainer(Trainer(model=model, args=args, train_dataset=Tokens(),
                                        eval_dataset=evaluated))
        trainer.train()
''')

LIGHTNING_SCRIPT = textwrap.dedent('''
    import sys, tempfile
    import lightning as L
    import torch
    from torch import nn
    from tuneup.integrations.lightning import tuned_trainer_kwargs

    PREP = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    EXTRA = dict(arg.split("=") for arg in sys.argv[2:])

    class Points(torch.utils.data.Dataset):
        def __init__(self):
            self.x = torch.randn(2048, 8, generator=torch.Generator().manual_seed(0))
        def __len__(self):
            return len(self.x)
        def __getitem__(self, i):
            for _ in range(PREP):
                y = torch.sin(self.x[i, :4].sum())
            return self.x[i], y

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 32), nn.Dropout(0.1), nn.Linear(32, 1))
        def train_dataloader(self):
            return torch.utils.data.DataLoader(Points(), batch_size=32, shuffle=True)
        def training_step(self, batch, index):
            x, y = batch
            return nn.functional.mse_loss(self.net(x).squeeze(-1), y)
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    with tempfile.TemporaryDirectory() as root:
        trainer = L.Trainer(**tuned_trainer_kwargs(
            max_epochs=20, accelerator="cpu", logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
            **EXTRA))
        trainer.fit(Module())
''')


def script(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "train.py"
    path.write_text(text)
    return path


# the trials' window: 2 warm-up steps and the 9 timed that a result needs, not the 1.5 s of
# steps (60 at most) that autotune times for its comparisons
WINDOW = {"min_measure_seconds": 0.0}


def run_trials(path: Path, trials: list[Trial], args: tuple[str, ...] = ()) -> tuple:
    with Runner(path, list(args), deadline=time.monotonic() + 240, plan=WINDOW) as runner:
        results = runner.run(trials)
        return results, runner


@pytest.mark.parametrize("text", [HF_SCRIPT, LIGHTNING_SCRIPT], ids=["transformers", "lightning"])
def test_each_trial_is_a_process_from_the_same_weights_and_batches(tmp_path, text):
    trials = [Trial("defaults", Knobs(), check=True),
              Trial("workers=1", Knobs(num_workers=1), check=True)]
    (plain, workers), runner = run_trials(script(tmp_path, text), trials)
    assert plain.status == workers.status == "ok", (plain.message, workers.message)
    assert runner.processes_started == 2  # the trainer cannot change knobs inside train()
    assert runner.facts.trials_per_process == 1
    assert plain.step_s > 0 and len(plain.step_s_all) >= 9
    # same reference weights, same seeded order: the knob cannot change the losses (to
    # float32 rounding: on a loaded machine the two processes' matmuls may split their
    # sums over other thread counts, 2e-7 apart in a fresh-clone run beside other jobs)
    assert len(plain.check_losses) == 3
    assert plain.check_losses == pytest.approx(workers.check_losses, rel=1e-6, abs=0)


def test_a_micro_batch_splits_the_per_device_batch_under_accumulation(tmp_path):
    trials = [Trial("defaults", Knobs(), check=True),
              Trial("micro=8", Knobs(micro_batch_size=8), check=True)]
    (plain, micro), runner = run_trials(script(tmp_path, HF_SCRIPT), trials,
                                        ("1", "gradient_accumulation_steps=2"))
    assert runner.facts.effective_batch == 16  # per device: what a micro-batch divides
    assert runner.facts.samples_per_step == 32  # what the result's samples/s count
    assert plain.status == micro.status == "ok", micro.message
    # the same samples per step; GPT-2's dropout draws its masks per piece: close, not equal
    assert micro.check_losses == pytest.approx(plain.check_losses, rel=0.01)
    # samples per optimizer step: 16 x 2, whatever the split
    assert plain.samples_per_s == pytest.approx(32 / plain.step_s)


def test_a_value_the_user_set_is_a_fixed_knob_with_its_reason(tmp_path):
    trials = [Trial("defaults", Knobs(), check=True)]
    _, runner = run_trials(script(tmp_path, HF_SCRIPT), trials,
                           ("1", "dataloader_num_workers=1"))
    reasons = dict(runner.facts.fixed_reasons)
    assert reasons["num_workers"] == "you set dataloader_num_workers=1 in TrainingArguments"
    assert reasons["pin_memory"] == "batches stay on the CPU"


def test_evaluation_between_steps_is_not_timed_as_a_step(tmp_path):
    trials = [Trial("defaults", Knobs(), check=True)]
    (result,), _ = run_trials(script(tmp_path, HF_SCRIPT), trials,
                              ("1", "eval_strategy=steps", "eval_steps=10"))
    assert result.status == "ok", result.message
    # a step takes ~0.02 s here, an evaluation 1.6 s (the margin is for a busy machine); the
    # window (2 warm-up steps, then 9 timed) holds the evaluation after step 10, and the step
    # after it is not timed
    assert len(result.step_s_all) >= 9 and max(result.step_s_all) < 1.0


def test_a_knob_the_trainer_cannot_take_fails_its_trial_not_silently(tmp_path):
    trials = [Trial("amp", Knobs(amp_dtype="bfloat16"), check=True)]
    (result,), _ = run_trials(script(tmp_path, LIGHTNING_SCRIPT), trials,
                              ("1", "precision=32-true"))
    assert result.status == "error"
    assert result.message == ("amp_dtype cannot apply to this lightning trainer: you set "
                              "precision='32-true'")


def test_the_budget_prices_a_start_up_for_each_trial_of_a_trainer():
    class Executor:
        facts = ScriptFacts()
        startup_s = 6.0

        def time_left(self) -> float:
            return 100.0

        def live_process(self) -> bool:
            return False

        def held_graphs(self) -> None:
            return None

    executor = Executor()
    many = Budget(executor)
    executor_one = Executor()
    executor_one.facts = ScriptFacts(trials_per_process=1)
    one = Budget(executor_one)
    assert one.trial_seconds() == pytest.approx(many.trial_seconds() + 6.0)
    # ... and only there: a plan's process adds none of its own (it was counted twice)
    assert many.next_startup_seconds() == 6.0 and one.next_startup_seconds() == 0.0
    pairs = CONFIRM_ROUNDS * 2  # the pick and the defaults each round, a start-up each
    assert one.confirm_reserve() == pytest.approx(many.confirm_reserve() - 6.0 + pairs * 6.0)
    assert one.compile_seconds() == pytest.approx(many.compile_seconds() - 6.0 + 2 * 6.0)


@pytest.mark.slow
@pytest.mark.parametrize(("text", "prep"), [(HF_SCRIPT, "150"), (LIGHTNING_SCRIPT, "60")],
                         ids=["transformers", "lightning"])
def test_autotune_on_an_input_bound_trainer_script(tmp_path, text, prep, budget_for_load):
    path = script(tmp_path, text)
    output = tmp_path / "train.tuneup.json"
    # 55 s: the loader's race (its stage needs ~42 s here), the confirmation where it fits
    budget = budget_for_load(55)
    result = CliRunner().invoke(main, [
        "autotune", str(path), "--budget", str(budget), "--only", "loader", "--format", "json",
        "--output", str(output), "--", prep])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["elapsed_s"] <= budget + 15
    assert summary["trials"][0]["status"] == "ok"
    assert all(t["status"] in ("ok", "skipped", "budget") for t in summary["trials"])
    settings = read(output)
    assert settings.measured.effective_batch_size in (16, 32)


def test_a_trainer_script_too_short_to_measure_is_told_so_not_that_it_fails(tmp_path):
    path = script(tmp_path, LIGHTNING_SCRIPT.replace("max_epochs=20", "max_steps=3"))
    result = CliRunner().invoke(main, ["autotune", str(path), "--budget", "60"])
    assert result.exit_code == 1
    assert "ended before PyTorch's defaults could be measured once" in result.output
    assert "fails" not in result.output and "Traceback" not in result.output
