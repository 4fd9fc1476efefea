"""Nested batches: how many samples they hold, splitting them into micro-batches, moving them.

Which dimension holds the samples is never guessed: a batch is split only when its first
dimension equals the sample count the ``tuned_loader`` that yielded it expects (the
loader notes it with :func:`note_expected`). A sequence-first ``(T, B)`` batch, a packed
batch or one made outside a tuned loader is trained whole.

A batch is what a DataLoader yields: a tensor, or a tuple / list / namedtuple / mapping of
batches. A list or tuple of plain values (``str``, ``int``, ...) as long as the batch is
per-sample data (what ``default_collate`` makes of strings) and is sliced like a tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

_PLAIN = (str, bytes, int, float, bool, type(None))


class UnsplittableBatch(ValueError):
    """The batch holds something that cannot be cut into micro-batches; says what."""


_expected: int | None = None  # samples in the batch a tuned_loader yielded last


def note_expected(samples: int | None) -> None:
    """The sample count of the batch a tuned loader is about to yield (None: unknown)."""
    global _expected
    _expected = samples


def split_plan(batch: Any, size: int) -> list[tuple[Any, float]]:
    """``batch`` cut into pieces of ``size`` samples, each with its share of the samples.

    Raises :class:`UnsplittableBatch`, saying why, unless the batch's first dimension is
    the one its loader counted samples in.
    """
    expected = _expected
    if expected is None:
        raise UnsplittableBatch("the batch does not come from a tuned_loader with a batch "
                                "size, so which dimension holds the samples is unknown")
    total = batch_size_of(batch)
    if total != expected:
        raise UnsplittableBatch(
            f"its first dimension ({total}) is not the loader's {expected} samples "
            "(sequence-first or packed batches are not split)")
    if size >= total:
        return [(batch, 1.0)]
    parts = split_batch(batch, size)
    return [(part, min(size, total - index * size) / total) for index, part in enumerate(parts)]


def batch_size_of(batch: Any) -> int | None:
    """Samples in ``batch``: the first dimension of its first tensor (None if it has none)."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() else None
    children = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(batch, (Mapping, list, tuple)):
        for child in children:
            size = batch_size_of(child)
            if size is not None:
                return size
    return None


def batch_shape(batch: Any) -> tuple[tuple[int, ...], ...]:
    """The shapes of ``batch``'s tensors past their first, batch dimension: cuDNN's
    autotuner (``cudnn_benchmark``) searches its algorithms once for each new shape, so
    batches that keep changing here (variable-length sequences, image sizes) pay it step
    after step, while an epoch's last, shorter batch does not count."""
    if isinstance(batch, torch.Tensor):
        return (tuple(batch.shape[1:]),)
    if not isinstance(batch, (Mapping, list, tuple)):
        return ()
    children = batch.values() if isinstance(batch, Mapping) else batch
    return tuple(shape for child in children for shape in batch_shape(child))


def split_batch(batch: Any, size: int) -> list[Any]:
    """Cut ``batch`` along its first dimension into pieces of ``size`` (the last may be smaller).

    Raises :class:`UnsplittableBatch` when a part of the batch is not per-sample data.
    """
    total = batch_size_of(batch)
    if total is None:
        raise UnsplittableBatch("it holds no tensor with a batch dimension")
    count = -(-total // size)
    return _split(batch, size, total, count)


def _split(batch: Any, size: int, total: int, count: int) -> list[Any]:
    if isinstance(batch, torch.Tensor):
        if batch.dim() == 0 or batch.shape[0] != total:
            raise UnsplittableBatch(
                f"a tensor of shape {tuple(batch.shape)} does not have the batch's {total} rows")
        return list(batch.split(size))
    if isinstance(batch, Mapping):
        parts = {key: _split(value, size, total, count) for key, value in batch.items()}
        return [_rebuild_mapping(batch, {k: v[i] for k, v in parts.items()}) for i in range(count)]
    if isinstance(batch, (list, tuple)):
        if len(batch) == total and all(isinstance(item, _PLAIN) for item in batch):
            return [_rebuild_sequence(batch, batch[i * size:(i + 1) * size]) for i in range(count)]
        fields = [_split(item, size, total, count) for item in batch]
        return [_rebuild_sequence(batch, [f[i] for f in fields]) for i in range(count)]
    raise UnsplittableBatch(f"it holds a {type(batch).__name__}, which has no batch dimension")


def move_to(batch: Any, device: torch.device, non_blocking: bool) -> Any:
    """``batch`` with every tensor on ``device``; other values are kept as they are."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        return _rebuild_mapping(batch, {k: move_to(v, device, non_blocking) for k, v in batch.items()})
    if isinstance(batch, (list, tuple)):
        return _rebuild_sequence(batch, [move_to(v, device, non_blocking) for v in batch])
    return batch


def _rebuild_mapping(original: Mapping, items: dict[str, Any]) -> Any:
    try:
        return type(original)(items)
    except TypeError:
        return items


def _rebuild_sequence(original: list | tuple, items: list[Any]) -> Any:
    if isinstance(original, tuple) and hasattr(original, "_fields"):
        return type(original)(*items)
    return type(original)(items) if isinstance(original, tuple) else list(items)
