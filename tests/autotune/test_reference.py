"""Check batches of types weights-only loading refuses (a tokenizer's ``BatchEncoding``)
still give check losses, when the file is this user's alone."""

from __future__ import annotations

import os
from collections import UserDict

import torch

from tuneup.autotune.reference import load_own, written_by_us


class Encoding(UserDict):
    """What ``tokenizer.pad`` and ``DataCollatorWithPadding`` return, in miniature."""

    def __getattr__(self, name):
        if name == "data":  # not set yet while unpickling
            raise AttributeError(name)
        try:
            return self.data[name]
        except KeyError:
            raise AttributeError(name) from None


def batches() -> list[Encoding]:
    return [Encoding(input_ids=torch.arange(6).view(2, 3), labels=torch.tensor([0, 1]))]


def test_a_batch_type_weights_only_refuses_is_loaded_from_our_own_folder(tmp_path):
    folder = tmp_path / "work"
    folder.mkdir(mode=0o700)
    path = folder / "reference.pt.batches"
    torch.save(batches(), path)
    loaded = load_own(path)
    assert type(loaded[0]) is Encoding and torch.equal(loaded[0].input_ids,
                                                       batches()[0].input_ids)


def test_plain_tensors_stay_weights_only_wherever_they_lie(tmp_path):
    os.chmod(tmp_path, 0o777)
    path = tmp_path / "plain.pt"
    torch.save([torch.ones(2)], path)
    assert torch.equal(load_own(path)[0], torch.ones(2))


def test_a_file_others_could_have_written_is_never_unpickled(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # anyone could have put it there
    path = shared / "reference.pt.batches"
    torch.save(batches(), path)
    assert not written_by_us(path) and load_own(path) is None
    link = tmp_path / "link.batches"
    os.symlink(path, link)
    assert not written_by_us(link)
