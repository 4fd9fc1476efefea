"""What a trial child reads of its batches (tuneup/autotune/child_facts.py)."""

from __future__ import annotations

import torch

from tuneup.autotune.child_facts import batch_shape


def test_a_batchs_shape_is_its_tensors_past_the_batch_dimension():
    """cudnn_benchmark searches once a shape: the child counts the shapes a window sees."""
    batch = {"x": torch.zeros(4, 3, 8, 8), "y": [torch.zeros(4), "label"]}
    assert batch_shape(batch) == ((3, 8, 8), ())
    assert batch_shape((torch.zeros(2, 5),)) != batch_shape((torch.zeros(2, 7),))
    assert batch_shape(torch.zeros(32, 5)) == batch_shape(torch.zeros(8, 5))  # a last batch
    assert batch_shape("no tensors") == ()
