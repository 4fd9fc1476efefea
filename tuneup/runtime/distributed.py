"""The runtime under an initialised ``torch.distributed`` process group (DDP, torchrun).

Three things change there: each rank must read its own share of a map-style dataset, the
ranks on one machine share its cores, and the ranks must agree on the knobs (one rank in
bfloat16 and another in float32 train two different models that DDP averages).
Imported by every training run: torch and tuneup.settings only.
"""

from __future__ import annotations

import os
import socket
import sys
import weakref
from collections.abc import Iterator
from dataclasses import fields
from typing import Any

import torch.distributed as dist
from torch.utils.data import DistributedSampler, IterableDataset

from tuneup.settings import Knobs, SettingsError, store
from tuneup.settings.schema import knob_names

ENV_LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"  # set by torchrun: the ranks started on this machine
# Knobs sized for one machine's cores and memory: ranks on different kinds of node may differ
# in these (each node kind has its own settings file); all others must agree job-wide.
PER_NODE = knob_names(changes_numerics=False, changes_data_order=False)
_agreed: weakref.WeakSet[Any] = weakref.WeakSet()  # process groups whose ranks were compared


def initialised() -> bool:
    """Whether this process is one rank of an initialised default process group."""
    return dist.is_available() and dist.is_initialized()


def local_world_size() -> int:
    """The processes sharing this machine's cores: torchrun's ``LOCAL_WORLD_SIZE``, else 1."""
    try:
        return max(1, int(os.environ.get(ENV_LOCAL_WORLD_SIZE, "1")))
    except ValueError:
        return 1


class TunedDistributedSampler(DistributedSampler):
    """A DistributedSampler that moves to the next epoch by itself at each pass, so a script
    written for one process gets a new shuffle every epoch, as with ``shuffle=True``.

    A ``set_epoch`` of the script's own wins: the epoch only advances when nobody changed it
    since the previous pass.
    """

    _last_epoch: int | None = None

    def __iter__(self) -> Iterator[Any]:
        if self._last_epoch is not None and self.epoch == self._last_epoch:
            self.set_epoch(self._last_epoch + 1)
        self._last_epoch = self.epoch
        return super().__iter__()


def accelerate_runs() -> bool:
    """Whether an ``accelerate.Accelerator`` runs this process (its state is initialised)."""
    state = sys.modules.get("accelerate.state")
    is_initialized = getattr(state, "is_initialized", None)
    return bool(callable(is_initialized) and is_initialized())


def sampler_for(dataset: Any, user_kwargs: dict[str, Any]) -> TunedDistributedSampler | None:
    """The sampler that gives this rank its share of ``dataset``, or None where the user's
    arguments already decide (their sampler or batch_sampler) or there is no process group.

    An IterableDataset has no indices to share out; splitting its stream is its own code's job.
    Under accelerate, ``accelerator.prepare`` shares the batches out, as for a DataLoader.
    """
    if (not initialised() or isinstance(dataset, IterableDataset) or accelerate_runs()
            or user_kwargs.get("sampler") is not None
            or user_kwargs.get("batch_sampler") is not None):
        return None
    shuffle = bool(user_kwargs.get("shuffle"))
    generator = user_kwargs.get("generator")
    seed = generator.initial_seed() if generator is not None else 0
    sampler = TunedDistributedSampler(dataset, shuffle=shuffle, seed=seed,
                                      drop_last=bool(user_kwargs.get("drop_last")))
    if dist.get_rank() == 0:
        store.warn(f"tuned_loader gives each of the {sampler.num_replicas} ranks its own share of "
                   f"the dataset (DistributedSampler, shuffle={shuffle}, seed={seed}, next epoch "
                   "at each pass); pass sampler= to choose another")
    return sampler


def check_same_knobs(knobs: Knobs) -> None:
    """Once per process group: raise a SettingsError on every rank when the ranks apply
    different knobs (ranks reading different settings files, or one file missing on a node).

    Each rank sends a short digest (host and the knobs set) with ``all_gather_object``; all
    ranks see the same digests, so all raise or none does.
    """
    if not initialised():
        return
    group = dist.group.WORLD
    if group in _agreed:
        return
    digests: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(digests, {"host": socket.gethostname(), "knobs": knobs.changed()})
    problems = disagreements(digests)
    if problems:
        raise SettingsError(
            f"the ranks apply different tuned settings ({'; '.join(problems)}): every rank must "
            "read the same settings file (TUNEUP_SETTINGS, or <script>.tuneup.json on each node)")
    _agreed.add(group)


def disagreements(digests: list[dict[str, Any]]) -> list[str]:
    """``"knob: value on ranks ..., value on rank ..."`` for each knob ranks must share and do
    not: per-node knobs among the ranks of one host, every other knob among all ranks."""
    hosts: dict[str, list[int]] = {}
    for rank, digest in enumerate(digests):
        hosts.setdefault(digest["host"], []).append(rank)
    problems = []
    for name in (f.name for f in fields(Knobs)):
        scopes = hosts.values() if name in PER_NODE else [list(range(len(digests)))]
        for ranks in scopes:
            values: dict[str, list[int]] = {}
            for rank in ranks:
                value = digests[rank]["knobs"].get(name)
                values.setdefault("unset" if value is None else str(value), []).append(rank)
            if len(values) > 1:
                problems.append(f"{name}: " + ", ".join(
                    f"{value} on {_ranks(members)}" for value, members in values.items()))
    return problems


def _ranks(ranks: list[int]) -> str:
    """``rank 3``, ``ranks 0-3, 6``: consecutive ranks as ranges, so 64 ranks fit a line."""
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    text = ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)
    return f"rank {text}" if len(ranks) == 1 else f"ranks {text}"
