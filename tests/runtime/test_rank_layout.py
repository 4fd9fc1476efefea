"""A settings file tuned under torchrun with N local ranks, applied by a job that starts
another number: one warning naming the command to re-tune; none for the layout it was tuned
for, or for knobs that are not per rank."""

from __future__ import annotations

import pytest

from tuneup.runtime import apply
from tuneup.settings import Knobs, Measurement, Settings, TuneupWarning, save


def write(tmp_path, monkeypatch, local_ranks, **knobs) -> None:
    path = tmp_path / "train.tuneup.json"
    measured = Measurement(baseline_samples_per_s=100.0, tuned_samples_per_s=150.0,
                           local_ranks=local_ranks)
    save(Settings(knobs=Knobs(**knobs), measured=measured), path)
    monkeypatch.setenv("TUNEUP_SETTINGS", str(path))


@pytest.mark.parametrize(("tuned", "here"), [(2, "4"), (None, "2"), (4, "1")])
def test_another_number_of_local_ranks_is_named_once(tmp_path, monkeypatch, tuned, here):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", here)
    write(tmp_path, monkeypatch, tuned, num_workers=1)
    with pytest.warns(TuneupWarning, match=rf"tuned with {tuned or 1} local rank\(s\) and this "
                                           rf"job runs {here}: .*--nproc-per-node {here}`"):
        assert apply.settings_knobs().num_workers == 1


@pytest.mark.parametrize(("tuned", "here", "knobs"), [
    (2, "2", {"num_workers": 1}),  # the layout it was tuned for
    (None, "1", {"cpu_threads": 1}),  # one process, as tuned
    (2, "4", {"amp_dtype": "bfloat16"}),  # nothing sized per rank
])
def test_the_tuned_layout_or_no_per_rank_knob_is_quiet(tmp_path, monkeypatch, recwarn, tuned,
                                                         here, knobs):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", here)
    write(tmp_path, monkeypatch, tuned, **knobs)
    apply.settings_knobs()
    assert not [w for w in recwarn if "local rank" in str(w.message)]
