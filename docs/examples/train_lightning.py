"""A ``lightning.Trainer`` with tuneup's settings: its keyword arguments go through
``tuned_trainer_kwargs``.

A small MLP regresses a generated function of its inputs, on the CPU in a few seconds:

    python docs/examples/train_lightning.py
    tuneup settings show docs/examples/train_lightning.py --as lightning

With no ``train_lightning.tuneup.json`` beside this script (or ``TUNEUP_SETTINGS``),
``tuned_trainer_kwargs`` returns the arguments unchanged. Needs ``pip install tuneup[lightning]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tuneup.integrations.lightning import tuned_trainer_kwargs

FEATURES = 32


class Regressor(L.LightningModule):
    def __init__(self, samples: int, batch_size: int) -> None:
        super().__init__()
        self.samples, self.batch_size = samples, batch_size
        self.net = nn.Sequential(nn.Linear(FEATURES, 128), nn.ReLU(), nn.Linear(128, 1))

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(self.samples, FEATURES, generator=g)
        y = torch.sin(x[:, :4].sum(1)) + 0.1 * x[:, 4]
        # no num_workers here: tuneup's settings choose it (a value you pass is kept)
        return DataLoader(TensorDataset(x, y), batch_size=self.batch_size, shuffle=True)

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
    options = parser.parse_args()

    torch.manual_seed(0)
    model = Regressor(options.samples, options.batch_size)
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
