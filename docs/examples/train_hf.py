"""A transformers ``Trainer`` with tuneup's settings: one line after the Trainer is built.

A tiny GPT-2 built from a config (no download) learns generated token sequences whose
next token follows from the previous one, in a few seconds (on the GPU where there is
one: ``use_cpu`` only without one):

    python docs/examples/train_hf.py
    tuneup autotune docs/examples/train_hf.py -- --prep 40   # input-bound: tune it
    tuneup settings show docs/examples/train_hf.py --as hf     # the same, to paste instead

``--prep N`` stands for per-sample work in Python (parsing, tokenising text on the fly):
each sample's tokens are worked out N times, which makes the job input-bound.

With no ``train_hf.tuneup.json`` beside this script (or ``TUNEUP_SETTINGS``),
``tuned_trainer`` returns the Trainer unchanged. Needs ``pip install tuneup[hf]``.
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from tuneup.integrations.transformers import tuned_trainer

VOCAB, LENGTH = 64, 32


class Sequences(torch.utils.data.Dataset):
    """Token i+1 = (3 × token i + 1) mod VOCAB from a random start: learnable, generated."""

    def __init__(self, size: int, prep: int = 1) -> None:
        self.starts = torch.randint(0, VOCAB, (size,), generator=torch.Generator().manual_seed(0))
        self.prep = prep

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        for _ in range(self.prep):  # the same tokens each pass: only the cost changes
            tokens = [int(self.starts[i])]
            for _ in range(LENGTH - 1):
                tokens.append((3 * tokens[-1] + 1) % VOCAB)
        ids = torch.tensor(tokens)
        return {"input_ids": ids, "labels": ids.clone()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--prep", type=int, default=1,
                        help="passes of per-sample Python work (40: input-bound on 2 cores)")
    options = parser.parse_args()

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=64,
                                       n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0))
    with tempfile.TemporaryDirectory() as output_dir:
        args = TrainingArguments(
            output_dir=output_dir, per_device_train_batch_size=options.batch_size,
            num_train_epochs=options.epochs, learning_rate=3e-3, warmup_steps=4,
            logging_steps=8, save_strategy="no", report_to=[], disable_tqdm=True,
            use_cpu=not torch.cuda.is_available())
        trainer = Trainer(model=model, args=args, train_dataset=Sequences(options.samples, options.prep))
        trainer = tuned_trainer(trainer)  # the one line tuneup adds
        result = trainer.train()
    print(f"steps {result.global_step}  final loss {result.training_loss:.3f}  "
          f"{result.metrics['train_samples_per_second']:.0f} samples/s")


if __name__ == "__main__":
    main()
