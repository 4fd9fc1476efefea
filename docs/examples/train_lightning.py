"""A ``lightning.Trainer`` with tuneup's settings: its keyword arguments go through
``tuned_trainer_kwargs``.

A small MLP regresses a generated function of its inputs in a few seconds (on the GPU where
there is one: Lightning's ``accelerator="auto"``):

    python docs/examples/train_lightning.py
    tuneup autotune docs/examples/train_lightning.py -- --prep 60   # input-bound: tune it
    tuneup settings show docs/examples/train_lightning.py --as lightning

With no ``train_lightning.tuneup.json`` beside this script (or ``TUNEUP_SETTINGS``),
``tuned_trainer_kwargs`` returns the arguments unchanged. ``--prep N`` stands for per-sample
work (decoding, feature extraction): each sample's target is computed N times, which makes
the job input-bound. Needs ``pip install tuneup[lightning]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from tuneup.integrations.lightning import tuned_trainer_kwargs

FEATURES = 32


class Points(Dataset):
    """Generated inputs; each target a function of its input, worked out ``prep`` times."""

    def __init__(self, samples: int, prep: int) -> None:
        self.x = torch.randn(samples, FEATURES, generator=torch.Generator().manual_seed(0))
        self.prep = prep

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.x[i]
        for _ in range(self.prep):  # the same target each pass: only the cost changes
            y = torch.sin(x[:4].sum()) + 0.1 * x[4]
        return x, y


class Regressor(L.LightningModule):
    def __init__(self, samples: int, batch_size: int, prep: int = 1) -> None:
        super().__init__()
        self.samples, self.batch_size, self.prep = samples, batch_size, prep
        self.net = nn.Sequential(nn.Linear(FEATURES, 128), nn.ReLU(), nn.Linear(128, 1))

    def train_dataloader(self) -> DataLoader:
        # no num_workers here: tuneup's settings choose it (a value you pass is kept)
        return DataLoader(Points(self.samples, self.prep), batch_size=self.batch_size,
                          shuffle=True)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x).squeeze(-1).float(), y)
        self.log("loss", loss, prog_bar=False)
        return loss

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--prep", type=int, default=1,
                        help="passes of per-sample work (60: input-bound on 2 cores)")
    options = parser.parse_args()

    torch.manual_seed(0)
    model = Regressor(options.samples, options.batch_size, options.prep)
    with tempfile.TemporaryDirectory() as root:
        trainer = L.Trainer(**tuned_trainer_kwargs(  # the one change tuneup asks for
            max_epochs=options.epochs, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, default_root_dir=root))
        start = time.perf_counter()
        trainer.fit(model)
    seconds = time.perf_counter() - start
    print(f"steps {trainer.global_step}  final loss {float(trainer.callback_metrics['loss']):.3f}  "
          f"{options.samples * options.epochs / seconds:.0f} samples/s")


if __name__ == "__main__":
    main()
