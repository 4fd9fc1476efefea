"""What the loop reads of an accelerator it is given: its own AMP, and whether its backward
also steps the optimizer (DeepSpeed), where a micro-batch would step once per piece."""

from __future__ import annotations

import enum

import torch
from torch.utils.data import TensorDataset

from tuneup import tuned_loader, tuned_loop
from tuneup.runtime.accelerator import amp_refused, steps_in_backward


class Kind(enum.Enum):  # accelerate's DistributedType, as far as the loop reads it
    NO = "NO"
    DEEPSPEED = "DEEPSPEED"


class Accelerator:
    """The attributes and calls of ``accelerate.Accelerator`` the loop uses."""

    sync_gradients = True
    mixed_precision = "no"

    def __init__(self, kind: Kind) -> None:
        self.distributed_type, self.backwards = kind, 0

    def backward(self, loss: torch.Tensor) -> None:
        self.backwards += 1
        loss.backward()


def test_deepspeed_steps_in_backward_and_others_do_not():
    assert steps_in_backward(Accelerator(Kind.DEEPSPEED))
    assert not steps_in_backward(Accelerator(Kind.NO)) and not steps_in_backward(None)


def test_a_micro_batch_is_not_split_under_deepspeed(write_settings):
    write_settings(micro_batch_size=2, cpu_threads=torch.get_num_threads())
    for kind, backwards in ((Kind.NO, 4), (Kind.DEEPSPEED, 1)):
        model = torch.nn.Linear(4, 1)
        accelerator = Accelerator(kind)
        loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1),
                          accelerator=accelerator)
        loader = tuned_loader(TensorDataset(torch.randn(8, 4)), batch_size=8, loop=loop)
        for batch in loader:
            loop.train_step(batch, lambda b: loop.model(b[0]).square().mean())
        assert accelerator.backwards == backwards
    assert "DeepSpeed" in loop.micro_batch_blocked


def test_the_accelerators_mixed_precision_decides_amp():
    mixed = Accelerator(Kind.NO)
    mixed.mixed_precision = "bf16"
    assert "mixed_precision='bf16'" in amp_refused(mixed, None)
    assert amp_refused(Accelerator(Kind.NO), None) is None
    assert amp_refused(None, object()) is None
