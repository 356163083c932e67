"""Tests for verl.protocol.DataProto: exact values per operation, error messages, edge sizes, pickling."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from verl.protocol import DataProto


def make(n: int, meta: dict | None = None) -> DataProto:
    """Rows i have x=[i, 10i], mask=i%2, prompt='p{i}', uid=i (int64 array)."""
    return DataProto.from_dict(
        tensors={
            "x": torch.stack([torch.arange(n), 10 * torch.arange(n)], dim=1),
            "mask": (torch.arange(n) % 2).bool(),
        },
        non_tensors={"prompt": [f"p{i}" for i in range(n)], "uid": np.arange(n)},
        meta_info={"step": 3} if meta is None else meta,
    )


def rows(dp: DataProto) -> list[int]:
    """The row ids of a DataProto built by make(), checked consistent across all its fields."""
    ids = dp.batch["x"][:, 0].tolist()
    assert dp.batch["x"][:, 1].tolist() == [10 * i for i in ids]
    assert dp.batch["mask"].tolist() == [bool(i % 2) for i in ids]
    assert dp.non_tensor_batch["prompt"].tolist() == [f"p{i}" for i in ids]
    assert dp.non_tensor_batch["uid"].tolist() == ids
    return ids


def assert_same(a: DataProto, b: DataProto) -> None:
    assert len(a) == len(b)
    assert a.tensor_keys == b.tensor_keys
    for key in a.tensor_keys:
        assert a.batch[key].dtype == b.batch[key].dtype
        assert torch.equal(a.batch[key], b.batch[key]), key
    assert list(a.non_tensor_batch) == list(b.non_tensor_batch)
    for key, value in a.non_tensor_batch.items():
        assert value.dtype == b.non_tensor_batch[key].dtype
        assert value.tolist() == b.non_tensor_batch[key].tolist(), key
    assert a.meta_info == b.meta_info


# ---------------------------------------------------------------------- construction


def test_from_dict_fields_and_len():
    dp = make(3)
    assert len(dp) == 3
    assert isinstance(dp.batch, TensorDict) and list(dp.batch.batch_size) == [3]
    assert dp.batch["x"].tolist() == [[0, 0], [1, 10], [2, 20]]
    assert dp.non_tensor_batch["prompt"].dtype == object
    assert dp.non_tensor_batch["uid"].dtype == np.int64
    assert dp.meta_info == {"step": 3}


def test_from_dict_list_of_lists_becomes_1d_object_array():
    dp = DataProto.from_dict(non_tensors={"gt": [[1, 2], [3, 4]]})
    assert dp.non_tensor_batch["gt"].shape == (2,)
    assert dp.non_tensor_batch["gt"][1] == [3, 4]
    assert dp.batch is None and len(dp) == 2


def test_from_dict_length_mismatch_names_key_and_lengths():
    with pytest.raises(ValueError, match=r"tensor 'b' has length 3.*'a' has length 4"):
        DataProto.from_dict({"a": torch.zeros(4), "b": torch.zeros(3)})
    with pytest.raises(ValueError, match=r"non-tensor 'uid' has length 2.*tensor 'a' has length 4"):
        DataProto.from_dict({"a": torch.zeros(4)}, {"uid": ["u", "v"]})


def test_constructor_validates_non_tensor_length():
    td = TensorDict({"a": torch.zeros(4)}, batch_size=[4])
    with pytest.raises(ValueError, match=r"non-tensor 'uid' has length 1"):
        DataProto(batch=td, non_tensor_batch={"uid": np.array(["x"], dtype=object)})


def test_from_dict_rejects_bad_types_naming_key():
    with pytest.raises(TypeError, match="'a'"):
        DataProto.from_dict({"a": [1, 2]})
    with pytest.raises(TypeError, match="'uid'"):
        DataProto.from_dict(non_tensors={"uid": torch.zeros(2)})
    with pytest.raises(ValueError, match="'s'"):
        DataProto.from_dict({"s": torch.tensor(1.0)})


def test_empty_and_meta_only():
    assert len(DataProto()) == 0
    dp = DataProto.from_dict(meta_info={"k": 1})
    assert len(dp) == 0 and dp.batch is None and dp.meta_info == {"k": 1}


def test_from_dict_copies_meta_info():
    meta = {"k": 1}
    dp = DataProto.from_dict({"a": torch.zeros(1)}, meta_info=meta)
    dp.meta_info["k"] = 2
    assert meta == {"k": 1}


def test_repr_is_short_and_names_keys():
    text = repr(make(4))
    assert "len=4" in text and "x: (4, 2) int64" in text and "prompt: (4,) object" in text and "step" in text
    assert "tensor(" not in text  # no values dumped


# ---------------------------------------------------------------------- select / pop / union


def test_select_keeps_named_keys():
    dp = make(3, meta={"a": 1, "b": 2})
    out = dp.select(tensor_keys=["x"], non_tensor_keys=["uid"], meta_keys=["b"])
    assert out.tensor_keys == ["x"] and list(out.non_tensor_batch) == ["uid"] and out.meta_info == {"b": 2}
    assert out.batch["x"].tolist() == [[0, 0], [1, 10], [2, 20]]
    assert dp.tensor_keys == ["x", "mask"] and dp.meta_info == {"a": 1, "b": 2}  # input untouched


def test_select_none_keeps_all_and_empty_list_keeps_none():
    dp = make(2)
    assert_same(dp.select(), dp)
    out = dp.select(tensor_keys=[], non_tensor_keys=["prompt"])
    assert out.batch is None and len(out) == 2 and out.non_tensor_batch["prompt"].tolist() == ["p0", "p1"]


@pytest.mark.parametrize(
    "kwargs, kind, key",
    [
        ({"tensor_keys": ["nope"]}, "tensor", "nope"),
        ({"non_tensor_keys": ["gone"]}, "non-tensor", "gone"),
        ({"meta_keys": ["missing"]}, "meta", "missing"),
    ],
)
def test_select_unknown_key_names_it_and_lists_existing(kwargs, kind, key):
    with pytest.raises(KeyError, match=rf"unknown {kind} key '{key}'.*\[") as info:
        make(2).select(**kwargs)
    existing = {"tensor": ["mask", "x"], "non-tensor": ["prompt", "uid"], "meta": ["step"]}[kind]
    assert str(existing) in str(info.value)


def test_select_on_empty_and_size_one():
    assert rows(make(0).select(tensor_keys=["x", "mask"])) == []
    out = make(1).select(non_tensor_keys=["uid"])
    assert out.non_tensor_batch["uid"].tolist() == [0] and out.batch["x"].tolist() == [[0, 0]]


def test_pop_removes_from_self_and_returns_popped():
    dp = make(2, meta={"a": 1, "b": 2})
    popped = dp.pop(tensor_keys=["mask"], non_tensor_keys=["prompt"], meta_keys=["a"])
    assert popped.tensor_keys == ["mask"] and popped.batch["mask"].tolist() == [False, True]
    assert list(popped.non_tensor_batch) == ["prompt"] and popped.meta_info == {"a": 1}
    assert dp.tensor_keys == ["x"] and list(dp.non_tensor_batch) == ["uid"] and dp.meta_info == {"b": 2}
    assert len(dp) == 2


def test_pop_none_pops_nothing_and_all_tensors_leaves_batch_none():
    dp = make(2)
    assert len(dp.pop()) == 0 and dp.tensor_keys == ["x", "mask"]
    dp.pop(tensor_keys=["x", "mask"])
    assert dp.batch is None and len(dp) == 2  # length now from the non-tensors


def test_pop_unknown_key_leaves_self_untouched():
    dp = make(2)
    with pytest.raises(KeyError, match="'zzz'"):
        dp.pop(tensor_keys=["x"], non_tensor_keys=["zzz"])
    assert dp.tensor_keys == ["x", "mask"] and list(dp.non_tensor_batch) == ["prompt", "uid"]


def test_union_merges_keys():
    dp = make(3)
    a = dp.select(tensor_keys=["x"], non_tensor_keys=["uid"], meta_keys=[])
    b = dp.select(tensor_keys=["mask", "x"], non_tensor_keys=["prompt"])
    out = a.union(b)
    assert sorted(out.tensor_keys) == ["mask", "x"] and sorted(out.non_tensor_batch) == ["prompt", "uid"]
    assert rows(out) == [0, 1, 2] and out.meta_info == {"step": 3}
    assert a.tensor_keys == ["x"] and a.meta_info == {}  # inputs untouched


def test_union_conflicts_name_the_key():
    dp = make(2)
    other = DataProto.from_dict({"x": torch.zeros(2, 2, dtype=torch.int64)})
    with pytest.raises(ValueError, match="tensor 'x'"):
        dp.union(other)
    with pytest.raises(ValueError, match="non-tensor 'prompt'"):
        dp.union(DataProto.from_dict(non_tensors={"prompt": ["p0", "other"]}))
    with pytest.raises(ValueError, match="meta_info 'step'"):
        dp.union(DataProto.from_dict(meta_info={"step": 4}))


def test_union_length_mismatch():
    with pytest.raises(ValueError, match="equal lengths, got 2 and 3"):
        make(2).union(make(3))


def test_union_empty_size_one_and_meta_only():
    assert rows(make(0).union(make(0))) == []
    one = make(1).union(DataProto.from_dict({"y": torch.tensor([7.0])}))
    assert one.batch["y"].tolist() == [7.0] and rows(one) == [0]
    # A DataProto with no row data has no length to disagree with.
    out = make(2).union(DataProto.from_dict(meta_info={"temperature": 0.7}))
    assert out.meta_info == {"step": 3, "temperature": 0.7} and rows(out) == [0, 1]


def test_union_treats_equal_nan_and_object_arrays_as_equal():
    t = torch.tensor([float("nan"), 1.0])
    a = DataProto.from_dict({"t": t}, {"gt": [np.array([1, 2]), {"k": [1]}]})
    b = DataProto.from_dict({"t": t.clone()}, {"gt": [np.array([1, 2]), {"k": [1]}]})
    assert len(a.union(b)) == 2
    c = DataProto.from_dict({"t": t.clone()}, {"gt": [np.array([1, 3]), {"k": [1]}]})
    with pytest.raises(ValueError, match="'gt'"):
        a.union(c)


# ---------------------------------------------------------------------- rows


def test_getitem_int_returns_size_one():
    dp = make(4)
    assert rows(dp[2]) == [2] and rows(dp[-1]) == [3]
    assert dp[0].meta_info == {"step": 3}
    with pytest.raises(IndexError, match="index 4 out of range.*length 4"):
        dp[4]
    with pytest.raises(IndexError):
        make(0)[0]


def test_getitem_slice_list_array_tensor_mask():
    dp = make(5)
    assert rows(dp[1:4]) == [1, 2, 3]
    assert rows(dp[::2]) == [0, 2, 4]
    assert rows(dp[::-1]) == [4, 3, 2, 1, 0]
    assert rows(dp[[3, 0, 3]]) == [3, 0, 3]
    assert rows(dp[np.array([4, -5])]) == [4, 0]
    assert rows(dp[torch.tensor([1, 2])]) == [1, 2]
    assert rows(dp[torch.tensor([True, False, False, True, False])]) == [0, 3]
    assert rows(dp[[]]) == []
    assert rows(dp.slice(1, None, 3)) == [1, 4]


def test_getitem_bad_indices():
    dp = make(3)
    with pytest.raises(IndexError, match="index 3 out of range"):
        dp[[0, 3]]
    with pytest.raises(IndexError, match="mask has length 2"):
        dp[np.array([True, False])]
    with pytest.raises(IndexError, match="1-D"):
        dp[torch.zeros(2, 2, dtype=torch.long)]
    with pytest.raises(IndexError, match="integers or booleans"):
        dp[np.array([0.5])]


def test_non_tensor_only_indexing():
    dp = DataProto.from_dict(non_tensors={"s": ["a", "b", "c"]})
    assert dp[[2, 0]].non_tensor_batch["s"].tolist() == ["c", "a"] and dp[[2, 0]].batch is None


def test_reorder():
    dp = make(4)
    out = dp.reorder(torch.tensor([2, 0, 3, 1]))
    assert rows(out) == [2, 0, 3, 1] and out.meta_info == {"step": 3}
    assert rows(dp) == [0, 1, 2, 3]  # input untouched
    assert rows(dp.reorder([3, 2, 1, 0])) == [3, 2, 1, 0]
    assert rows(make(0).reorder([])) == []
    assert rows(make(1).reorder(np.array([0]))) == [0]
    with pytest.raises(TypeError):
        dp.reorder(1)


def test_repeat_interleave_and_tile():
    dp = DataProto.from_dict({"a": torch.tensor([1, 2])}, {"p": ["x", "y"]}, {"n": 2})
    inter = dp.repeat(2, interleave=True)
    assert inter.batch["a"].tolist() == [1, 1, 2, 2] and inter.non_tensor_batch["p"].tolist() == ["x", "x", "y", "y"]
    tiled = dp.repeat(3, interleave=False)
    assert tiled.batch["a"].tolist() == [1, 2, 1, 2, 1, 2]
    assert tiled.non_tensor_batch["p"].tolist() == ["x", "y", "x", "y", "x", "y"]
    assert inter.meta_info == {"n": 2} and dp.batch["a"].tolist() == [1, 2]


def test_repeat_edge_sizes():
    assert rows(make(1).repeat(3)) == [0, 0, 0]
    assert rows(make(1).repeat(3, interleave=False)) == [0, 0, 0]
    assert rows(make(0).repeat(4)) == []
    assert rows(make(3).repeat(0)) == []
    assert rows(make(2).repeat(1)) == [0, 1]
    with pytest.raises(ValueError, match="-1"):
        make(2).repeat(-1)


def test_repeat_copies_rows():
    dp = make(2)
    out = dp.repeat(2)
    out.batch["x"][0, 0] = 99
    assert dp.batch["x"][0, 0].item() == 0


def test_chunk_sizes_uneven_earlier_larger():
    pieces = make(7).chunk(3)
    assert [rows(p) for p in pieces] == [[0, 1, 2], [3, 4], [5, 6]]
    assert all(p.meta_info == {"step": 3} for p in pieces)


def test_chunk_even_and_more_chunks_than_rows():
    assert [rows(p) for p in make(4).chunk(2)] == [[0, 1], [2, 3]]
    assert [rows(p) for p in make(2).chunk(4)] == [[0], [1], [], []]
    assert [rows(p) for p in make(0).chunk(3)] == [[], [], []]
    assert [rows(p) for p in make(1).chunk(1)] == [[0]]
    empty_piece = make(2).chunk(3)[2]
    assert tuple(empty_piece.batch["x"].shape) == (0, 2)  # trailing shape kept so concat works


@pytest.mark.parametrize("n", [0, -1])
def test_chunk_rejects_non_positive(n):
    with pytest.raises(ValueError, match=f"chunks > 0, got {n}"):
        make(3).chunk(n)


def test_split():
    assert [rows(p) for p in make(5).split(2)] == [[0, 1], [2, 3], [4]]
    assert [rows(p) for p in make(4).split(2)] == [[0, 1], [2, 3]]
    assert [rows(p) for p in make(2).split(5)] == [[0, 1]]
    assert [rows(p) for p in make(1).split(1)] == [[0]]
    assert [rows(p) for p in make(0).split(3)] == [[]]
    with pytest.raises(ValueError, match="split_size > 0, got 0"):
        make(2).split(0)


def test_concat():
    out = DataProto.concat([make(3)[[2, 1]], make(3)[0], make(4)[3:]])
    assert rows(out) == [2, 1, 0, 3] and out.meta_info == {"step": 3}


def test_concat_with_empty_and_size_one():
    assert rows(DataProto.concat([make(0), make(2), make(0)])) == [0, 1]
    assert rows(DataProto.concat([make(0)])) == []
    assert rows(DataProto.concat([make(1)])) == [0]
    assert rows(DataProto.concat([make(1), make(1)])) == [0, 0]


def test_concat_non_tensor_only():
    out = DataProto.concat(
        [DataProto.from_dict(non_tensors={"s": ["a"]}), DataProto.from_dict(non_tensors={"s": ["b"]})]
    )
    assert out.batch is None and out.non_tensor_batch["s"].tolist() == ["a", "b"]


def test_concat_key_mismatch_names_key_and_item():
    with pytest.raises(ValueError, match="item 1 is missing tensor key 'mask'"):
        DataProto.concat([make(2), make(2).select(tensor_keys=["x"])])
    with pytest.raises(ValueError, match="item 2 is missing non-tensor key 'uid'"):
        DataProto.concat([make(2), make(1), make(2).select(non_tensor_keys=["prompt"])])
    extra = make(2).union(DataProto.from_dict({"extra": torch.zeros(2)}))
    with pytest.raises(ValueError, match="item 1 has tensor key 'extra' that item 0 lacks"):
        DataProto.concat([make(2), extra])
    with pytest.raises(ValueError, match="at least one"):
        DataProto.concat([])


def test_concat_meta_merged_and_conflicts_error():
    out = DataProto.concat([make(1, meta={"a": 1}), make(1, meta={"a": 1, "b": 2})])
    assert out.meta_info == {"a": 1, "b": 2}
    with pytest.raises(ValueError, match="meta_info 'a' of item 1"):
        DataProto.concat([make(1, meta={"a": 1}), make(1, meta={"a": 2})])


def test_concat_shape_mismatch_names_key():
    a = DataProto.from_dict({"resp": torch.zeros(2, 3)})
    b = DataProto.from_dict({"resp": torch.zeros(2, 4)})
    with pytest.raises(ValueError, match="tensor 'resp' cannot be concatenated"):
        DataProto.concat([a, b])


def test_to_device_returns_new():
    dp = make(2)
    out = dp.to("cpu")
    assert out is not dp and out.batch.device == torch.device("cpu") and rows(out) == [0, 1]
    assert DataProto.from_dict(non_tensors={"s": ["a"]}).to("cpu").non_tensor_batch["s"].tolist() == ["a"]


def test_derived_meta_info_is_a_copy():
    dp = make(2)
    piece = dp.chunk(2)[0]
    piece.meta_info["new"] = 1
    assert "new" not in dp.meta_info


# ---------------------------------------------------------------------- pickling


def test_pickle_round_trip_exact():
    dp = DataProto.from_dict(
        {"ids": torch.arange(12).view(4, 3), "f": torch.randn(4, 2, dtype=torch.float32), "m": torch.ones(4).bool()},
        {"prompt": ["a", "b", "c", "d"], "gt": [[1], {"x": 2}, None, 3.5], "score": np.arange(4.0)},
        {"temperature": 0.7, "nested": {"k": [1, 2]}},
    )
    out = pickle.loads(pickle.dumps(dp))
    assert_same(out, dp)
    assert out.non_tensor_batch["gt"].tolist() == [[1], {"x": 2}, None, 3.5]
    assert list(out.batch.batch_size) == [4]


def test_pickle_size_close_to_raw_bytes():
    dp = DataProto.from_dict({"input_ids": torch.randint(0, 50_000, (1000, 256), dtype=torch.int64)})
    raw = 1000 * 256 * 8
    payload = pickle.dumps(dp)
    assert raw <= len(payload) <= 1.1 * raw
    assert torch.equal(pickle.loads(payload).batch["input_ids"], dp.batch["input_ids"])


def test_pickle_of_a_view_ships_only_its_rows():
    dp = DataProto.from_dict({"input_ids": torch.arange(1000 * 256).view(1000, 256)})
    piece = dp.chunk(10)[3]
    payload = pickle.dumps(piece)
    assert len(payload) <= 1.1 * 100 * 256 * 8
    assert torch.equal(pickle.loads(payload).batch["input_ids"], dp.batch["input_ids"][300:400])
    strided = dp[::100]  # non-contiguous rows
    assert torch.equal(pickle.loads(pickle.dumps(strided)).batch["input_ids"], dp.batch["input_ids"][::100])


def test_pickle_without_tensors_and_empty():
    dp = DataProto.from_dict(non_tensors={"s": ["a", "b"]}, meta_info={"k": 1})
    out = pickle.loads(pickle.dumps(dp))
    assert out.batch is None and out.non_tensor_batch["s"].tolist() == ["a", "b"] and out.meta_info == {"k": 1}
    assert_same(pickle.loads(pickle.dumps(make(0))), make(0))
    assert len(pickle.loads(pickle.dumps(DataProto()))) == 0


# ---------------------------------------------------------------------- properties


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 20), chunks=st.integers(1, 8), size=st.integers(1, 8))
def test_property_chunk_and_split_then_concat_is_identity(n, chunks, size):
    dp = make(n)
    pieces = dp.chunk(chunks)
    lengths = [len(p) for p in pieces]
    assert len(pieces) == chunks and sum(lengths) == n
    assert max(lengths) - min(lengths) <= 1 and lengths == sorted(lengths, reverse=True)
    assert_same(DataProto.concat(pieces), dp)
    split = dp.split(size)
    if n == 0:
        assert [len(p) for p in split] == [0]
    else:
        assert all(len(p) == size for p in split[:-1]) and 0 < len(split[-1]) <= size
    assert_same(DataProto.concat(split), dp)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 12), times=st.integers(1, 4), interleave=st.booleans())
def test_property_repeat_then_reorder_back(n, times, interleave):
    dp = make(n)
    rep = dp.repeat(times, interleave=interleave)
    assert len(rep) == n * times
    # Group the copies by source row: every group is `times` copies of that row.
    order = sorted(range(n * times), key=lambda j: rep.non_tensor_batch["uid"][j])
    grouped = rep.reorder(order)
    assert rows(grouped) == [i for i in range(n) for _ in range(times)]
    first_copies = grouped[list(range(0, n * times, times))]
    assert_same(first_copies, dp)


@settings(max_examples=60, deadline=None)
@given(perm=st.permutations(list(range(10))))
def test_property_reorder_by_permutation_and_inverse(perm):
    dp = make(10)
    shuffled = dp.reorder(perm)
    assert rows(shuffled) == list(perm)
    inverse = np.argsort(np.array(perm))
    assert_same(shuffled.reorder(inverse), dp)
