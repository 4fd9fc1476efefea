"""The split's gradient check under DDP (2 ranks on gloo): it runs under ``no_sync``, so it
adds no all-reduce, and the ranks train what plain DDP trains."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from runtime_helpers import make_dataset, make_model
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from tuneup import tuned_loader, tuned_loop

WORLD, BATCH, MICRO = 2, 16, 4


def _both(rank: int, init: str, out: str, settings: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    _train(rank, f"{out}.plain", tuned=False)
    os.environ["TUNEUP_SETTINGS"] = settings
    _train(rank, f"{out}.tuned", tuned=True)
    dist.destroy_process_group()
    os._exit(0)  # as tests/runtime/test_distributed.py: gloo's threads can abort a teardown


def _train(rank: int, out: str, tuned: bool) -> None:
    model = DistributedDataParallel(make_model())
    reductions = []

    def counting(state, bucket):  # the default all-reduce, counted
        reductions.append(1)
        tensor = bucket.buffer().div_(WORLD)
        return dist.all_reduce(tensor, async_op=True).get_future().then(lambda f: f.value()[0])

    model.register_comm_hook(None, counting)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    dataset = make_dataset(128)
    sampler = DistributedSampler(dataset, num_replicas=WORLD, rank=rank, shuffle=False)
    applied = None
    if tuned:
        loop = tuned_loop(model, optimizer)
        loop.check_next_split()
        for batch in tuned_loader(dataset, batch_size=BATCH, sampler=sampler, loop=loop):
            loop.train_step(batch, lambda b: F.cross_entropy(loop.model(b[0]), b[1]))
        applied = (loop.applied_micro_batch, loop.micro_batch_blocked)
    else:
        for x, y in DataLoader(dataset, batch_size=BATCH, sampler=sampler):
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
    torch.save({"params": [p.detach() for p in model.parameters()],
                "reductions": len(reductions), "applied": applied}, f"{out}.{rank}")


def test_the_gradient_check_under_ddp_adds_no_all_reduce_and_keeps_plain_ddp(
    tmp_path: Path, write_settings
) -> None:
    settings = write_settings(micro_batch_size=MICRO)
    os.environ.pop("TUNEUP_SETTINGS")
    init, out = f"file://{tmp_path / 'rendezvous'}", str(tmp_path / "run")
    mp.spawn(_both, args=(init, out, str(settings)), nprocs=WORLD, join=True)
    tuned, plain = ([torch.load(f"{out}.{kind}.{rank}") for rank in range(WORLD)]
                    for kind in ("tuned", "plain"))
    for rank in range(WORLD):
        assert tuned[rank]["applied"] == (MICRO, None)  # the check passed: the split stays
        assert tuned[rank]["reductions"] == plain[rank]["reductions"] == 128 // WORLD // BATCH
        for a, b in zip(tuned[rank]["params"], plain[rank]["params"]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
