"""ResumableSampler: deterministic epochs, and a resumed sampler continues exactly where it stopped."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl.data.sampler import ResumableSampler


def test_in_order_by_hand():
    s = ResumableSampler(5, batch_size=2, shuffle=False, drop_last=False)
    assert s.steps_per_epoch == 3  # ceil(5 / 2)
    assert list(s) == [[0, 1], [2, 3], [4]]
    assert (s.epoch, s.position) == (1, 0)
    assert list(s) == [[0, 1], [2, 3], [4]]
    d = ResumableSampler(5, batch_size=2, shuffle=False, drop_last=True)
    assert d.steps_per_epoch == 2 and list(d) == [[0, 1], [2, 3]]


def test_epoch_is_a_seeded_permutation():
    s = ResumableSampler(10, batch_size=3, shuffle=True, seed=7, drop_last=False)
    epoch0, epoch1 = list(s), list(s)
    assert sorted(itertools.chain(*epoch0)) == list(range(10)) == sorted(itertools.chain(*epoch1))
    assert epoch0 != epoch1  # a new order each epoch
    again = ResumableSampler(10, batch_size=3, shuffle=True, seed=7, drop_last=False)
    assert list(again) == epoch0
    assert list(ResumableSampler(10, batch_size=3, shuffle=True, seed=8, drop_last=False)) != epoch0


def test_iteration_mid_epoch_gives_the_rest():
    s = ResumableSampler(6, batch_size=2, shuffle=False)
    assert s.next_indices() == [0, 1]
    assert list(s) == [[2, 3], [4, 5]]
    assert s.state_dict() == {
        "epoch": 1,
        "position": 0,
        "seed": 0,
        "n": 6,
        "batch_size": 2,
    }


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 40),
    batch_size=st.integers(1, 45),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**31),
    data=st.data(),
)
def test_resume_gives_the_same_batches(n, batch_size, shuffle, drop_last, seed, data):
    if drop_last and batch_size > n:
        batch_size = n

    def make():
        return ResumableSampler(n, batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last)

    steps = make().steps_per_epoch
    stop = data.draw(st.integers(0, 3 * steps), label="stop")  # mid-epoch and on epoch boundaries
    total = stop + data.draw(st.integers(1, 2 * steps + 1), label="more")

    uninterrupted = make()
    expected = [uninterrupted.next_indices() for _ in range(total)]

    first = make()
    taken = [first.next_indices() for _ in range(stop)]
    state = json.loads(json.dumps(first.state_dict()))  # as stored in a checkpoint
    resumed = make()
    resumed.load_state_dict(state)
    rest = [resumed.next_indices() for _ in range(total - stop)]
    assert taken + rest == expected
    if drop_last:
        assert all(len(b) == batch_size for b in expected)


def test_bad_arguments_and_state():
    with pytest.raises(ValueError, match=r"batch_size=8 is larger than the data set \(5 rows\)"):
        ResumableSampler(5, batch_size=8, shuffle=True)
    with pytest.raises(ValueError, match="data set is empty"):
        ResumableSampler(0, batch_size=1, shuffle=True)
    s = ResumableSampler(10, batch_size=2, shuffle=True)
    with pytest.raises(ValueError, match="sampler state has n=12, but this sampler has n=10"):
        s.load_state_dict({"epoch": 0, "position": 0, "seed": 0, "n": 12, "batch_size": 2})
    with pytest.raises(ValueError, match=r"position=5 is outside 0..4"):
        s.load_state_dict({"epoch": 0, "position": 5, "seed": 0})
    with pytest.raises(ValueError, match=r"lacks \['seed'\]"):
        s.load_state_dict({"epoch": 0, "position": 0})
