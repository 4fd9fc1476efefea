"""``TunedLoop.micro_batch_blocker()``: why no micro-batch could apply, as the script drives
the loop, before any micro-batch is set (autotune reports it from the baseline on)."""

from __future__ import annotations

import torch

from tuneup import tuned_loop


def test_the_plain_form_a_closure_and_batchnorm_each_block_with_their_reason():
    model = torch.nn.Linear(4, 1)
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert loop.micro_batch_blocker() is None
    loop.train_step(torch.randn(8, 4), lambda b: loop.model(b).square().mean())
    assert loop.micro_batch_blocker() is None  # train_step: pieces could split it
    loop.backward(loop.model(torch.randn(8, 4)).square().mean())
    assert "outside loop.train_step" in loop.micro_batch_blocker()

    closure = tuned_loop(model, torch.optim.LBFGS(model.parameters()))
    assert "LBFGS steps with a closure" == closure.micro_batch_blocker()

    normed = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    batch_norm = tuned_loop(normed, torch.optim.SGD(normed.parameters(), lr=0.1))
    assert "BatchNorm" in batch_norm.micro_batch_blocker()
