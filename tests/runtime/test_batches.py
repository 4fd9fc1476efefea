"""Splitting nested batches into micro-batches and moving them to the loop's device."""

from __future__ import annotations

import pytest
import torch
from runtime_helpers import make_dataset

from tuneup import tuned_loader, tuned_loop
from tuneup.runtime.batches import UnsplittableBatch, batch_size_of, move_to, split_batch


def test_uneven_split_of_a_nested_batch():
    batch = {"x": torch.arange(7), "pair": (torch.zeros(7, 2), ["a", "b", "c", "d", "e", "f", "g"])}
    parts = split_batch(batch, 3)
    assert [batch_size_of(p) for p in parts] == [3, 3, 1]
    assert parts[2]["pair"][1] == ["g"] and isinstance(parts[0]["pair"], tuple)
    assert parts[1]["x"].data_ptr() == batch["x"][3:].data_ptr()  # views, not copies


@pytest.mark.parametrize(("batch", "reason"), [
    ((torch.zeros(4, 2), torch.zeros(3)), r"shape \(3,\) does not have the batch's 4 rows"),
    ((torch.zeros(4, 2), torch.tensor(1.0)), r"shape \(\) does not have"),
    ((torch.zeros(4, 2), object()), "holds a object"),
    (["only", "strings"], "no tensor"),
])
def test_unsplittable_batches_say_why(batch, reason):
    with pytest.raises(UnsplittableBatch, match=reason):
        split_batch(batch, 2)


def test_move_keeps_structure_and_plain_values():
    batch = {"x": torch.ones(2), "meta": ("id", 3)}
    moved = move_to(batch, torch.device("meta"), non_blocking=False)
    assert moved["x"].device.type == "meta" and moved["meta"] == ("id", 3)


def test_batches_arrive_on_the_loops_device():
    model = torch.nn.Linear(8, 2).to("meta")
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert loop.device.type == "meta"
    x, y = next(iter(tuned_loader(make_dataset(), batch_size=16, loop=loop)))
    assert x.device.type == y.device.type == "meta" and x.shape == (16, 8)


def test_a_batchs_shape_is_its_tensors_past_the_batch_dimension():
    """cudnn_benchmark searches once a shape: the trial child counts the shapes a window
    sees (a tokenizer's BatchEncoding is a Mapping, not a dict)."""
    from collections import UserDict

    from tuneup.runtime.batches import batch_shape

    batch = {"x": torch.zeros(4, 3, 8, 8), "y": [torch.zeros(4), "label"]}
    assert batch_shape(batch) == ((3, 8, 8), ())
    assert batch_shape(UserDict(input_ids=torch.zeros(4, 17))) == ((17,),)
    assert batch_shape((torch.zeros(2, 5),)) != batch_shape((torch.zeros(2, 7),))
    assert batch_shape(torch.zeros(32, 5)) == batch_shape(torch.zeros(8, 5))  # a last batch
    assert batch_shape("no tensors") == ()
