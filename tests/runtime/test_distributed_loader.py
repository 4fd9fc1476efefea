"""tuned_loader and tuned_loop under an initialised process group (2 ranks on gloo).

The two ranks are spawned once for the module (starting them costs most of the time): each
runs every scenario below in a process group of its own and saves what it saw; each test
reads one scenario's results.
"""

from __future__ import annotations

import math
import os
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from runtime_helpers import make_model
from torch.utils.data import Dataset, DistributedSampler, SequentialSampler

from tuneup import tuned_loader, tuned_loop
from tuneup.runtime import apply
from tuneup.settings import Knobs, Settings, SettingsError, TuneupWarning, save

WORLD = 2
SAMPLES = 22  # a multiple of the ranks, not of the batch
BATCH = 4


class Indexed(Dataset):
    """Sample i is the number i: a batch says which samples it holds."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> int:
        return index


def _passes(loader: Any, epochs: int) -> list[list[int]]:
    return [[i for batch in loader for i in batch.tolist()] for _ in range(epochs)]


def _plain(seed: int, epoch: int, rank: int, shuffle: bool = True) -> list[int]:
    sampler = DistributedSampler(Indexed(), WORLD, rank, shuffle=shuffle, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


def _shares(rank: int, work: Path) -> dict[str, Any]:
    loader = tuned_loader(Indexed(), batch_size=BATCH, shuffle=True)
    seeded = tuned_loader(Indexed(), batch_size=BATCH, shuffle=True,
                          generator=torch.Generator().manual_seed(1234))
    resumed = tuned_loader(Indexed(), batch_size=BATCH, shuffle=True)
    resumed.sampler.set_epoch(5)  # the script's own set_epoch wins
    return {"epochs": _passes(loader, 3), "plain": [_plain(0, e, rank) for e in range(3)],
            "seeded": _passes(seeded, 1)[0], "plain_seeded": _plain(1234, 0, rank),
            "resumed": _passes(resumed, 2), "plain_resumed": [_plain(0, 5, rank),
                                                              _plain(0, 6, rank)],
            "in_order": _passes(tuned_loader(Indexed(), batch_size=BATCH), 1)[0],
            "plain_in_order": _plain(0, 0, rank, shuffle=False),
            "len": len(loader), "inner_len": len(loader.dataloader),
            "sampler": type(loader.sampler)}


def _user_sampler(rank: int, work: Path) -> dict[str, Any]:
    mine = SequentialSampler(Indexed())
    loader = tuned_loader(Indexed(), batch_size=BATCH, sampler=mine)
    return {"kept": loader.sampler is mine, "seen": _passes(loader, 1)[0]}


def _workers(rank: int, work: Path) -> dict[str, Any]:
    cores = apply.usable_cores()
    _use_settings(work / f"big.{rank}.json", num_workers=4 * cores, cpu_threads=cores)
    os.environ["LOCAL_WORLD_SIZE"] = str(WORLD)  # as torchrun --nproc-per-node 2 sets it
    try:
        loader = tuned_loader(Indexed(), batch_size=BATCH)
        return {"cores": cores, "workers": loader.num_workers,
                "threads": apply.settings_knobs().cpu_threads}
    finally:
        del os.environ["LOCAL_WORLD_SIZE"]


def _different(rank: int, work: Path) -> dict[str, Any]:
    knobs = {"num_workers": rank + 1, "amp_dtype": "bfloat16" if rank else None}
    _use_settings(work / f"differs.{rank}.json", **knobs)
    model = make_model()
    try:
        tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
    except SettingsError as exc:
        return {"error": str(exc)}
    return {"error": None}


SCENARIOS: dict[str, Callable[[int, Path], dict[str, Any]]] = {
    "shares": _shares, "user_sampler": _user_sampler, "workers": _workers,
    "different": _different}


def _use_settings(path: Path, **knobs: Any) -> None:
    save(Settings(knobs=Knobs(**knobs)), path)
    os.environ["TUNEUP_SETTINGS"] = str(path)


def _rank(rank: int, work: Path) -> None:
    """Every scenario in a process group of its own: each is checked for agreement afresh."""
    torch.set_num_threads(1)
    for name, scenario in SCENARIOS.items():
        _use_settings(work / f"none.{rank}.json")
        dist.init_process_group("gloo", init_method=f"file://{work / name}.rendezvous",
                                rank=rank, world_size=WORLD)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                result = scenario(rank, work)
            except Exception:
                result = {"failed": traceback.format_exc()}
        result["warnings"] = [str(w.message) for w in caught
                              if issubclass(w.category, TuneupWarning)]
        torch.save(result, work / f"{name}.{rank}")
        dist.destroy_process_group()
    os._exit(0)  # results saved: skip interpreter teardown, which gloo's threads can abort
    # under load ("terminate called without an active exception", pytorch/pytorch#179291)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], list[dict[str, Any]]]:
    work = tmp_path_factory.mktemp("ranks")
    mp.spawn(_rank, args=(work,), nprocs=WORLD, join=True)

    def results(name: str) -> list[dict[str, Any]]:
        found = [torch.load(work / f"{name}.{rank}", weights_only=False) for rank in range(WORLD)]
        for result in found:
            assert "failed" not in result, result["failed"]
        return found

    return results


def test_ranks_read_disjoint_shares_covering_the_dataset(ranks) -> None:
    results = ranks("shares")
    for epoch in range(3):
        shares = [set(r["epochs"][epoch]) for r in results]
        assert shares[0] | shares[1] == set(range(SAMPLES)) and not shares[0] & shares[1]
        assert all(len(r["epochs"][epoch]) == SAMPLES // WORLD for r in results)
    assert results[0]["len"] == results[0]["inner_len"] == math.ceil(SAMPLES / WORLD / BATCH)
    assert issubclass(results[0]["sampler"], DistributedSampler)
    said, quiet = (r["warnings"] for r in results)  # rank 0 says it, once per loader
    assert len(said) == 4 and all("DistributedSampler" in w for w in said) and quiet == []


def test_each_pass_is_the_next_epoch_of_a_plain_distributed_sampler(ranks) -> None:
    for result in ranks("shares"):
        assert result["epochs"] == result["plain"]
        assert len({tuple(order) for order in result["epochs"]}) == 3  # a new order each epoch
        assert result["seeded"] == result["plain_seeded"] != result["plain"][0]
        assert result["resumed"] == result["plain_resumed"]
        assert result["in_order"] == result["plain_in_order"]


def test_a_sampler_of_the_users_is_kept(ranks) -> None:
    for result in ranks("user_sampler"):
        assert result["kept"]
        assert result["seen"] == list(range(SAMPLES))  # every rank reads it all, as asked
        assert result["warnings"] == []


def test_workers_and_threads_are_bounded_per_local_rank(ranks) -> None:
    for result in ranks("workers"):
        share = max(1, result["cores"] // WORLD)
        assert (result["workers"], result["threads"]) == (4 * share, share)
        if share < result["cores"]:
            assert any(f"{share} usable cores per local rank" in w for w in result["warnings"])


def test_ranks_with_different_settings_fail_on_every_rank_with_one_line(ranks) -> None:
    errors = [result["error"] for result in ranks("different")]
    assert errors[0] == errors[1] and errors[0] is not None
    assert "\n" not in errors[0]
    assert "num_workers: 1 on rank 0, 2 on rank 1" in errors[0]
    assert "amp_dtype: unset on rank 0, bfloat16 on rank 1" in errors[0]
    assert "same settings file" in errors[0]
