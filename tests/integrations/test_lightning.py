"""tuned_trainer_kwargs on a real lightning.Trainer: a tiny module, data in memory, CPU.
The loaders Lightning trains on get the knobs; the data order, the losses (where the knobs
cannot change numerics), the step count and the user's own values stay as they were."""

from __future__ import annotations

import subprocess
import sys
import typing
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

L = pytest.importorskip("lightning")
from lightning.fabric.connector import _PRECISION_INPUT_STR  # noqa: E402

from tuneup.integrations import knobs_as  # noqa: E402
from tuneup.integrations.lightning import TunedLoaders, tuned_trainer_kwargs  # noqa: E402
from tuneup.settings import TuneupWarning  # noqa: E402


class Module(L.LightningModule):
    """Records what it trains on: the sample ids of each batch, the losses, the loader."""

    def __init__(self, loader: Any = None, **loader_kwargs: Any) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.2), nn.Linear(8, 1))
        self.loader, self.loader_kwargs = loader, loader_kwargs
        self.order: list[int] = []
        self.losses: list[float] = []
        self.trained_on: list[DataLoader] = []

    def train_dataloader(self) -> Any:
        if self.loader is not None:
            return self.loader(self.loader_kwargs)
        g = torch.Generator().manual_seed(1)
        data = TensorDataset(torch.randn(24, 4, generator=g), torch.randn(24, generator=g),
                             torch.arange(24))
        return DataLoader(data, **{"batch_size": 4, "shuffle": True, **self.loader_kwargs})

    def on_train_epoch_start(self) -> None:
        self.trained_on.append(self.trainer.train_dataloader)

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        x, y, ids = batch
        self.order.extend(ids.tolist())
        loss = nn.functional.mse_loss(self.net(x).squeeze(-1).float(), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)]


def fit(tmp_path: Path, module: Module, **kwargs: Any) -> L.Trainer:
    quiet = dict(max_epochs=2, accelerator="cpu", enable_progress_bar=False, logger=False,
                 enable_checkpointing=False, enable_model_summary=False,
                 default_root_dir=str(tmp_path))
    trainer = L.Trainer(**tuned_trainer_kwargs(**{**quiet, **kwargs}))
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        trainer.fit(module)
    return trainer


def test_without_a_settings_file_the_kwargs_are_unchanged():
    kwargs = {"max_epochs": 3, "callbacks": [L.pytorch.callbacks.LearningRateMonitor()]}
    with warnings.catch_warnings():
        warnings.simplefilter("error", TuneupWarning)
        assert tuned_trainer_kwargs(**kwargs) == kwargs


def test_precision_and_a_callback_after_the_users_own(write_settings):
    write_settings(amp_dtype="bfloat16", num_workers=2)
    mine = L.pytorch.callbacks.LearningRateMonitor()
    kwargs = tuned_trainer_kwargs(max_epochs=3, accelerator="cpu", callbacks=[mine])
    assert kwargs["precision"] == "bf16-mixed" and kwargs["max_epochs"] == 3
    assert kwargs["callbacks"][0] is mine and isinstance(kwargs["callbacks"][1], TunedLoaders)


def test_the_users_precision_is_kept_with_one_warning(write_settings):
    write_settings(amp_dtype="bfloat16")
    with pytest.warns(TuneupWarning, match="kept your precision='32-true'") as caught:
        kwargs = tuned_trainer_kwargs(precision="32-true", accelerator="cpu")
    assert kwargs["precision"] == "32-true" and len(caught) == 1


@pytest.mark.parametrize(("knobs", "says"), [
    ({"amp_dtype": "float16"}, "float16 autocast is not used on the CPU"),
    ({"micro_batch_size": 2}, "accumulate_grad_batches needs a smaller loader batch"),
])
def test_what_is_not_applied_is_one_warning(write_settings, knobs, says):
    write_settings(**knobs)
    with pytest.warns(TuneupWarning, match=says) as caught:
        kwargs = tuned_trainer_kwargs(accelerator="cpu")
    assert len(caught) == 1 and "precision" not in kwargs


def test_compile_mode_compiles_the_parts_training_step_calls(tmp_path, write_settings):
    plain = fit(tmp_path, Module())
    write_settings(compile_mode="default")
    module = Module()
    with warnings.catch_warnings():
        warnings.simplefilter("error", TuneupWarning)
        compiled = fit(tmp_path, module)
    assert module.net._compiled_call_impl is not None  # what training_step calls
    assert compiled.global_step == plain.global_step


def test_compile_mode_compiles_a_torch_nn_part(write_settings):
    """Dynamo skips torch's own frames: ``nn.Sequential.compile()`` alone compiles nothing."""
    from torch._dynamo.utils import counters

    from tuneup.integrations.lightning import _compile_parts

    module = Module()
    torch._dynamo.reset()
    counters.clear()
    _compile_parts(module, "default", None)
    x = torch.randn(4, 4)
    module.net.eval()
    with torch.no_grad():
        assert torch.allclose(module.net(x), module.net._call_impl(x), atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1  # the Sequential's forward, traced


def test_a_compile_that_fails_at_the_first_call_trains_eager(tmp_path, write_settings,
                                                            monkeypatch):
    plain = Module()
    fit(tmp_path, plain)

    def broken(fn: Any, **kwargs: Any) -> Any:
        def call(*args: Any, **kw: Any) -> Any:
            raise RuntimeError("backend compiler failed")
        return call

    write_settings(compile_mode="default")
    monkeypatch.setattr(torch, "compile", broken)
    module = Module()
    with pytest.warns(TuneupWarning, match="failed at the first call .*running it eager"):
        fit(tmp_path, module)
    assert module.losses == plain.losses  # eager from the first step on, nothing lost
    assert module.net._compiled_call_impl is None


def test_a_module_the_script_compiled_is_left_with_one_warning(tmp_path, write_settings):
    write_settings(compile_mode="default")
    module = Module()
    trainer = L.Trainer(**tuned_trainer_kwargs(
        max_steps=1, accelerator="cpu", enable_progress_bar=False, logger=False,
        enable_checkpointing=False, enable_model_summary=False, default_root_dir=str(tmp_path)))
    with pytest.warns(TuneupWarning, match="you compiled the module yourself") as caught:
        trainer.fit(torch.compile(module))
    ours = [w for w in caught if w.category is TuneupWarning]
    assert len(ours) == 1 and ours[0].filename == __file__  # the user's line, not Lightning's
    assert module.net._compiled_call_impl is None


def test_loader_knobs_keep_the_order_the_losses_and_the_steps(tmp_path, write_settings):
    plain_module = Module()
    plain = fit(tmp_path, plain_module)
    write_settings(num_workers=2, prefetch_factor=4, pin_memory=True, persistent_workers=True,
                   cpu_threads=1)
    tuned_module = Module()
    tuned = fit(tmp_path, tuned_module)
    assert [(dl.num_workers, dl.prefetch_factor) for dl in tuned_module.trained_on] == [(2, 4)] * 2
    loader = tuned_module.trained_on[-1]
    assert (loader.pin_memory, loader.persistent_workers) == (False, False)  # CPU; it shuffles
    assert loader.batch_size == 4 and loader.drop_last is False
    assert tuned_module.order == plain_module.order
    assert sorted(plain_module.order[:24]) == list(range(24))  # an epoch: each sample once
    assert tuned_module.losses == plain_module.losses  # dropout draws the same masks too
    assert tuned.global_step == plain.global_step == 12
    assert tuned.lr_scheduler_configs[0].scheduler.get_last_lr() == \
        plain.lr_scheduler_configs[0].scheduler.get_last_lr()
    assert torch.get_num_threads() == 1


@pytest.mark.parametrize("shuffle", [False, True])
def test_loaders_reloaded_each_epoch_are_tuned_each_time_in_the_same_order(
        tmp_path, write_settings, shuffle):
    plain_module = Module(shuffle=shuffle)
    fit(tmp_path, plain_module, reload_dataloaders_every_n_epochs=1)
    write_settings(num_workers=2)
    tuned_module = Module(shuffle=shuffle)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TuneupWarning)
        fit(tmp_path, tuned_module, reload_dataloaders_every_n_epochs=1)
    workers = [dl.num_workers for dl in tuned_module.trained_on]
    assert workers == ([0, 0] if shuffle else [2, 2])
    assert any("would change the data order" in str(w.message) for w in caught) == shuffle
    assert len(tuned_module.trained_on) == 2 and tuned_module.order == plain_module.order


@pytest.mark.parametrize("own_generator", [True, False])
def test_persistent_workers_only_where_they_change_no_draw(tmp_path, write_settings,
                                                           own_generator):
    """Each epoch's new iterator draws its workers' seed from the loader's generator, else
    from torch's global one, which dropout draws from too: persistent workers skip it."""
    def module() -> Module:
        return Module(shuffle=False, **(
            {"generator": torch.Generator().manual_seed(3)} if own_generator else {}))

    plain = module()
    fit(tmp_path, plain, max_epochs=2)
    write_settings(num_workers=1, persistent_workers=True)
    tuned = module()
    fit(tmp_path, tuned, max_epochs=2)
    assert tuned.trained_on[0].persistent_workers is own_generator
    assert tuned.order == plain.order == list(range(24)) * 2
    assert tuned.losses == plain.losses  # dropout's draws unchanged in the second epoch


class _Noisy(TensorDataset):
    """Loading a sample draws from torch's global generator (a random augmentation)."""

    def __getitem__(self, index: int) -> Any:
        x, y, i = super().__getitem__(index)
        return x + 0.01 * torch.randn(4), y, i


@pytest.mark.parametrize(("noisy", "own_generator", "why"), [
    (True, False, "draws from torch's global random generator"),
    (False, True, "a generator of its own"),
])
def test_workers_are_not_added_where_they_would_move_the_next_shuffle(
        tmp_path, write_settings, noisy, own_generator, why):
    """Without workers the dataset's draws (an augmentation) advance the generator the next
    epoch's shuffle is seeded from, and Lightning stops an epoch before RandomSampler's last
    draw from a generator of its own; with workers neither holds."""
    def loader(kwargs: dict) -> DataLoader:
        g = torch.Generator().manual_seed(1)
        data = (_Noisy if noisy else TensorDataset)(
            torch.randn(24, 4, generator=g), torch.randn(24, generator=g), torch.arange(24))
        own = {"generator": torch.Generator().manual_seed(2)} if own_generator else {}
        return DataLoader(data, batch_size=4, shuffle=True, **own, **kwargs)

    plain = Module(loader)
    fit(tmp_path, plain)
    write_settings(num_workers=2)
    tuned = Module(loader)
    with pytest.warns(TuneupWarning, match=why):
        fit(tmp_path, tuned)
    assert [dl.num_workers for dl in tuned.trained_on] == [0, 0]
    assert tuned.order == plain.order and tuned.losses == plain.losses


class _Pair(Module):
    """Two training loaders, as a dict: Lightning makes both iterators before the first batch."""

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        (xa, ya, ia), (xb, yb, ib) = batch["a"], batch["b"]
        self.order.extend(ia.tolist() + (100 + ib).tolist())
        x, y = torch.cat([xa, xb]), torch.cat([ya, yb])
        loss = nn.functional.mse_loss(self.net(x).squeeze(-1), y)
        self.losses.append(loss.item())
        return loss


@pytest.mark.parametrize("second_shuffles", [True, False])
def test_several_training_loaders_keep_their_order(tmp_path, write_settings, second_shuffles):
    """Without workers a shuffle draws its seed at its first batch, after every loader's
    iterator drew its workers' seed; with workers it draws it as its iterator is made. A
    second loader that does not shuffle and draws from its own generator moves nothing."""
    def loaders(kwargs: dict) -> dict[str, DataLoader]:
        def one(n: int, **how: Any) -> DataLoader:
            return DataLoader(TensorDataset(torch.randn(n, 4), torch.randn(n), torch.arange(n)),
                              batch_size=4, **how)
        return {"a": one(24, shuffle=True),
                "b": one(16, shuffle=True) if second_shuffles
                else one(16, generator=torch.Generator().manual_seed(3))}

    plain = _Pair(loaders)
    fit(tmp_path, plain)
    write_settings(num_workers=1)
    tuned = _Pair(loaders)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TuneupWarning)
        fit(tmp_path, tuned)
    workers = [dl.num_workers for dl in tuned.trained_on[0].values()]
    assert workers == ([0, 0] if second_shuffles else [1, 1])
    assert any("several training loaders" in str(w.message) for w in caught) is second_shuffles
    assert tuned.order == plain.order and tuned.losses == plain.losses


def test_a_custom_batch_sampler_is_kept(tmp_path, write_settings):
    class Reversed(torch.utils.data.Sampler):
        def __iter__(self) -> Any:
            return iter([[i, i - 1, i - 2] for i in range(23, 0, -3)])

        def __len__(self) -> int:
            return 8

    def loader(kwargs: dict) -> DataLoader:
        data = TensorDataset(torch.randn(24, 4), torch.randn(24), torch.arange(24))
        return DataLoader(data, batch_sampler=Reversed(), **kwargs)

    write_settings(num_workers=1)
    module = Module(loader)
    fit(tmp_path, module, max_epochs=1)
    assert module.trained_on[0].num_workers == 1
    assert module.order == list(range(23, -1, -1))


def test_values_the_user_gave_the_dataloader_are_kept_with_one_warning(tmp_path, write_settings):
    write_settings(num_workers=2, prefetch_factor=4)
    module = Module(num_workers=1)
    with pytest.warns(TuneupWarning, match="kept your DataLoader num_workers=1") as caught:
        fit(tmp_path, module, max_epochs=1)
    assert [str(w.message) for w in caught if "kept" in str(w.message)] == [
        "tuneup: kept your DataLoader num_workers=1 over the settings file (values you set "
        "are never overridden)"]
    assert (module.trained_on[0].num_workers, module.trained_on[0].prefetch_factor) == (1, 4)


def test_a_dataloader_subclass_is_left_alone_with_one_warning(tmp_path, write_settings):
    class Mine(DataLoader):
        pass

    def loader(kwargs: dict) -> DataLoader:
        return Mine(TensorDataset(torch.randn(8, 4), torch.randn(8), torch.arange(8)),
                    batch_size=4)

    write_settings(num_workers=2)
    module = Module(loader)
    with pytest.warns(TuneupWarning, match="rebuilds only a plain DataLoader"):
        fit(tmp_path, module, max_epochs=1)
    assert type(module.trained_on[0]) is Mine and module.trained_on[0].num_workers == 0


def test_the_precision_spellings_are_lightnings_own():
    assert set(knobs_as.LIGHTNING_PRECISION.values()) <= set(typing.get_args(_PRECISION_INPUT_STR))


def test_a_missing_library_is_one_line_naming_the_extra():
    code = ("import sys; sys.modules['lightning'] = sys.modules['lightning.pytorch'] = None\n"
            "import tuneup.integrations.lightning")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "ImportError: tuneup's lightning integration needs lightning.pytorch: "
        "pip install tuneup[lightning]")


def test_tuneup_disable_leaves_the_kwargs_alone(write_settings, monkeypatch):
    write_settings(num_workers=2, amp_dtype="bfloat16")
    monkeypatch.setenv("TUNEUP_DISABLE", "1")
    assert tuned_trainer_kwargs(max_epochs=1) == {"max_epochs": 1}


def test_one_callback_not_in_a_list_is_kept(write_settings):
    write_settings(num_workers=2)
    mine = L.pytorch.callbacks.LearningRateMonitor()  # Lightning takes callbacks=one too
    kwargs = tuned_trainer_kwargs(max_epochs=1, accelerator="cpu", callbacks=mine)
    assert kwargs["callbacks"][0] is mine and isinstance(kwargs["callbacks"][1], TunedLoaders)
    assert mine in L.Trainer(**kwargs, logger=False).callbacks


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self) -> Any:
        return iter([(torch.randn(4), torch.randn(()), torch.tensor(i)) for i in range(8)])


def _observed_fit(tmp_path: Path, module: Any, knobs: Any = None) -> Any:
    """Fit with a TunedLoaders as autotune installs it (an observer, a TrainerRun)."""
    from tuneup.runtime import hooks
    from tuneup.settings import Knobs

    run = hooks.TrainerRun("lightning")
    trainer = L.Trainer(max_steps=1, accelerator="cpu", enable_progress_bar=False, logger=False,
                        enable_checkpointing=False, enable_model_summary=False,
                        default_root_dir=str(tmp_path),
                        callbacks=[TunedLoaders(knobs or Knobs(), run, hooks.Observer())])
    trainer.fit(module)
    return run


def test_the_reasons_autotune_hears_name_an_iterable_dataset_and_a_compiled_module(tmp_path):
    run = _observed_fit(tmp_path, Module(lambda kwargs: DataLoader(_Stream(), batch_size=4)))
    assert "IterableDataset (_Stream)" in run.fixed_reasons["num_workers"]
    assert "is a DataLoader" not in run.fixed_reasons["num_workers"]
    run = _observed_fit(tmp_path, torch.compile(Module()))
    assert run.fixed_reasons["compile_mode"] == "you compiled the module yourself"


def test_precision_none_is_lightnings_default_and_a_precision_plugin_is_the_users(write_settings):
    write_settings(amp_dtype="bfloat16")
    with warnings.catch_warnings():
        warnings.simplefilter("error", TuneupWarning)
        assert tuned_trainer_kwargs(precision=None, accelerator="cpu")["precision"] == "bf16-mixed"
    plugin = L.pytorch.plugins.MixedPrecision("bf16-mixed", "cpu")
    with pytest.warns(TuneupWarning, match="kept your precision plugin MixedPrecision") as caught:
        kwargs = tuned_trainer_kwargs(accelerator="cpu", plugins=[plugin])
    assert "precision" not in kwargs and len(caught) == 1
    assert L.Trainer(**kwargs, logger=False).precision_plugin is plugin  # no "Choose one" error
