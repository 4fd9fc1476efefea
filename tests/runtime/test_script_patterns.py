"""Patterns of real training scripts (pytorch/examples, Hugging Face-style loops): with or
without a micro-batch in the settings, the script computes what it computes without tuneup.

Each test runs the pattern twice, in plain PyTorch and with the wrappers, and compares."""

from __future__ import annotations

import pytest
import torch
from runtime_helpers import assert_close_parameters, make_dataset, make_model, parameters
from torch.nn import functional as F
from torch.utils.data import DataLoader

from tuneup import tuned_loader, tuned_loop
from tuneup.settings import TuneupWarning

MICRO = [None, 4]  # no settings file; a micro-batch smaller than every batch


@pytest.fixture
def settings(write_settings, request):
    """Writes a settings file with the parametrized micro-batch (None: no file)."""
    def apply(micro: int | None) -> None:
        if micro is not None:
            write_settings(micro_batch_size=micro)
    return apply


def classify(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1])


@pytest.mark.parametrize("micro", MICRO)
def test_a_schedule_sized_from_len_loader_decays_to_zero(settings, micro):
    """`total = epochs * len(loader)` with a per-step warmup/decay schedule (the HF
    get_linear_schedule_with_warmup pattern): the same learning rates at every step."""
    def lrs(tuned: bool) -> list[float]:
        model = make_model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        loader = (tuned_loader if tuned else DataLoader)(make_dataset(80), batch_size=16)
        total, warmup = 2 * len(loader), 2
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min((s + 1) / warmup, max(0.0, (total - s) / (total - warmup))))
        loop = tuned_loop(model, optimizer, scheduler=schedule) if tuned else None
        seen = []
        for _ in range(2):
            for step, batch in enumerate(loader):
                if tuned:
                    loop.train_step(batch, lambda b: classify(loop.model, b), max_grad_norm=1.0)
                else:
                    optimizer.zero_grad()
                    classify(model, batch).backward()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    optimizer.step()
                    schedule.step()
                seen.append((step, optimizer.param_groups[0]["lr"]))
        return seen

    plain = lrs(tuned=False)
    settings(micro)
    assert lrs(tuned=True) == plain and plain[-1][1] == 0.0


@pytest.mark.parametrize("micro", MICRO)
def test_a_per_epoch_scheduler_stepped_by_the_script(settings, micro):
    def final_lr(tuned: bool) -> float:
        model = make_model()
        optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
        loop = tuned_loop(model, optimizer) if tuned else None
        for _ in range(2):
            for batch in (tuned_loader if tuned else DataLoader)(make_dataset(48), batch_size=16):
                if tuned:
                    loop.train_step(batch, lambda b: classify(loop.model, b))
                else:
                    optimizer.zero_grad()
                    classify(model, batch).backward()
                    optimizer.step()
            scheduler.step()
        return optimizer.param_groups[0]["lr"]

    plain = final_lr(tuned=False)
    settings(micro)
    assert final_lr(tuned=True) == pytest.approx(plain) == pytest.approx(0.49)


@pytest.mark.parametrize("micro", MICRO)
def test_an_eval_loop_that_relies_on_the_batch_size(settings, micro):
    """The VAE example's `view(args.batch_size, ...)` in its test loop."""
    settings(micro)
    model = make_model()
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
    train = tuned_loader(make_dataset(64), batch_size=16, shuffle=True, loop=loop)
    test = tuned_loader(make_dataset(64, seed=1), batch_size=16, loop=loop)
    for batch in train:
        loop.train_step(batch, lambda b: classify(loop.model, b))
    with torch.no_grad():
        for x, _ in test:
            assert loop.model(x).view(16, -1).shape == (16, 2)
    assert len(test) == 4 and loop.stats().steps == 4


def sequence_first(samples):
    """A collate that makes `(T, B)` tensors (the word_language_model layout)."""
    return (torch.stack([s[0] for s in samples], dim=1), torch.stack([s[1] for s in samples], dim=1))


def sequences(count: int = 24, length: int = 5):
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(count, length, 8, generator=generator)
    return list(zip(x, (x[..., 0] > 0).long()))


def sequence_loss(model, batch):
    x, y = batch  # (T, B, F) and (T, B)
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())


@pytest.mark.parametrize("micro", MICRO)
def test_sequence_first_batches_are_never_cut_along_time(settings, micro, recwarn):
    model, reference = make_model(), make_model()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for batch in DataLoader(sequences(), batch_size=8, collate_fn=sequence_first):
        optimizer.zero_grad()
        sequence_loss(reference, batch).backward()
        optimizer.step()
    settings(micro)
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for batch in tuned_loader(sequences(), batch_size=8, collate_fn=sequence_first):
        loop.train_step(batch, lambda b: sequence_loss(loop.model, b))
    assert loop.applied_micro_batch is None
    assert all(torch.equal(a, b) for a, b in zip(parameters(model), parameters(reference)))
    said = [str(w.message) for w in recwarn if issubclass(w.category, TuneupWarning)]
    assert said == ([] if micro is None else [
        "tuneup: micro_batch_size=4 from the settings is not applied: its first dimension (5) "
        "is not the loader's 8 samples (sequence-first or packed batches are not split); "
        "training on whole batches"])


class Recurrent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.rnn = torch.nn.LSTM(8, 6, batch_first=True)
        self.head = torch.nn.Linear(6, 2)

    def forward(self, x, state):
        out, state = self.rnn(x, state)
        return self.head(out[:, -1]), state


@pytest.mark.parametrize("micro", MICRO)
def test_an_lstm_with_hidden_state_carried_across_batches(settings, micro):
    """State sized for the whole batch breaks on a piece: tuneup trains whole batches from
    then on and says so, and the result is the plain loop's."""
    data = [(x[:3], y) for x, y in zip(torch.randn(32, 3, 8), torch.randint(0, 2, (32,)))]

    def run(tuned: bool) -> list[torch.Tensor]:
        model = Recurrent()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loop = tuned_loop(model, optimizer) if tuned else None
        state = None

        def loss_fn(batch):
            nonlocal state
            logits, new_state = model(batch[0], state)
            state = tuple(s.detach() for s in new_state)
            return F.cross_entropy(logits, batch[1])

        for batch in (tuned_loader if tuned else DataLoader)(data, batch_size=8, drop_last=True):
            if tuned:
                loop.train_step(batch, loss_fn)
            else:
                optimizer.zero_grad()
                loss_fn(batch).backward()
                optimizer.step()
        return parameters(model)

    plain = run(tuned=False)
    settings(micro)
    if micro is None:
        tuned = run(tuned=True)
    else:
        with pytest.warns(TuneupWarning, match="loss_fn keeps state between calls "
                                               r"\(it assigns nonlocal 'state'\)"):
            tuned = run(tuned=True)
    assert all(torch.equal(a, b) for a, b in zip(tuned, plain))


def test_a_loss_function_whose_state_breaks_on_a_piece_falls_back_to_whole_batches(
        write_settings):
    """State sized for the whole batch that the code cannot see (held by the model): the
    piece fails, the batch runs whole from then on, one warning says why."""
    class Sized(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = make_model()
            self.register_buffer("mask", torch.ones(16, 1))

        def forward(self, x):
            return self.linear(x) * self.mask

    write_settings(micro_batch_size=4)
    model = Sized()
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.warns(TuneupWarning, match=r"loss_fn failed on a micro-batch \(RuntimeError"):
        for batch in tuned_loader(make_dataset(32), batch_size=16):
            loop.train_step(batch, lambda b: classify(loop.model, b))
    assert loop.stats().steps == 2 and loop.applied_micro_batch is None


@pytest.mark.parametrize("micro", MICRO)
def test_a_closure_optimizer(settings, micro):
    """LBFGS re-evaluates the loss: train_step builds the closure; backward says to use it."""
    x, y = make_dataset(32).tensors
    reference = make_model()
    plain = torch.optim.LBFGS(reference.parameters(), lr=0.5, max_iter=4)

    def closure():
        plain.zero_grad()
        loss = F.cross_entropy(reference(x), y)
        loss.backward()
        return loss

    plain.step(closure)
    settings(micro)
    model = make_model()
    loop = tuned_loop(model, torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4))
    (batch,) = list(tuned_loader(make_dataset(32), batch_size=32))
    loop.train_step(batch, lambda b: classify(loop.model, b))
    assert_close_parameters(parameters(model), parameters(reference))
    with pytest.raises(TypeError, match=r"LBFGS.step\(\) needs a closure: use loop.train_step"):
        loop.backward(classify(loop.model, batch))


@pytest.mark.parametrize("micro", MICRO)
def test_an_exception_the_script_catches_leaves_no_gradient_behind(settings, micro):
    """A loss that fails on one batch (a bad sample), caught by the script: the next step
    is the plain loop's, with no gradient of the failed batch's first pieces in it."""
    x, y = make_dataset(48).tensors
    x[20] = float("nan")  # in the second batch, in its second piece of 4... or the whole one

    def checked(model, batch):
        if torch.isnan(batch[0]).any():
            raise ValueError("bad sample")
        return classify(model, batch)

    def run(tuned: bool) -> list[torch.Tensor]:
        model = make_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        loop = tuned_loop(model, optimizer) if tuned else None
        dataset = torch.utils.data.TensorDataset(x, y)
        for batch in (tuned_loader if tuned else DataLoader)(dataset, batch_size=16):
            try:
                if tuned:
                    loop.train_step(batch, lambda b: checked(loop.model, b))
                else:
                    optimizer.zero_grad()
                    checked(model, batch).backward()
                    optimizer.step()
            except ValueError:
                continue
        return parameters(model)

    plain = run(tuned=False)
    settings(micro)
    assert_close_parameters(run(tuned=True), plain)


@pytest.mark.parametrize("micro", MICRO)
def test_loaders_may_be_created_before_the_loop(settings, micro, no_warnings):
    settings(micro)
    loader = tuned_loader(make_dataset(64), batch_size=16)
    model = make_model()
    loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
    losses = [loop.train_step(b, lambda b: classify(loop.model, b)).item() for b in loader]
    assert len(losses) == 4 and loop.applied_micro_batch == micro


def test_two_backward_calls_per_batch_are_two_steps_tuned_or_not(write_settings, monkeypatch):
    """The plain form is the plain loop's meaning, whatever the settings say."""
    def run() -> list[torch.Tensor]:
        model = make_model()
        loop = tuned_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
        for batch in tuned_loader(make_dataset(32), batch_size=16):
            loop.backward(classify(loop.model, batch))
            loop.backward(classify(loop.model, batch) * 0.5)
        assert loop.stats().steps == 4
        return parameters(model)

    write_settings(micro_batch_size=4)
    with pytest.warns(TuneupWarning):
        tuned = run()
    monkeypatch.setenv("TUNEUP_DISABLE", "1")
    assert all(torch.equal(a, b) for a, b in zip(tuned, run()))
