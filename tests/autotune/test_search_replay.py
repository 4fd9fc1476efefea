"""The replay harness (scripts/search_replay.py) runs the real search on a handful of
landscapes: the recorded H200 ones and a few modelled ones."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tuneup.settings import Knobs

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "search_replay.py"


@pytest.fixture(scope="module")
def harness():
    spec = importlib.util.spec_from_file_location("search_replay", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["search_replay"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("search_replay", None)


def test_recorded_landscapes_keep_the_measured_speeds(harness):
    lands = {land.name: land for land in harness.recorded()}
    images = lands["h200-images"]
    assert images.kind == "recorded" and images.device == "cuda"
    step, wait, _ = images.step(Knobs())
    assert 256 / step == pytest.approx(1090)  # the defaults' mean over 13 trials
    assert wait > 0.8  # `tuneup watch` measured 88 %
    best = min(images.grid(), key=lambda k: images.value(k, 5000))
    assert best.num_workers >= 8 and best.pin_memory


def test_a_flat_landscape_is_solved_and_the_table_has_each_kind(harness):
    flat = harness.Landscape(name="flat", kind="cpu", device="cpu", cores=2,
                             compute_s={"float32": 0.05}, data_s=0.0, noise=0.02)
    result = harness.replay(flat, 60.0, seed=3)
    assert result.ratio == pytest.approx(1.0, abs=0.03)
    assert result.used_s <= 60.0
    lands = harness.modelled(4, seed=5)
    assert [land.kind for land in lands] == ["gpu", "cpu", "gpu", "cpu"]
    results = [harness.replay(replace(land, name=f"m{i}"), 60.0, seed=i)
               for i, land in enumerate(lands)]
    assert all(0 < r.ratio <= 1.0 + 1e-9 and r.used_s <= 60.0 + 1e-9 for r in results)
    text = harness.table(results)
    assert "| 60 s | gpu | 2 |" in text and "| 60 s | all | 4 |" in text


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_h200_image_landscape_at_60_s_finds_workers_and_pinned_memory(harness, seed):
    """On the H200 the 60 s search kept PyTorch's defaults (12 trials of bf16 and the
    defaults); replayed, the breakdown predicts the workers first."""
    images = next(land for land in harness.recorded() if land.name == "h200-images")
    result = harness.replay(images, 60.0, seed=seed)
    assert result.pick.num_workers >= 8 and result.pick.pin_memory
    assert result.ratio >= 0.85


def test_a_compile_longer_than_the_budget_is_not_reachable(harness):
    """The best point compiles for 90 s: no 60 s search can measure it, so the reachable
    best is an eager point and pick/reachable is judged against that."""
    land = harness.Landscape(name="slow-compile", kind="gpu", compute_s={"float32": 0.05},
                             compile_factor=0.5, compile_s=90.0, startup_s=5.0, noise=0.02)
    best = harness.best_point(land, 5000)
    assert best.compile_mode
    assert harness.reachable_value(land, 60.0, 5000) > land.value(best, 5000)
    assert harness.reachable_value(land, 200.0, 5000) == pytest.approx(land.value(best, 5000))
    result = harness.replay(land, 60.0, seed=1)
    assert result.ratio < result.reachable <= 1.0


def test_exact_windows_keep_the_landscapes_but_their_noise(harness):
    lands = harness.modelled(4, seed=5)
    exact = harness.exact_windows(lands, 0.0)
    assert [land.noise for land in exact] == [0.0] * 4
    assert [replace(land, noise=0.0) for land in lands] == exact
    half = harness.exact_windows(lands, 0.5)
    assert [land.noise for land in half] == pytest.approx([land.noise / 2 for land in lands])


def test_the_5th_percentile_is_the_lowest_of_the_other_95(harness):
    values = [i / 100 for i in range(1, 101)]  # 0.01 .. 1.00
    assert harness.percentile(values) == pytest.approx(0.06)  # five lie below it
    assert harness.worst_share(values) == pytest.approx(0.03)  # the mean of those five
    assert harness.percentile([0.5]) == 0.5


def test_a_negative_noise_scale_is_refused(harness, capsys):
    with pytest.raises(SystemExit) as refused:
        harness.main(["--noise-scale", "-1", "--count", "0"])
    assert refused.value.code == 2
    assert "--noise-scale must be" in capsys.readouterr().err


def test_a_confirmation_with_no_round_left_gives_the_stages_figures_consistently(harness):
    """Real searches whose budget leaves the confirmation no round (the stages' runs then
    give the speed-up): its figures, interval, wording and the defaults' rejection agree."""
    from tuneup.autotune.search import Options, Search, SearchError
    from_stages = 0
    for i, land in enumerate(harness.modelled(40, seed=1)):
        for budget in (60.0, 120.0):
            try:
                outcome = Search(harness.Replay(land, budget, 2 + i), Options()).run()
            except SearchError:
                continue
            if not any("come from the stages' runs" in n for n in outcome.notes):
                continue
            from_stages += 1
            low, high = outcome.speedup_interval
            assert low <= outcome.speedup <= high
            assert outcome.tuned_samples_per_s / outcome.baseline_samples_per_s == \
                pytest.approx(outcome.speedup)
            assert outcome.confirmed == (low > 1)
            prefix = "confirmed" if outcome.confirmed else "not confirmed"
            assert outcome.measured_by.startswith(f"{prefix}: from the stages' runs")
            defaults = [r.reason for r in outcome.rejected if r.trial_id == "defaults"]
            assert all(r.endswith(", confirmed)") for r in defaults) or not outcome.confirmed
    assert from_stages >= 5  # 9 of these 80 searches end so


def test_the_bound_is_the_reachable_best_against_the_best(harness):
    """The 90 s compile is out of a 60 s search's reach: the bound says how far below the
    best even a search that knew the landscape must stay, and pick/best never passes it."""
    land = harness.Landscape(name="slow-compile", kind="gpu", compute_s={"float32": 0.05},
                             compile_factor=0.5, compile_s=90.0, startup_s=5.0, noise=0.02)
    short, long = harness.replay(land, 60.0, seed=1), harness.replay(land, 200.0, seed=1)
    assert short.bound < 1.0 and long.bound == pytest.approx(1.0)
    assert short.ratio <= short.bound + 1e-9
    text = harness.table([short, long])
    assert "bound: worst 5 % reachable/best" in text
    assert f"| {short.bound:.3f} |" in text.splitlines()[2]


def test_a_pick_slower_than_the_defaults_is_counted(harness):
    """A compile that does not repay itself (slower steps, a long cold compile) made the
    pick: the table counts it among the picks slower than PyTorch's defaults; a pick within
    0.1 % of them is not counted."""
    land = harness.Landscape(name="no-gain", kind="cpu", device="cpu", cores=2,
                             compute_s={"float32": 0.05}, compile_factor=1.1, noise=0.02)
    fine = harness.replay(land, 60.0, seed=1)
    assert fine.vs_defaults == pytest.approx(
        land.value(harness.Knobs(), 5000) / land.value(fine.pick, 5000))
    assert fine.vs_defaults >= 1 - 1e-3  # the flat landscape's pick is no slower
    compiled = harness.Knobs(compile_mode="default")
    worse = replace(fine, pick=compiled, vs_defaults=land.value(harness.Knobs(), 5000)
                    / land.value(compiled, 5000))
    assert worse.vs_defaults < 1 - 1e-3
    close = replace(fine, vs_defaults=1 - 5e-4)
    rows = harness.table([fine, worse, close]).splitlines()
    assert rows[0].endswith("slower than the defaults |")
    assert rows[2].endswith("| 1 |")


def test_a_known_compile_sets_the_guess_for_the_search_and_restores_it(harness, monkeypatch):
    from tuneup.autotune.search import budget, run, stages
    guess = budget.COMPILE_GUESS_S
    with harness.compile_guess(45.0):
        assert budget.COMPILE_GUESS_S == stages.COMPILE_GUESS_S == run.COMPILE_GUESS_S == 45.0
    assert budget.COMPILE_GUESS_S == stages.COMPILE_GUESS_S == run.COMPILE_GUESS_S == guess
    with pytest.raises(RuntimeError), harness.compile_guess(45.0):
        raise RuntimeError("a failing search")
    assert run.COMPILE_GUESS_S == guess
    seen = []
    real_run = harness.Search.run

    def spy(search):
        seen.append(run.COMPILE_GUESS_S)
        return real_run(search)

    monkeypatch.setattr(harness.Search, "run", spy)
    land = harness.Landscape(name="known", kind="gpu", compile_s=37.0, noise=0.02)
    harness.replay(land, 60.0, seed=1, compile_known=True)
    harness.replay(land, 60.0, seed=1)
    assert seen == [37.0, guess]


def test_the_best_is_cached_per_landscape_not_per_reused_id(harness):
    """Each cache entry holds its landscape: a landscape made after another was dropped
    cannot take its id() and read its best."""

    def check(compute: float) -> None:
        land = harness.Landscape(name="same-id", kind="cpu", device="cpu", cores=2,
                                 compute_s={"float32": compute}, data_s=0.2)
        values = {k: land.value(k, 5000) for k in land.grid()}
        assert harness.best_point(land, 5000) == min(values, key=values.__getitem__)
        assert harness.reachable_value(land, 60.0, 5000) == min(
            v for k, v in values.items() if land.least_cost(k) <= 60.0)

    for compute in (0.05, 0.01) * 5:  # each landscape is dropped before the next is made
        check(compute)


def test_the_loader_after_a_clear_compile_takes_the_confirmations_share(harness):
    """Seed 1's gpu-078 at 120 s: compile (CUDA graphs) runs 4.7x the defaults on one window
    each and leaves the loop waiting for data 32 % of the step; the loader after it was
    5 s short of its sweep beside the confirmation's reserve, and the pick stayed at two
    workers, 0.74 of the best. The find is clear of noise, so the sweep takes the share."""
    land = harness.modelled(300, seed=1)[78]
    assert land.name == "gpu-078"
    from tuneup.autotune.search import Options, Search
    outcome = Search(harness.Replay(land, 120.0, 1 + 78), Options()).run()
    assert any(n.startswith("loader_after_compile: measured with the confirmation's share")
               and "clearly ahead of the defaults' windows" in n for n in outcome.notes)
    assert not outcome.confirmed  # one window each: the report says so
    assert outcome.knobs.compile_mode and outcome.knobs.num_workers >= 4
    assert land.value(outcome.knobs, 5000) < land.value(
        outcome.knobs.replace(num_workers=2), 5000)
