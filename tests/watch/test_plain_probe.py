"""The plain-DataLoader probe: figures like the wrappers' feed, nothing else changed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from watch_helpers import published

from tuneup.site import SITE_DIR
from tuneup.watch import feed
from tuneup.watch.plain_probe import trainer_on_stack

SCRIPT = textwrap.dedent("""
    import sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Slow(Dataset):
        def __len__(self): return 64
        def __getitem__(self, i):
            time.sleep(0.004)                       # decoding
            return torch.randn(8), torch.randint(0, 2, ())

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    waited = 0.0
    for epoch in range(2):
        it = iter(DataLoader(Slow(), batch_size=8, shuffle=True))
        while True:
            t = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                break
            waited += time.perf_counter() - t
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
            time.sleep(0.004)                       # compute
    print("loss", float(loss), "sum", float(sum(p.sum() for p in model.parameters())))
    print("waited", waited, file=sys.stderr)
""")


def run(script: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=120, cwd=script.parent)


@pytest.fixture
def base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TUNEUP_")}


def probed(env: dict[str, str], directory: Path, *extra_path: str) -> dict[str, str]:
    path = os.pathsep.join([str(SITE_DIR), *extra_path])
    return {**env, "PYTHONPATH": path, feed.ENV_FEED: str(directory)}


def test_a_plain_dataloader_is_measured_and_training_is_bit_identical(tmp_path, base_env):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    plain = run(script, base_env)
    watched = run(script, probed(base_env, tmp_path))
    assert plain.returncode == watched.returncode == 0, watched.stderr
    assert watched.stdout == plain.stdout  # same losses, same parameters
    (record,) = feed.read(tmp_path, published(tmp_path))
    assert (record.steps, record.samples, record.batch_size) == (16, 128, 8)
    assert record.num_workers == 0 and record.torch_threads
    waited = float(watched.stderr.split("waited")[1])
    assert abs(record.data_wait_s - waited) <= 0.1 * waited  # the script's own figure
    assert 0.5 < record.data_wait_s / record.elapsed_s < 0.95  # 32 ms decoding, ~5 ms compute


def test_a_job_that_never_imports_torch_loads_nothing(tmp_path, base_env):
    script = tmp_path / "job.py"
    script.write_text("import sys\nprint(sorted(m for m in sys.modules if m.startswith(('torch', "
                      "'tuneup.runtime'))))\n")
    done = run(script, probed(base_env, tmp_path))
    assert done.returncode == 0 and done.stdout.strip() == "[]"
    assert list(tmp_path.glob("*.json")) == []


def test_the_jobs_own_sitecustomize_still_runs(tmp_path, base_env):
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import builtins\nbuiltins.JOB_SITE = 'ran'\n")
    script = tmp_path / "job.py"
    script.write_text("import builtins\nprint(getattr(builtins, 'JOB_SITE', 'missing'))\n")
    done = run(script, probed(base_env, tmp_path, str(own)))
    assert done.stdout.strip() == "ran", done.stderr


def test_the_wrappers_feed_wins_over_the_probe(tmp_path, base_env):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import TensorDataset
        from tuneup import tuned_loader, tuned_loop
        model = torch.nn.Linear(4, 1)
        loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
        for x, y in tuned_loader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8, loop=loop):
            loop.train_step((x, y), lambda b: ((loop.model(b[0]) - b[1]) ** 2).mean())
    """))
    env = {**probed(base_env, tmp_path), "TUNEUP_OBSERVERS": feed.OBSERVER}
    done = run(script, env)
    assert done.returncode == 0, done.stderr
    (record,) = feed.read(tmp_path, published(tmp_path))
    assert record.steps == 4 and record.device == "cpu"  # the loop's figures, not the probe's


def test_a_job_that_loaded_the_feed_but_iterates_plain_dataloaders_is_measured(tmp_path,
                                                                               base_env):
    """A ``tuned_trainer`` job loads tuneup's runtime and the feed observer, whose feed then
    follows no ``tuned_loader`` and publishes nothing: the probe measures it. Its batches come
    from a batch sampler (as accelerate batches a Trainer's): their samples are counted."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import time, torch
        from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, TensorDataset
        from tuneup.runtime import hooks
        hooks.install_from_environment()  # what tuned_trainer / tuned_trainer_kwargs do
        data = TensorDataset(torch.randn(40, 4))
        for (x,) in DataLoader(data, batch_sampler=BatchSampler(SequentialSampler(data), 8, False)):
            time.sleep(0.002)
    """))
    env = {**probed(base_env, tmp_path), "TUNEUP_OBSERVERS": feed.OBSERVER}
    done = run(script, env)
    assert done.returncode == 0, done.stderr
    (record,) = feed.read(tmp_path, published(tmp_path))
    assert (record.steps, record.samples, record.batch_size) == (5, 40, 8)
    assert record.trainer is None and record.device is None  # the probe's, not the loop's


def test_the_trainer_named_is_the_one_whose_code_iterates():
    namespace = {"__name__": "lightning.pytorch.loops.fetchers",
                 "look": lambda: trainer_on_stack(sys._getframe(1))}
    exec("def fetch():\n    return look()\n", namespace)  # a frame of Lightning's loop
    assert namespace["fetch"]() == "lightning"
    namespace["__name__"] = "transformers.trainer"
    assert namespace["fetch"]() == "transformers"
    namespace["__name__"] = "lightning_utilities.core"  # a name that only starts alike
    assert namespace["fetch"]() is None
    assert trainer_on_stack(sys._getframe()) is None  # a loop of the script's own
