"""How the wrappers use the settings file: the contract example, broken files, other machines."""

from __future__ import annotations

import pytest
import torch
from runtime_helpers import make_dataset

from tuneup import tuned_loader, tuned_loop
from tuneup.runtime import apply
from tuneup.settings import TuneupWarning, fingerprint


def contract_example(dataset, model, optimizer) -> list[float]:
    """The documented contract (docs/runtime.md), apart from collecting the losses."""
    losses = []
    loop = tuned_loop(model, optimizer)                      # compile mode, AMP dtype, micro-batch, threads
    loader = tuned_loader(dataset, batch_size=256, shuffle=True, loop=loop)   # any DataLoader keyword
    for x, y in loader:                                      # the DataLoader's batches, on loop.device
        loss = loop.train_step((x, y), lambda b: torch.nn.functional.cross_entropy(loop.model(b[0]), b[1]))
        losses.append(loss.item())                           # once per batch, split or not
    return losses


def run_contract() -> tuple[list[float], object]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return contract_example(make_dataset(600), model, optimizer), model


def test_contract_example_without_settings(no_warnings):
    losses, _ = run_contract()
    assert len(losses) == 3 and losses[-1] < losses[0] + 0.1


def test_contract_example_with_a_settings_file(write_settings, no_warnings):
    threads = torch.get_num_threads()
    write_settings(num_workers=1, persistent_workers=True, prefetch_factor=2, micro_batch_size=100,
                   amp_dtype="bfloat16", cpu_threads=1, float32_matmul_precision="high")
    try:
        losses, model = run_contract()
        assert torch.get_num_threads() == 1 and torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_num_threads(threads)
        torch.set_float32_matmul_precision("highest")
    assert len(losses) == 3  # 256 = 100+100+56 twice, then 88: split inside train_step
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize(("content", "reason"), [
    ('{"schema_version": 1, "knobs": {"micro_batch_size": 8', "not valid JSON"),
    ('{"schema_version": 1, "knobs": {"amp_dtype": "float8"}}', "amp_dtype must be one of"),
    ('{"schema_version": 99, "knobs": {}}', "schema_version 99 is not supported"),
    ('{"schema_version": 1, "knobs": {"turbo": true}}', "unknown knob"),
    ("\x00\xff\xfe", "not valid JSON|cannot read"),
])
def test_a_broken_settings_file_warns_once_and_training_runs(tmp_path, monkeypatch, content, reason):
    path = tmp_path / "broken.json"
    path.write_bytes(content.encode("latin-1"))
    monkeypatch.setenv("TUNEUP_SETTINGS", str(path))
    with pytest.warns(TuneupWarning, match=reason) as caught:
        losses, _ = run_contract()
    assert len(caught) == 1
    assert len(losses) == 3


def test_settings_path_override_with_any_file_name(tmp_path, monkeypatch, write_settings):
    write_settings(micro_batch_size=64)
    elsewhere = tmp_path / "custom" / "knobs.txt"
    elsewhere.parent.mkdir()
    elsewhere.write_text((tmp_path / "train.tuneup.json").read_text())
    (tmp_path / "train.tuneup.json").unlink()
    monkeypatch.setenv("TUNEUP_SETTINGS", str(elsewhere))
    assert apply.settings_knobs().micro_batch_size == 64
    losses, _ = run_contract()
    assert len(losses) == 3


def test_missing_override_file_warns(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEUP_SETTINGS", str(tmp_path / "absent.json"))
    with pytest.warns(TuneupWarning, match="does not exist"):
        assert apply.settings_knobs().micro_batch_size is None


def test_per_script_default_location(tmp_path, monkeypatch, write_settings):
    write_settings(micro_batch_size=64)
    monkeypatch.delenv("TUNEUP_SETTINGS")
    monkeypatch.setattr("tuneup.settings.store.running_script", lambda: tmp_path / "train.py")
    assert apply.settings_knobs().micro_batch_size == 64


def test_another_machine_keeps_only_safe_knobs(write_settings, monkeypatch):
    stored = {"torch": "2.12.0", "cpu_model": "Xeon", "gpu_model": None}
    monkeypatch.setattr(fingerprint, "current",
                        lambda: {"torch": "2.13.0", "cpu_model": "Xeon", "gpu_model": None})
    write_settings(fingerprint=stored, micro_batch_size=8, num_workers=3, persistent_workers=True,
                   amp_dtype="bfloat16")
    with pytest.warns(TuneupWarning, match=r"different machine \(torch 2.12.0 -> 2.13.0\); "
                                           r"applying only pin_memory —") as caught:
        knobs = apply.settings_knobs()
        apply.settings_knobs()  # loaded once: no second warning
    assert len(caught) == 1 and caught[0].filename == __file__  # points at the user's line
    safe = set(fingerprint.SAFE_ACROSS_MACHINES)
    assert {k for k, v in knobs.to_dict().items() if v is not None} <= safe
    assert knobs.micro_batch_size is None and knobs.amp_dtype is None
    assert knobs.persistent_workers is None  # it changes a seeded shuffle's order: not "safe"


def test_same_machine_applies_everything(write_settings, monkeypatch, no_warnings):
    same = {"torch": "2.13.0", "cpu_model": "Xeon"}
    monkeypatch.setattr(fingerprint, "current", lambda: dict(same))
    write_settings(fingerprint=same, micro_batch_size=8, amp_dtype="bfloat16")
    assert apply.settings_knobs().micro_batch_size == 8


def test_fingerprint_probe_failure_keeps_only_safe_knobs(write_settings, monkeypatch):
    def broken():
        raise OSError("no /proc")

    monkeypatch.setattr(fingerprint, "current", broken)
    write_settings(fingerprint={"torch": "2.13.0"}, micro_batch_size=8)
    with pytest.warns(TuneupWarning, match="could not be fingerprinted"):
        assert apply.settings_knobs().micro_batch_size is None


def test_amp_problems_per_device():
    assert apply.amp_problem("float16", "cpu", True) is not None
    assert apply.amp_problem("bfloat16", "cpu", True) is None
    assert apply.amp_problem("bfloat16", "cuda", False) == "this GPU does not support bfloat16"
    assert apply.amp_problem("bfloat16", "cuda", True) is None
    assert apply.amp_problem("float16", "cuda", False) is None
    assert apply.amp_problem("float16", "mps", True) is not None


def test_scaler_only_for_float16_on_cuda(no_gpu):
    assert apply.make_scaler(torch.bfloat16, torch.device("cuda")) is None
    assert apply.make_scaler(torch.float16, torch.device("cpu")) is None
    with pytest.warns(UserWarning, match="CUDA is not available"):  # torch disables it itself
        scaler = apply.make_scaler(torch.float16, torch.device("cuda"))
    assert isinstance(scaler, torch.amp.GradScaler) and not scaler.is_enabled()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="float16's GradScaler needs a CUDA GPU")
def test_float16_on_cuda_gets_a_scaler_that_scales():
    scaler = apply.make_scaler(torch.float16, torch.device("cuda"))
    assert scaler is not None and scaler.is_enabled()
    weight = torch.nn.Parameter(torch.ones(4, device="cuda"))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    with torch.autocast("cuda", dtype=torch.float16):
        loss = (weight * 2).sum()
    scaler.scale(loss).backward()
    assert weight.grad is not None and float(weight.grad[0]) == 2.0 * scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    assert torch.allclose(weight.detach(), torch.full((4,), 0.8, device="cuda"))
