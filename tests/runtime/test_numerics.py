"""Numerics of tuned_loop + tuned_loader on the CPU: identical without settings, equivalent
gradients with micro-batching (mean, sum and token-level losses), AMP and compile fallbacks."""

from __future__ import annotations

import warnings

import pytest
import torch
from runtime_helpers import assert_close_parameters, make_dataset, make_model, parameters
from torch.nn import functional as F
from torch.utils.data import DataLoader

from tuneup import tuned_loader, tuned_loop
from tuneup.settings import TuneupWarning


def plain_run(batch_size: int = 32, size: int = 96, **loader_kwargs: object):
    """The plain PyTorch loop the wrappers must reproduce: losses and final parameters."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    losses = []
    for x, y in DataLoader(make_dataset(size), batch_size=batch_size, shuffle=True, **loader_kwargs):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, parameters(model)


def tuned_run(batch_size: int = 32, size: int = 96, split: bool = False, **loader_kwargs: object):
    """The wrappers' loop: the plain form (``loop.step`` + ``loop.backward``) or, with
    ``split``, ``loop.train_step``, the form a micro-batch setting applies to."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    loop = tuned_loop(model, optimizer)
    losses = []
    loader = tuned_loader(make_dataset(size), batch_size=batch_size, shuffle=True, loop=loop,
                          **loader_kwargs)
    for x, y in loader:
        if split:
            loss = loop.train_step((x, y), lambda b: F.cross_entropy(loop.model(b[0]), b[1]))
        else:
            with loop.step():
                loss = F.cross_entropy(loop.model(x), y)
            loop.backward(loss)
        losses.append(loss.item())
    return losses, parameters(model), loop


@pytest.mark.parametrize("split", [False, True])
def test_no_settings_is_bit_identical_to_plain_pytorch(no_warnings, split):
    plain_losses, plain_params = plain_run()
    losses, params, loop = tuned_run(split=split)
    assert losses == plain_losses
    assert all(torch.equal(a, b) for a, b in zip(params, plain_params))
    assert loop.stats().steps == 3


@pytest.mark.parametrize("split", [False, True])
def test_disable_makes_a_settings_file_pass_through(write_settings, monkeypatch, no_warnings,
                                                    split):
    write_settings(micro_batch_size=8, amp_dtype="bfloat16", cpu_threads=1)
    monkeypatch.setenv("TUNEUP_DISABLE", "1")
    threads = torch.get_num_threads()
    assert tuned_run(split=split)[0] == plain_run()[0]
    assert torch.get_num_threads() == threads


@pytest.mark.parametrize("micro", [8, 12, 31])  # divides 32; uneven (12+12+8); 31+1
def test_micro_batching_matches_the_full_batch(write_settings, micro, no_warnings):
    write_settings(micro_batch_size=micro)
    plain_losses, plain_params = plain_run(batch_size=32, size=80)  # last batch: 16 samples
    losses, params, loop = tuned_run(batch_size=32, size=80, split=True)
    assert loop.stats().steps == 3 and len(losses) == 3  # the user's loop body: once a batch
    assert loop.applied_micro_batch == (micro if micro < 16 else None)  # the last batch: 16
    torch.testing.assert_close(losses, plain_losses, atol=1e-5, rtol=1e-5)
    assert_close_parameters(params, plain_params)


def test_micro_batching_with_drop_last(write_settings):
    write_settings(micro_batch_size=16)
    _, plain_params = plain_run(batch_size=32, size=80, drop_last=True)
    _, params, loop = tuned_run(batch_size=32, size=80, drop_last=True, split=True)
    assert loop.stats().steps == 2
    assert_close_parameters(params, plain_params)


def test_the_plain_form_trains_whole_batches_and_says_why(write_settings):
    write_settings(micro_batch_size=8)
    with pytest.warns(TuneupWarning, match="micro_batch_size=8 from the settings is not applied: "
                                           "the script computes its loss outside") as caught:
        losses, _, loop = tuned_run()
    assert len(caught) == 1
    assert losses == plain_run()[0] and loop.applied_micro_batch is None


def token_batches(pad: int = -100):
    """Sequences of different lengths padded with ``pad``: a token-level loss."""
    generator = torch.Generator().manual_seed(3)
    tokens = torch.randn(12, 5, 4, generator=generator)
    labels = torch.randint(0, 3, (12, 5), generator=generator)
    lengths = torch.tensor([5, 1, 2, 5, 3, 1, 4, 5, 2, 1, 0, 0])  # the last micro-batch: none
    labels[torch.arange(5)[None, :] >= lengths[:, None]] = pad
    return torch.utils.data.TensorDataset(tokens, labels)


def token_loss(model, x, y, reduction="mean"):
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-100,
                           reduction=reduction)


def test_token_level_loss_without_micro_batching_is_the_plain_mean(write_settings):
    """``backward(sum, num_items=n)`` is exactly ``(sum / n).backward()`` and the step."""
    torch.manual_seed(0)
    plain, tuned = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    tuned.load_state_dict(plain.state_dict())
    x, y = token_batches().tensors
    count = int((y != -100).sum())
    (token_loss(plain, x, y, reduction="sum") / count).backward()
    torch.optim.SGD(plain.parameters(), lr=1.0).step()
    loop = tuned_loop(tuned, torch.optim.SGD(tuned.parameters(), lr=1.0))
    loop.backward(token_loss(tuned, x, y, reduction="sum"), num_items=count)
    assert all(torch.equal(a, b) for a, b in zip(parameters(tuned), parameters(plain)))


@pytest.mark.parametrize("micro", [None, 5])  # 5 + 5 + 2 sequences: 21, 8 and 0 tokens
def test_token_level_loss_with_num_items(write_settings, micro):
    torch.manual_seed(0)
    plain = torch.nn.Linear(4, 3)
    tuned = torch.nn.Linear(4, 3)
    tuned.load_state_dict(plain.state_dict())
    dataset = token_batches()
    plain_optimizer = torch.optim.SGD(plain.parameters(), lr=1.0)
    x, y = dataset.tensors
    expected = token_loss(plain, x, y)  # mean over all 12 sequences' real tokens
    expected.backward()
    plain_optimizer.step()

    if micro:
        write_settings(micro_batch_size=micro)
    loop = tuned_loop(tuned, torch.optim.SGD(tuned.parameters(), lr=1.0))
    for batch in tuned_loader(dataset, batch_size=12, loop=loop):
        loss = loop.train_step(batch, lambda b: token_loss(loop.model, *b, reduction="sum"),
                               num_items=(batch[1] != -100).sum())
    assert loop.stats().steps == 1 and loop.applied_micro_batch == micro
    torch.testing.assert_close(loss, expected.detach())  # what the plain loop backpropagates
    assert_close_parameters(parameters(tuned), parameters(plain))


@pytest.mark.parametrize("micro", [None, 7])
def test_sum_reduced_loss_keeps_its_meaning(write_settings, micro):
    """A ``reduction='sum'`` loss (the VAE pattern): same gradient split or not."""
    _, plain_params = plain_sum_run()
    if micro:
        write_settings(micro_batch_size=micro)
    model = make_model()
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.01))
    for batch in tuned_loader(make_dataset(40), batch_size=20, loop=loop):
        loop.train_step(batch, lambda b: F.cross_entropy(loop.model(b[0]), b[1], reduction="sum"),
                        reduction="sum")
    assert loop.applied_micro_batch == micro
    assert_close_parameters(parameters(model), plain_params)


def plain_sum_run():
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in DataLoader(make_dataset(40), batch_size=20):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y, reduction="sum").backward()
        optimizer.step()
    return None, parameters(model)


def test_clipping_matches_plain_clip(write_settings):
    write_settings(micro_batch_size=10)  # clips the whole batch's gradient, after the pieces
    model, reference = make_model(), make_model()
    x, y = make_dataset(40).tensors
    plain_optimizer = torch.optim.SGD(reference.parameters(), lr=1.0)
    F.cross_entropy(reference(x), y).backward()
    torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.01)
    plain_optimizer.step()

    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=1.0))
    for batch in tuned_loader(make_dataset(40), batch_size=40, loop=loop):
        loop.train_step(batch, lambda b: F.cross_entropy(loop.model(b[0]), b[1]),
                        max_grad_norm=0.01)
    assert loop.applied_micro_batch == 10
    assert_close_parameters(parameters(model), parameters(reference))


def test_bf16_autocast_on_cpu(write_settings, no_warnings):
    write_settings(amp_dtype="bfloat16")
    model = make_model()
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = next(iter(tuned_loader(make_dataset(), batch_size=32, loop=loop)))
    with loop.step():
        logits = loop.model(x)
        loss = F.cross_entropy(logits, y)
    assert logits.dtype is torch.bfloat16
    assert loop.scaler is None
    loop.backward(loss)
    assert all(p.dtype is torch.float32 and torch.isfinite(p).all() for p in model.parameters())
    with torch.no_grad():
        reference = F.cross_entropy(make_model()(x), y)
    assert abs(loss.item() - reference.item()) < 0.05


def test_fp16_on_cpu_warns_once_and_trains_in_fp32(write_settings):
    write_settings(amp_dtype="float16")
    with pytest.warns(TuneupWarning, match="float16 autocast is not used on the CPU") as caught:
        losses, _, loop = tuned_run()
    assert len([w for w in caught if issubclass(w.category, TuneupWarning)]) == 1
    assert loop.amp_dtype is None
    assert losses == plain_run()[0]


def test_grad_scaler_wiring_matches_a_manual_scaler_loop():
    """The float16 path: scale, (unscale + clip), step, update — checked with a CPU GradScaler."""
    def run(tuned: bool) -> list[torch.Tensor]:
        model = make_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
        loop = tuned_loop(model, optimizer)
        loop.scaler = scaler
        for x, y in DataLoader(make_dataset(), batch_size=32):
            loss = F.cross_entropy(model(x), y)
            if tuned:
                loop.backward(loss, max_grad_norm=1.0)
            else:
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
        return parameters(model) + [torch.tensor(scaler.get_scale())]

    assert_close_parameters(run(tuned=True), run(tuned=False))


def test_compile_failure_at_first_call_falls_back_to_eager(write_settings, monkeypatch):
    class Broken(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args: object) -> torch.Tensor:
            raise RuntimeError("backend compiler failed\nlong details")

    monkeypatch.setattr(torch, "compile", lambda model, mode=None: Broken(model))
    write_settings(compile_mode="max-autotune")
    with pytest.warns(TuneupWarning, match=r"failed at the first call \(RuntimeError: backend compiler failed\); running eager") as caught:
        losses, _, loop = tuned_run()
    assert len(caught) == 1 and caught[0].filename == __file__
    assert losses == plain_run()[0]
    assert loop.model(make_dataset().tensors[0]).shape == (96, 2)


def test_compile_failure_at_compile_time_falls_back_to_eager(write_settings, monkeypatch):
    def refuse(model, mode=None):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(torch, "compile", refuse)
    write_settings(compile_mode="default")
    with pytest.warns(TuneupWarning, match="no compiler here"):
        losses, _, loop = tuned_run()
    assert loop.model is loop.eager_model
    assert losses == plain_run()[0]


def test_real_compile_runs_and_matches_eager(write_settings):
    write_settings(compile_mode="default")
    with warnings.catch_warnings():
        warnings.simplefilter("error", TuneupWarning)
        losses, _, loop = tuned_run(size=64)
    assert loop.model is not loop.eager_model
    torch.testing.assert_close(losses, plain_run(size=64)[0], atol=1e-5, rtol=1e-5)
