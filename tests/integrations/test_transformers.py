"""tuned_trainer on a real transformers Trainer: tiny models built from a config, data in
memory, CPU only. The knobs must reach the Trainer's state (not only its arguments), leave
its data order, step count and LR schedule alone, and never override the user's values."""

from __future__ import annotations

import dataclasses
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")
from accelerate.state import AcceleratorState  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

from tuneup.integrations.transformers import tuned_trainer  # noqa: E402
from tuneup.settings import TuneupWarning  # noqa: E402

VOCAB, LENGTH = 32, 8


@pytest.fixture(autouse=True)
def fresh_accelerator() -> Any:
    """Accelerate keeps mixed precision in a process-wide singleton; each test starts bare."""
    AcceleratorState._reset_state()
    yield
    AcceleratorState._reset_state()


class Tokens(torch.utils.data.Dataset):
    """Sample i starts with token i, so the first tokens a model sees give the data order."""

    def __init__(self, size: int = 16) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        tokens = torch.randint(0, VOCAB, (LENGTH,), generator=torch.Generator().manual_seed(i))
        tokens[0] = i
        return {"input_ids": tokens, "labels": tokens.clone()}


class Regression(nn.Module):
    """A model of one's own: returns the mean loss, no loss keywords (the Trainer divides
    each piece's loss by the number of pieces)."""

    def __init__(self, norm: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 8)
        self.norm = nn.BatchNorm1d(8) if norm else nn.Identity()
        self.head = nn.Linear(8, 1)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        prediction = self.head(self.norm(self.embed(input_ids).mean(1))).squeeze(-1)
        return {"loss": nn.functional.mse_loss(prediction, labels.float().mean(1) / VOCAB)}


class MeanLossWithKeywords(Regression):
    """Accepts loss keywords but ignores num_items_in_batch: the Trainer would not scale it."""

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor,  # type: ignore[override]
                **kwargs: Any) -> dict[str, torch.Tensor]:
        return super().forward(input_ids, labels)


def gpt2(dropout: float = 0.1) -> GPT2LMHeadModel:
    """Dropout draws from torch's generator: the same losses with it prove the same draws."""
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(
        vocab_size=VOCAB, n_positions=LENGTH, n_embd=16, n_layer=1, n_head=2, bos_token_id=0,
        eos_token_id=0, resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout))


def gpt2_without_dropout() -> GPT2LMHeadModel:
    """Pieces draw other dropout masks than their batch: a micro-batch compares without."""
    return gpt2(dropout=0.0)


def arguments(tmp_path: Path, **overrides: Any) -> TrainingArguments:
    values = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
                  use_cpu=True, report_to=[], max_steps=6, save_strategy="no",
                  logging_steps=1, disable_tqdm=True, seed=0, learning_rate=1e-2,
                  warmup_steps=2, lr_scheduler_type="linear")
    return TrainingArguments(**{**values, **overrides})


def trainer_for(tmp_path: Path, model: nn.Module | None = None, size: int = 16,
                **overrides: Any) -> Trainer:
    return Trainer(model=model if model is not None else gpt2(),
                   args=arguments(tmp_path, **overrides), train_dataset=Tokens(size))


def trained(trainer: Trainer) -> dict[str, Any]:
    """Train, recording what the model saw: the first token of each sample (the order), the
    batch shapes, and the dtype autocast gave the forward."""
    seen: dict[str, list] = {"order": [], "rows": [], "dtypes": []}

    def record(module: nn.Module, args: tuple, kwargs: dict) -> None:
        seen["order"].extend(kwargs["input_ids"][:, 0].tolist())
        seen["rows"].append(len(kwargs["input_ids"]))

    def dtype(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        seen["dtypes"].append(output.dtype)  # inside accelerate's autocast, unlike a pre-hook

    linear = next(m for m in trainer.model.modules() if isinstance(m, nn.Linear))
    handles = [trainer.model.register_forward_pre_hook(record, with_kwargs=True),
               linear.register_forward_hook(dtype)]
    try:
        trainer.train()
    finally:
        for handle in handles:
            handle.remove()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    return {**seen, "losses": [entry["loss"] for entry in logs],
            "lrs": [entry["learning_rate"] for entry in logs],
            "steps": trainer.state.global_step,
            "params": [p.detach().clone() for p in trainer.model.parameters()]}


def test_without_a_settings_file_the_trainer_is_untouched(tmp_path):
    trainer = trainer_for(tmp_path)
    args, accelerator = trainer.args, trainer.accelerator
    with warnings.catch_warnings():
        warnings.simplefilter("error", TuneupWarning)
        assert tuned_trainer(trainer) is trainer
    assert trainer.args is args and trainer.accelerator is accelerator


def test_knobs_reach_the_arguments_and_the_state_the_trainer_built(tmp_path, write_settings):
    write_settings(num_workers=2, prefetch_factor=4, persistent_workers=True,
                   amp_dtype="bfloat16", micro_batch_size=2, compile_mode="default",
                   cpu_threads=1, pin_memory=True)
    trainer = tuned_trainer(trainer_for(tmp_path))
    args = trainer.args
    assert (args.dataloader_num_workers, args.dataloader_prefetch_factor,
            args.dataloader_persistent_workers) == (2, 4, False)  # they would change draws
    assert args.dataloader_pin_memory is False  # batches stay on the CPU: nothing to pin
    assert (args.bf16, args.mixed_precision) == (True, "bf16")
    assert (args.torch_compile, args.torch_compile_mode, args.torch_compile_backend) == (
        True, "default", "inductor")
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (2, 2)
    assert trainer._train_batch_size == 2
    assert trainer.accelerator.mixed_precision == "bf16"
    assert trainer.accelerator.state.dynamo_plugin.mode == "default"
    assert torch.get_num_threads() == 1


def test_workers_and_prefetch_change_no_loss_no_order_no_schedule(tmp_path, write_settings):
    plain = trained(trainer_for(tmp_path, max_steps=8))  # two epochs of four batches
    write_settings(num_workers=2, prefetch_factor=4, pin_memory=True)
    trainer = tuned_trainer(trainer_for(tmp_path, max_steps=8))
    assert trainer.args.dataloader_num_workers == 2
    tuned = trained(trainer)
    assert tuned["order"] == plain["order"] and sorted(plain["order"][:16]) == list(range(16))
    assert tuned["losses"] == plain["losses"]
    assert tuned["lrs"] == plain["lrs"] and tuned["steps"] == plain["steps"] == 8


def test_amp_takes_effect_in_the_forward_and_keeps_order_and_schedule(tmp_path, write_settings):
    plain = trained(trainer_for(tmp_path, max_steps=4))
    write_settings(amp_dtype="bfloat16")
    tuned = trained(tuned_trainer(trainer_for(tmp_path, max_steps=4)))
    assert set(tuned["dtypes"]) == {torch.bfloat16} and set(plain["dtypes"]) == {torch.float32}
    assert tuned["order"] == plain["order"]
    assert tuned["lrs"] == plain["lrs"] and tuned["steps"] == plain["steps"] == 4
    assert tuned["losses"] == pytest.approx(plain["losses"], rel=2e-2)  # bfloat16 rounding


@pytest.mark.parametrize("model", [gpt2_without_dropout, Regression],
                         ids=["token-sum-loss", "mean-loss"])
def test_micro_batch_keeps_the_effective_batch_the_order_and_the_schedule(
        tmp_path, write_settings, model):
    plain = trained(trainer_for(tmp_path, model()))
    write_settings(micro_batch_size=2)
    tuned = trained(tuned_trainer(trainer_for(tmp_path, model())))
    assert set(tuned["rows"]) == {2} and set(plain["rows"]) == {4}
    assert tuned["order"] == plain["order"]
    assert tuned["steps"] == plain["steps"] == 6 and tuned["lrs"] == plain["lrs"]
    assert tuned["losses"] == pytest.approx(plain["losses"], rel=1e-4)
    for mine, theirs in zip(tuned["params"], plain["params"]):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("model", "size", "micro", "reason"), [
    (lambda: Regression(norm=True), 16, 2, "BatchNorm1d 'norm' normalises"),
    (MeanLossWithKeywords, 16, 2, "cannot tell that its loss divides"),
    (Regression, 15, 2, "unequal pieces"),
    (Regression, 16, 3, "does not divide the batch of 4 exactly"),
])
def test_a_micro_batch_that_would_change_the_gradient_is_skipped_with_one_warning(
        tmp_path, write_settings, model, size, micro, reason):
    write_settings(micro_batch_size=micro, num_workers=1)
    with pytest.warns(TuneupWarning, match=reason) as caught:
        trainer = tuned_trainer(trainer_for(tmp_path, model(), size=size))
    assert len(caught) == 1
    assert (trainer.args.per_device_train_batch_size,
            trainer.args.gradient_accumulation_steps, trainer._train_batch_size) == (4, 1, 4)
    assert trainer.args.dataloader_num_workers == 1  # the rest still applies


def test_values_the_user_set_are_kept_with_one_warning(tmp_path, write_settings):
    write_settings(num_workers=2, prefetch_factor=4, amp_dtype="bfloat16", compile_mode="default")
    trainer = trainer_for(tmp_path, dataloader_num_workers=1, fp16=False, bf16=False,
                          torch_compile=True, torch_compile_mode="reduce-overhead")
    with pytest.warns(TuneupWarning, match=r"kept your TrainingArguments "
                      r"dataloader_num_workers=1, torch_compile=True, "
                      r"torch_compile_mode='reduce-overhead'") as caught:
        tuned_trainer(trainer)
    assert len(caught) == 1
    args = trainer.args
    assert (args.dataloader_num_workers, args.dataloader_prefetch_factor) == (1, 4)
    assert args.torch_compile_mode == "reduce-overhead"
    assert args.bf16 is True  # bf16=False is the field's default: not a choice tuneup can see


def test_a_user_value_equal_to_the_settings_is_kept_without_a_word(tmp_path, write_settings):
    write_settings(amp_dtype="bfloat16", num_workers=2)
    trainer = trainer_for(tmp_path, bf16=True, dataloader_num_workers=2)
    args, accelerator = trainer.args, trainer.accelerator
    with warnings.catch_warnings():
        warnings.simplefilter("error", TuneupWarning)
        tuned_trainer(trainer)
    assert trainer.args is args and trainer.accelerator is accelerator


def test_float16_on_the_cpu_is_left_out_with_one_warning(tmp_path, write_settings):
    write_settings(amp_dtype="float16")
    trainer = trainer_for(tmp_path)
    with pytest.warns(TuneupWarning, match="float16 autocast is not used on the CPU"):
        tuned_trainer(trainer)
    assert (trainer.args.fp16, trainer.accelerator.mixed_precision) == (False, "no")


def test_the_users_arguments_object_is_not_mutated(tmp_path, write_settings):
    write_settings(num_workers=2)
    trainer = trainer_for(tmp_path)
    before = dataclasses.asdict(trainer.args)
    users = trainer.args
    tuned_trainer(trainer)
    assert dataclasses.asdict(users) == before


def test_a_missing_library_is_one_line_naming_the_extra(monkeypatch, write_settings):
    write_settings(num_workers=2)
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match=r"pip install tuneup\[hf\]"):
        tuned_trainer(object())  # type: ignore[arg-type]


@pytest.fixture
def no_bf16_gpu(no_gpu, monkeypatch):
    """No GPU, as transformers' own checks see it too (it caches their answers per process)."""
    import transformers.training_args as training_args

    monkeypatch.setattr(training_args, "is_torch_bf16_gpu_available", lambda: False)
    monkeypatch.setattr(training_args, "is_torch_cuda_available", lambda: False)


def test_amp_that_training_arguments_refuse_is_dropped_and_the_rest_applies(
        tmp_path, write_settings, no_bf16_gpu):
    write_settings(amp_dtype="bfloat16", num_workers=1)
    trainer = trainer_for(tmp_path, use_cpu=False)  # bf16 then needs a GPU, says transformers
    with pytest.warns(TuneupWarning, match="TrainingArguments refused bf16=True"):
        tuned_trainer(trainer)
    assert (trainer.args.bf16, trainer.args.dataloader_num_workers) == (False, 1)


def test_tuneup_disable_leaves_the_trainer_alone(tmp_path, write_settings, monkeypatch):
    write_settings(num_workers=2, amp_dtype="bfloat16")
    monkeypatch.setenv("TUNEUP_DISABLE", "1")
    trainer = trainer_for(tmp_path)
    args = trainer.args
    assert tuned_trainer(trainer).args is args


class Stream(torch.utils.data.IterableDataset):
    """A stream that does not split itself among workers: each would yield all of it."""

    def __iter__(self) -> Any:
        for i in range(64):
            yield Tokens(64)[i]


def test_persistent_workers_are_not_applied_they_would_change_dropout(tmp_path, write_settings):
    # a new loader iterator draws its workers' seed from torch's generator at each epoch;
    # persistent workers skip that draw, and dropout's draws after it move
    plain = trained(trainer_for(tmp_path, max_steps=8))  # two epochs, dropout on
    write_settings(num_workers=2, persistent_workers=True)
    trainer = tuned_trainer(trainer_for(tmp_path, max_steps=8))
    assert (trainer.args.dataloader_num_workers,
            trainer.args.dataloader_persistent_workers) == (2, False)
    assert trained(trainer)["losses"] == plain["losses"]


def test_workers_are_not_given_to_an_iterable_dataset(tmp_path, write_settings):
    write_settings(num_workers=2, prefetch_factor=4, amp_dtype="bfloat16")
    trainer = Trainer(model=gpt2(), args=arguments(tmp_path), train_dataset=Stream())
    with pytest.warns(TuneupWarning, match="num_workers=2 .* IterableDataset"):
        tuned_trainer(trainer)
    assert (trainer.args.dataloader_num_workers, trainer.args.bf16) == (0, True)
    from tuneup.integrations.transformers import _fixed_reasons
    assert "IterableDataset" in _fixed_reasons(trainer)["num_workers"]


def test_bf16_that_training_arguments_would_refuse_is_not_tuned(tmp_path, no_bf16_gpu):
    from tuneup.integrations.transformers import _fixed_reasons
    reasons = _fixed_reasons(trainer_for(tmp_path, use_cpu=False))
    assert "use_cpu=True" in reasons["amp_dtype"]
    assert "amp_dtype" not in _fixed_reasons(trainer_for(tmp_path))  # use_cpu=True: it can


def test_an_autotune_trial_saves_no_checkpoint(tmp_path):
    from tuneup.runtime import hooks

    class Trial(hooks.Observer):
        steps = 0

        def trainer_knobs(self, run: Any, knobs: Any) -> Any:
            run.saves = False  # as autotune's trial says
            return knobs

        def trainer_step(self, run: Any, loss: Any) -> None:
            Trial.steps += 1

    remove = hooks.install(Trial())
    try:
        # "best" decides saving after every callback has run: only the arguments can stop it
        args = arguments(tmp_path, save_strategy="best", eval_strategy="steps", eval_steps=2,
                         metric_for_best_model="loss", load_best_model_at_end=True, max_steps=4)
        trainer = tuned_trainer(Trainer(model=gpt2(), args=args, train_dataset=Tokens(16),
                                        eval_dataset=Tokens(8)))
        trainer.train()
    finally:
        remove()
    assert Trial.steps == 4
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def bert_masked_lm() -> nn.Module:
    """Takes ``**kwargs`` (so the Trainer leaves scaling for accumulation to it) and has the
    default ``loss_function``, but its forward computes its own mean cross-entropy."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    return BertForMaskedLM(BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=LENGTH, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0))


class OwnLoss(Trainer):
    """A subclass with its own mean loss: pieces would each count as a whole batch."""

    def compute_loss(self, model: nn.Module, inputs: dict, return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        outputs = model(input_ids=inputs["input_ids"])
        loss = nn.functional.cross_entropy(outputs.logits[:, :-1].flatten(0, 1),
                                           inputs["labels"][:, 1:].flatten())
        return (loss, outputs) if return_outputs else loss


@pytest.mark.parametrize("make", [
    lambda tmp_path: trainer_for(tmp_path, bert_masked_lm()),
    lambda tmp_path: OwnLoss(model=gpt2_without_dropout(), args=arguments(tmp_path),
                             train_dataset=Tokens(16)),
], ids=["model-with-its-own-mean-loss", "trainer-with-its-own-loss"])
def test_a_loss_not_divided_by_the_item_count_is_not_split(tmp_path, write_settings, make):
    # the Trainer would not divide these losses by the pieces: each step's gradient would
    # grow with the number of pieces (and gradient clipping would cut it)
    write_settings(micro_batch_size=2)
    with pytest.warns(TuneupWarning, match="micro_batch_size=2 .* not applied"):
        trainer = tuned_trainer(make(tmp_path))
    assert (trainer.args.per_device_train_batch_size,
            trainer.args.gradient_accumulation_steps) == (4, 1)


def test_label_smoothing_divides_by_the_item_count_and_is_split_exactly(
        tmp_path, write_settings):
    plain = trained(trainer_for(tmp_path, bert_masked_lm(), label_smoothing_factor=0.1))
    write_settings(micro_batch_size=2)
    tuned = trained(tuned_trainer(trainer_for(tmp_path, bert_masked_lm(),
                                              label_smoothing_factor=0.1)))
    assert set(tuned["rows"]) == {2} and tuned["steps"] == plain["steps"] == 6
    assert tuned["lrs"] == plain["lrs"]
    assert tuned["losses"] == pytest.approx(plain["losses"], rel=1e-4)


@pytest.mark.parametrize(("size", "applied"), [(14, False), (13, True)])
def test_drop_last_drops_whole_batches_under_a_micro_batch(tmp_path, write_settings, size,
                                                           applied):
    # batches of 4 with drop_last drop what is left after the last whole batch (2 or 1
    # samples here); pieces of 2 would keep a left-over pair as an extra optimizer step
    plain = trained(trainer_for(tmp_path, gpt2_without_dropout(), size=size, max_steps=-1,
                                num_train_epochs=2, dataloader_drop_last=True))
    write_settings(micro_batch_size=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TuneupWarning)
        trainer = tuned_trainer(trainer_for(tmp_path, gpt2_without_dropout(), size=size,
                                            max_steps=-1, num_train_epochs=2,
                                            dataloader_drop_last=True))
    said = [str(w.message) for w in caught if issubclass(w.category, TuneupWarning)]
    assert (trainer.args.per_device_train_batch_size == 2) is applied
    assert said == ([] if applied else [said[0]]) and (applied or "drop_last" in said[0])
    tuned = trained(trainer)
    assert tuned["steps"] == plain["steps"] == 6 and tuned["lrs"] == plain["lrs"]
    assert sum(tuned["rows"]) == sum(plain["rows"]) == 24
    assert tuned["losses"] == pytest.approx(plain["losses"], rel=1e-4)


def test_batch_rebalance_pieces_of_unequal_size_are_not_split_for_a_mean_loss(
        tmp_path, write_settings):
    # BatchRebalanceSampler sizes each piece by its lengths; the Trainer weighs pieces equally
    write_settings(micro_batch_size=2)
    with pytest.warns(TuneupWarning, match="batch_rebalance"):
        trainer = tuned_trainer(trainer_for(tmp_path, Regression(),
                                            train_sampling_strategy="batch_rebalance"))
    assert (trainer.args.per_device_train_batch_size,
            trainer.args.gradient_accumulation_steps) == (4, 1)
