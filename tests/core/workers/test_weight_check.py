"""verl.workers.weight_check: fingerprints that add up over any split of a tensor, and the driver's verdict over
tensor-parallel replicas (sharded and replicated parameters, a changed shard, a parameter never sent)."""

from __future__ import annotations

import torch

from verl.workers.weight_check import Recorder, Report, Target, add, compare, due, fingerprint


def _sum(fps):
    total = (0, 0)
    for fp in fps:
        total = add(total, fp)
    return total


def test_a_fingerprint_is_the_sum_of_its_shards_however_the_tensor_is_split():
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        w = torch.randn(12, 10, generator=g).to(dtype)
        assert fingerprint(w) == _sum(fingerprint(s) for s in w.chunk(3, dim=0))  # column-parallel rows
        assert fingerprint(w) == _sum(fingerprint(s) for s in w.chunk(2, dim=1))  # row-parallel columns
        assert fingerprint(w) == fingerprint(w.t())  # a layout change (not a check of element order)
        q, k, v = w[:6], w[6:9], w[9:]
        assert fingerprint(torch.cat([q, k, v])) == _sum(map(fingerprint, (q, k, v)))  # fused qkv
        padded = torch.cat([w, torch.zeros(4, 10, dtype=dtype)])  # vocabulary padding rows
        assert fingerprint(padded) == fingerprint(w)


def test_one_changed_bit_changes_the_fingerprint():
    w = torch.randn(64, 64)
    bits = w.clone().view(torch.int32)
    for flip in (1, 1 << 22, 1 << 31):  # the lowest mantissa bit, the highest, the sign
        changed = bits.clone()
        changed[17, 5] ^= flip
        assert fingerprint(changed.view(torch.float32)) != fingerprint(w)


def test_the_expected_side_is_cast_to_the_dtype_each_parameter_holds():
    w = torch.randn(8, 8)
    recorder = Recorder(lambda name: Target("fused", torch.bfloat16))
    list(recorder.observe([("a", w[:4]), ("b", w[4:])]))
    assert recorder.expected == {"fused": fingerprint(w.bfloat16())}


def _report(expected, actual):
    return Report(1, expected, actual)


def test_replicas_of_two_ranks_sharded_and_replicated_parameters():
    g = torch.Generator().manual_seed(1)
    proj, norm = torch.randn(8, 4, generator=g), torch.randn(4, generator=g)
    sent = {"proj": fingerprint(proj), "norm": fingerprint(norm)}
    rank = [{"proj": fingerprint(half), "norm": fingerprint(norm)} for half in proj.chunk(2)]
    good = compare([_report(sent, rank[0]), _report(sent, rank[1])] * 2, replica_size=2)
    assert good.problems == [] and good.checked == 4 and good.unchecked == []

    stale = dict(rank[1], proj=fingerprint(torch.zeros(4, 4)))  # rank 3's shard never loaded
    verdict = compare([_report(sent, r) for r in (rank[0], rank[1], rank[0], stale)], replica_size=2)
    assert verdict.problems == ["proj on rank(s) 2, 3: holds other values than it was sent"]


def test_unsent_unheld_and_unreadable_parameters():
    w = torch.randn(3, 3)
    sent = {"a": fingerprint(w), "b": fingerprint(w), "c": fingerprint(w)}
    held = {"a": fingerprint(w), "c": None, "old": fingerprint(w)}  # b missing, c packed away, old never sent
    verdict = compare([_report(sent, held)], replica_size=1, ranks=[5])
    assert verdict.problems == [
        "old on rank(s) 5: not sent, so it still holds older values",
        "b on rank(s) 5: sent, but the engine holds no such parameter",
    ]
    assert verdict.unchecked == ["c"] and verdict.checked == 1


def test_ranks_fed_different_streams_are_named():
    one, two = {"a": fingerprint(torch.ones(2))}, {"a": fingerprint(torch.zeros(2) + 2)}
    verdict = compare([_report(one, one), _report(two, two)], replica_size=1)
    assert verdict.problems == ["rank 1 was sent other tensors than rank 0: a"]


def test_every_nth_sync_is_checked():
    assert [n for n in range(1, 8) if due(n, 3)] == [3, 6]
    assert not any(due(n, 0) for n in range(1, 8)) and all(due(n, 1) for n in range(1, 8))


def test_a_scaled_target_is_fingerprinted_as_its_loader_scales_it():
    b = torch.randn(6, 4)
    recorder = Recorder(lambda name: Target("slot.lora_b.0", torch.bfloat16, 2.5))
    list(recorder.observe([("b", b)]))
    assert recorder.expected == {"slot.lora_b.0": fingerprint((b * 2.5).bfloat16())}


def test_a_zero_tensor_the_engine_lists_nowhere_is_held():
    """vLLM lists only the LoRA slices that hold something: a B matrix still all zeros (an adapter before its first
    update, or one whose gradient was zero) is not missing."""
    zero, w = fingerprint(torch.zeros(4, 8)), fingerprint(torch.randn(4, 8))
    verdict = compare([_report({"b": zero, "a": w}, {"a": w})], replica_size=1)
    assert verdict.problems == [] and verdict.checked == 2
