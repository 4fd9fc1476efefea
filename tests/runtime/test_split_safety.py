"""What a micro-batch may never split (issue 31): models that normalise with batch statistics
are trained whole, bit-identical to no split, and the gradient check catches losses that mix
the samples of a batch, while ordinary models still split."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from runtime_helpers import assert_close_parameters
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from tuneup import tuned_loader, tuned_loop
from tuneup.runtime.batches import split_batch
from tuneup.runtime.loop import GRADIENT_TOLERANCE, split_gradient_change
from tuneup.settings import SettingsError, TuneupWarning

BATCH, MICRO = 32, 8
MIXES = re.compile(r"the split changes the gradient \(\d+(\.\d+)? % relative\): the loss or a "
                   r"layer mixes samples")


def mlp(norm: torch.nn.Module | None = None, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(8, 16), *([norm] if norm is not None else []), torch.nn.Tanh(),
              torch.nn.Linear(16, 2)]
    return torch.nn.Sequential(*layers)


def cnn(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4),
                               torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 3), torch.nn.BatchNorm2d(4),
                               torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten(), torch.nn.Linear(4, 2))


def dataset(shape: tuple[int, ...] = (8,), size: int = 96) -> TensorDataset:
    x = torch.randn(size, *shape, generator=torch.Generator().manual_seed(1))
    return TensorDataset(x, (x.flatten(1)[:, 0] > 0).long())


def cross_entropy(model: torch.nn.Module):
    return lambda batch: F.cross_entropy(model(batch[0]), batch[1])


def contrastive(model: torch.nn.Module):
    """An in-batch contrastive loss: each sample's positive is itself, the rest of the batch
    are its negatives, so a piece has other negatives than the whole batch."""
    def loss_fn(batch):
        z = F.normalize(model(batch[0]), dim=1)
        return F.cross_entropy(z @ z.T / 0.1, torch.arange(len(z)))
    return loss_fn


def plain(model: torch.nn.Module, data: TensorDataset, loss_of) -> tuple[list[float], dict]:
    """The plain PyTorch loop on whole batches: what the runtime must reproduce exactly."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn, losses = loss_of(model), []
    for batch in DataLoader(data, batch_size=BATCH, shuffle=True):
        optimizer.zero_grad()
        loss = loss_fn(batch)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, state(model)


def tuned(model: torch.nn.Module, data: TensorDataset, loss_of, check: bool = False,
          strict: bool = False):
    """The same loop through ``train_step`` (with a micro-batch in the settings)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loop = tuned_loop(model, optimizer)
    loop.strict = strict
    if check:
        loop.check_next_split()
    loss_fn, losses = loss_of(loop.model), []
    for batch in tuned_loader(data, batch_size=BATCH, shuffle=True, loop=loop):
        losses.append(loop.train_step(batch, loss_fn).item())
    return losses, state(model), loop


def state(model: torch.nn.Module) -> dict:
    """Parameters and buffers (running_mean/var, num_batches_tracked), copied."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_a_batchnorm_model_trains_bit_identical_to_no_split_and_says_why(write_settings, kind):
    write_settings(micro_batch_size=MICRO)
    make, data = ((lambda: mlp(torch.nn.BatchNorm1d(16))), dataset()) if kind == "mlp" \
        else (cnn, dataset((3, 6, 6)))
    torch.manual_seed(5)
    plain_losses, plain_state = plain(make(), data, cross_entropy)
    torch.manual_seed(5)
    with pytest.warns(TuneupWarning) as caught:
        losses, tuned_state, loop = tuned(make(), data, cross_entropy)
    assert losses == plain_losses
    assert_identical(tuned_state, plain_state)
    (tracked,) = {v.item() for k, v in tuned_state.items() if k.endswith("num_batches_tracked")}
    assert tracked == 3  # one count per batch, not per piece
    layer = "BatchNorm1d '1'" if kind == "mlp" else "BatchNorm2d '1'"
    reason = f"{layer} normalises with the statistics of the batch it is given"
    assert loop.applied_micro_batch is None and loop.micro_batch_blocked.startswith(reason)
    (warning,) = [str(w.message) for w in caught]
    assert warning.startswith(f"tuneup: micro_batch_size={MICRO} from the settings is not "
                              f"applied: {reason}")
    assert "\n" not in warning


@pytest.mark.parametrize("norm", [
    lambda: torch.nn.LazyBatchNorm1d(),
    lambda: torch.nn.SyncBatchNorm(16),
    lambda: torch.nn.BatchNorm1d(16, track_running_stats=False).eval(),  # batch stats in eval
    lambda: torch.nn.Sequential(torch.nn.Unflatten(1, (4, 4)),  # running stats: per piece
                                torch.nn.InstanceNorm1d(4, track_running_stats=True),
                                torch.nn.Flatten()),
], ids=["lazy", "sync", "no-running-stats-in-eval", "instance-tracking"])
def test_every_layer_that_depends_on_the_batch_blocks_the_split(write_settings, norm):
    write_settings(micro_batch_size=MICRO)
    model = mlp(norm())
    with pytest.warns(TuneupWarning, match="from the settings is not applied: "):
        _, _, loop = tuned(model, dataset(), cross_entropy)
    assert loop.applied_micro_batch is None
    assert re.search(r"(normalises with the statistics of the batch|updates its running "
                     r"statistics once per forward)", loop.micro_batch_blocked)


@pytest.mark.parametrize("norm", [
    lambda: torch.nn.GroupNorm(4, 16),
    lambda: torch.nn.LayerNorm(16),
    lambda: torch.nn.BatchNorm1d(16).eval(),  # running statistics: per sample
], ids=["group", "layer", "batchnorm-eval"])
def test_per_sample_norms_still_split_and_pass_the_gradient_check(write_settings, norm):
    write_settings(micro_batch_size=MICRO)
    torch.manual_seed(5)
    _, plain_state = plain(mlp(norm()), dataset(), cross_entropy)
    torch.manual_seed(5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, tuned_state, loop = tuned(mlp(norm()), dataset(), cross_entropy, check=True)
    assert loop.applied_micro_batch == MICRO and loop.micro_batch_blocked is None
    assert_close_parameters(list(tuned_state.values()), list(plain_state.values()))


def test_an_in_batch_contrastive_loss_is_caught_and_trained_whole(write_settings):
    """The check blocks the split; the step is then the plain loop's, bit for bit, RNG
    included (the check ran on copies and restored everything)."""
    write_settings(micro_batch_size=MICRO)
    torch.manual_seed(5)
    plain_losses, plain_state = plain(mlp(), dataset(), contrastive)
    plain_rng = torch.get_rng_state()
    torch.manual_seed(5)
    with pytest.warns(TuneupWarning) as caught:
        losses, tuned_state, loop = tuned(mlp(), dataset(), contrastive, check=True)
    assert losses == plain_losses and torch.equal(torch.get_rng_state(), plain_rng)
    assert_identical(tuned_state, plain_state)
    assert loop.applied_micro_batch is None and MIXES.fullmatch(loop.micro_batch_blocked)
    (warning,) = [str(w.message) for w in caught]
    assert MIXES.search(warning)


def test_a_contrastive_loss_on_a_model_with_dropout_is_still_caught(write_settings):
    """Dropout layers are off during the check, so their draws cannot hide the mixing."""
    write_settings(micro_batch_size=MICRO)
    with pytest.warns(TuneupWarning, match=MIXES.pattern):
        _, _, loop = tuned(mlp(torch.nn.Dropout(0.5)), dataset(), contrastive, check=True)
    assert loop.applied_micro_batch is None


def test_under_autotune_a_split_that_changes_the_gradient_fails_the_step(write_settings):
    """``strict`` (the autotune child): the trial fails with the reason, so the search never
    keeps the micro-batch; no gradient is left behind."""
    write_settings(micro_batch_size=MICRO)
    model = mlp()
    with pytest.raises(SettingsError) as error:
        tuned(model, dataset(), contrastive, check=True, strict=True)
    assert str(error.value).startswith(f"micro_batch_size={MICRO} is not applied: the split "
                                       "changes the gradient (")
    assert all(p.grad is None for p in model.parameters())


def test_an_ordinary_mlp_splits_and_its_gradient_matches_within_float32(write_settings):
    write_settings(micro_batch_size=MICRO)
    torch.manual_seed(5)
    plain_losses, plain_state = plain(mlp(), dataset(), cross_entropy)
    torch.manual_seed(5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        losses, tuned_state, loop = tuned(mlp(), dataset(), cross_entropy, check=True)
    assert loop.applied_micro_batch == MICRO and loop.micro_batch_blocked is None
    torch.testing.assert_close(losses, plain_losses, atol=1e-5, rtol=1e-5)
    assert_close_parameters(list(tuned_state.values()), list(plain_state.values()))
    model, batch = mlp(), next(iter(DataLoader(dataset(), batch_size=BATCH)))
    pieces = [(piece, MICRO / BATCH) for piece in split_batch(batch, MICRO)]
    change = split_gradient_change(model, list(model.parameters()), cross_entropy(model),
                                   [(batch, 1.0)], pieces)
    assert change < GRADIENT_TOLERANCE / 100  # float32 rounding: 1e-7 measured
    contrast = split_gradient_change(model, list(model.parameters()), contrastive(model),
                                     [(batch, 1.0)], pieces)
    assert contrast > 0.1


class Counting(torch.nn.Module):
    """A layer with a buffer its forward changes: the check must put it back."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x


def test_the_check_leaves_the_step_as_it_was_dropout_and_buffers_included(write_settings):
    """A model with dropout passes the check (dropout is off in it) and trains exactly as
    the same split without the check: same masks, same buffers, same parameters."""
    write_settings(micro_batch_size=MICRO)

    def model() -> torch.nn.Module:
        return torch.nn.Sequential(mlp(torch.nn.Dropout(0.5)), Counting())

    runs = []
    for check in (False, True):
        torch.manual_seed(5)
        losses, final, loop = tuned(model(), dataset(), cross_entropy, check=check)
        assert loop.applied_micro_batch == MICRO and loop.micro_batch_blocked is None
        runs.append((losses, final, torch.get_rng_state()))
    (losses, final, rng), (checked_losses, checked_final, checked_rng) = runs
    assert checked_losses == losses and torch.equal(checked_rng, rng)
    assert_identical(checked_final, final)
    assert final["1.calls"].item() == 3 * BATCH // MICRO


def test_random_draws_outside_dropout_layers_do_not_block_the_split(write_settings):
    """Noise drawn in the step (augmentation): the whole batch's gradient changes with the
    RNG alone, so the split is not judged by it and stays, as dropout's draws do."""
    write_settings(micro_batch_size=MICRO)

    def noisy(model):
        def loss_fn(batch):
            x = batch[0] + torch.randn_like(batch[0])
            return F.cross_entropy(model(x) + torch.randn(len(x), 2), batch[1])
        return loss_fn

    _, _, loop = tuned(mlp(), dataset(), noisy, check=True)
    assert loop.applied_micro_batch == MICRO and loop.micro_batch_blocked is None


@pytest.mark.parametrize("loss_of, blocked", [(cross_entropy, False), (contrastive, True)])
def test_when_the_whole_batch_does_not_fit_the_split_is_checked_against_a_finer_one(
        write_settings, loss_of, blocked):
    """The check's whole-batch pass runs out of memory (a stand-in, as the autotune tests
    do): pieces of 8 are compared with pieces of 4 instead. A split that mixes samples is
    then refused, and under autotune the trial fails as out of memory (the search says
    micro-batches cannot help) rather than as a settings error."""
    write_settings(micro_batch_size=MICRO)

    def limited(model):
        loss_fn = loss_of(model)

        def fits(batch):
            if len(batch[0]) > MICRO:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return loss_fn(batch)
        return fits

    if not blocked:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _, _, loop = tuned(mlp(), dataset(), limited, check=True)
        assert loop.applied_micro_batch == MICRO and loop.micro_batch_blocked is None
        return
    model = mlp()  # under autotune: trained whole, it runs out of memory, with the reason
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
    loop.strict = True
    loop.check_next_split()
    batches = iter(tuned_loader(dataset(), batch_size=BATCH, loop=loop))  # kept open
    batch = next(batches)
    with pytest.raises(torch.OutOfMemoryError):
        loop.train_step(batch, limited(loop.model))
    assert MIXES.fullmatch(loop.micro_batch_blocked)


def test_the_check_runs_the_eager_model_so_a_trial_compiles_nothing_more(write_settings,
                                                                         monkeypatch):
    """With a compile mode, ``loop.model`` is the eager model during the check: the
    compiled one sees the step's pieces only (its graphs and their time stay the trial's)."""
    shapes: list[int] = []

    class Compiled(torch.nn.Module):  # a stand-in for torch.compile's module: records calls
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            shapes.append(len(x))
            return self.inner(x)

    monkeypatch.setattr(torch, "compile", lambda model, mode=None: Compiled(model))
    write_settings(micro_batch_size=MICRO, compile_mode="default")
    model = mlp()
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
    loop.check_next_split()
    for batch in tuned_loader(dataset(), batch_size=BATCH, loop=loop):  # as docs/runtime.md
        loop.train_step(batch, lambda b: F.cross_entropy(loop.model(b[0]), b[1]))
    assert isinstance(loop.model, Compiled) and loop.applied_micro_batch == MICRO
    assert shapes == [MICRO] * (3 * BATCH // MICRO)
