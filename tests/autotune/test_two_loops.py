"""A script with two tuned_loops (a GAN's D and G): both are restored before every trial, and
knobs that change a model are not tuned, since only the first loop is driven and measured."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

GAN = textwrap.dedent("""
    import torch
    from torch.utils.data import TensorDataset
    from tuneup import tuned_loader, tuned_loop
    torch.manual_seed(0)
    G = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    D = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LeakyReLU(0.2), torch.nn.Linear(32, 1))
    d_loop = tuned_loop(D, torch.optim.Adam(D.parameters(), lr=2e-4))
    g_loop = tuned_loop(G, torch.optim.Adam(G.parameters(), lr=2e-4))
    real = TensorDataset(torch.randn(2048, 16))
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    for epoch in range(1000):
        for (x,) in tuned_loader(real, batch_size=64, shuffle=True, loop=d_loop,
                                 generator=torch.Generator().manual_seed(epoch)):
            fake = G(torch.randn(len(x), 8)).detach()
            d_loop.train_step((x, fake), lambda b: bce(d_loop.model(b[0]), torch.ones(len(b[0]), 1))
                              + bce(d_loop.model(b[1]), torch.zeros(len(b[1]), 1)))
            g_loop.train_step(torch.randn(len(x), 8),
                              lambda z: bce(D(g_loop.model(z)), torch.ones(len(z), 1)))
""")


@pytest.mark.slow
def test_a_gan_is_tuned_on_what_both_loops_share_and_says_so(tmp_path, budget_for_load):
    script = tmp_path / "train.py"
    script.write_text(GAN)
    output = tmp_path / "train.tuneup.json"
    done = subprocess.run([sys.executable, "-m", "tuneup.cli", "autotune", str(script),
                           "--budget", str(budget_for_load(40)), "--format", "json",
                           "--output", str(output)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout[:done.stdout.rindex("}") + 1])
    assert any("2 tuned_loops" in note for note in result["notes"])
    knobs = json.loads(output.read_text())["knobs"]
    assert all(knobs.get(name) is None for name in ("amp_dtype", "compile_mode",
                                                    "micro_batch_size"))
    assert "loss" not in json.dumps(result.get("rejected", [])).lower()  # no drift from G
