"""A tiny Hogwild-style job, as pytorch/examples' mnist_hogwild trains: the main process builds
the model, shares its memory and forks two ``mp.Process`` trainers, each with its own loader
and loop after seconds of set-up, then joins them. ``--plain``: a plain DataLoader and loop
(the watcher's plain-DataLoader probe measures it); else ``tuned_loader`` / ``tuned_loop``.
``--spawn``: trainers started with the spawn method instead of fork.
Usage: python hogwild.py [--plain] [--spawn] [SETUP_S] [TRAIN_S]"""

import sys
import time

import torch
import torch.multiprocessing as mp
from torch import nn

PLAIN = "--plain" in sys.argv
SETUP_S, TRAIN_S = ([float(a) for a in sys.argv[1:] if not a.startswith("--")] + [3.0, 1.5])[:2]


def train(model: nn.Module, rank: int) -> None:
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    time.sleep(SETUP_S)  # Hogwild's trainers build datasets before their loop
    data = torch.utils.data.TensorDataset(torch.randn(512, 32), torch.randint(0, 4, (512,)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    end = time.monotonic() + TRAIN_S
    if PLAIN:
        loader = torch.utils.data.DataLoader(data, batch_size=32, shuffle=True)
        while time.monotonic() < end:
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
        return
    from tuneup import tuned_loader, tuned_loop

    loop = tuned_loop(model, optimizer)
    loader = tuned_loader(data, batch_size=32, shuffle=True, loop=loop)
    while time.monotonic() < end:
        for batch in loader:
            loop.train_step(batch, lambda b: nn.functional.cross_entropy(model(b[0]), b[1]))


if __name__ == "__main__":
    mp.set_start_method("spawn" if "--spawn" in sys.argv else "fork")
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    model.share_memory()
    trainers = [mp.Process(target=train, args=(model, rank)) for rank in range(2)]
    for trainer in trainers:
        trainer.start()
    for trainer in trainers:
        trainer.join()
    sys.exit(max(trainer.exitcode or 0 for trainer in trainers))
