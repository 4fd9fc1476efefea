"""``max_grad_norm=`` is bit-identical to the plain loop's ``clip_grad_norm_(model.parameters(),
...)``: the norm is summed in the model's parameter order, not the optimizer's group order
(weight-decay / no-decay groups, as minGPT, nanoGPT and the HF examples make them)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from tuneup import tuned_loader, tuned_loop

MAX_NORM = 0.05  # small enough that every step clips
STEPS = 12


class TinyGPT(torch.nn.Module):
    """Embedding, layer norms and linears: minGPT's kinds of parameters, several of each."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(32, 16)
        self.blocks = torch.nn.Sequential(*[
            torch.nn.Sequential(torch.nn.LayerNorm(16), torch.nn.Linear(16, 16), torch.nn.GELU())
            for _ in range(4)])
        self.head = torch.nn.Linear(16, 32)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens)))


def grouped_adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    """minGPT's configure_optimizers: linear weights decay, everything else does not; the
    decay group first, so the optimizer's order differs from ``model.parameters()``."""
    decay = [p for name, p in model.named_parameters() if name.endswith("weight")
             and p.dim() == 2 and not name.startswith("embed")]
    no_decay = [p for p in model.parameters() if all(p is not d for d in decay)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": list(reversed(no_decay)), "weight_decay": 0.0}], lr=1e-2)


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randint(0, 32, (8 * STEPS, 6), generator=generator),
                         torch.randint(0, 32, (8 * STEPS, 6), generator=generator))


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    tokens, targets = dataset().tensors
    return list(zip(tokens.split(8), targets.split(8)))


def loss_of(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch[0]).flatten(0, 1), batch[1].flatten())


def plain_run(*, micro: int | None = None, amp: torch.dtype | None = None) -> list[torch.Tensor]:
    """The plain loop the docs tell users to replace (split by hand when ``micro``)."""
    model = TinyGPT()
    optimizer = grouped_adamw(model)
    for batch in batches():
        pieces = [batch] if micro is None else list(zip(*(t.split(micro) for t in batch)))
        for piece in pieces:
            share = len(piece[0]) / len(batch[0])
            with torch.autocast("cpu", dtype=amp) if amp else contextlib.nullcontext():
                loss = loss_of(model, piece)
            (loss if micro is None else loss * share).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def tuned_run(form: str, clip_in_optimizer_order: bool = False,
              micro: int | None = None) -> list[torch.Tensor]:
    model = TinyGPT()
    optimizer = grouped_adamw(model)
    loop = tuned_loop(model, optimizer)
    named = ([p for g in optimizer.param_groups for p in g["params"]]
             if clip_in_optimizer_order else None)
    for batch in tuned_loader(dataset(), batch_size=8):  # the loader says what a micro-batch cuts
        if form == "backward":
            with loop.step():
                loss = loss_of(loop.model, batch)
            loop.backward(loss, max_grad_norm=MAX_NORM, clip_parameters=named)
        else:
            loop.train_step(batch, lambda b: loss_of(loop.model, b), max_grad_norm=MAX_NORM,
                            clip_parameters=named)
        assert loop.applied_micro_batch == micro
    return [p.detach().clone() for p in model.parameters()]


def identical(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("form", ["train_step", "backward"])
def test_clipping_is_bit_identical_to_the_plain_loop(form):
    assert identical(tuned_run(form), plain_run())


def test_the_optimizers_order_would_not_be():
    """The test can tell: summed in the optimizer's group order, the weights differ."""
    assert not identical(tuned_run("train_step", clip_in_optimizer_order=True), plain_run())


def test_micro_batches_clip_in_the_models_order(write_settings):
    write_settings(micro_batch_size=4, cpu_threads=torch.get_num_threads())
    assert identical(tuned_run("train_step", micro=4), plain_run(micro=4))


def test_autocast_clips_in_the_models_order(write_settings):
    write_settings(amp_dtype="bfloat16", cpu_threads=torch.get_num_threads())
    assert identical(tuned_run("train_step"), plain_run(amp=torch.bfloat16))


def lbfgs_run(tuned: bool, reverse: bool, max_iter: int, named: bool = False
              ) -> list[torch.Tensor]:
    """Three LBFGS steps, the plain closure clipping ``model.parameters()``, or the loop
    (naming them through a generator when ``named``); the optimizer holds the parameters
    reversed when ``reverse``."""
    model = TinyGPT()
    parameters = list(model.parameters())
    optimizer = torch.optim.LBFGS(parameters[::-1] if reverse else parameters, lr=0.1,
                                  max_iter=max_iter)
    loop = tuned_loop(model, optimizer) if tuned else None
    for batch in batches()[:3]:
        if loop is not None:
            named_parameters = {"clip_parameters": model.parameters()} if named else {}
            loop.train_step(batch, lambda b: loss_of(model, b), max_grad_norm=MAX_NORM,
                            **named_parameters)
            continue

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = loss_of(model, batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            return loss

        optimizer.step(closure)
    return [p.detach().clone() for p in model.parameters()]


def test_a_closure_optimizer_clips_in_the_models_order():
    """LBFGS re-evaluates the loss in a closure: clipping happens there, in the same order."""
    assert identical(lbfgs_run(True, reverse=True, max_iter=2),
                     lbfgs_run(False, reverse=True, max_iter=2))


def test_parameters_named_by_a_generator_are_clipped_at_every_closure_call():
    """``clip_parameters=model.parameters()`` is a generator: LBFGS calls the closure several
    times a step, and each call clips them all, as the plain closure does."""
    assert identical(lbfgs_run(True, reverse=False, max_iter=3, named=True),
                     lbfgs_run(False, reverse=False, max_iter=3))
