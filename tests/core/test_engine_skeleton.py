"""verl.engine_skeleton, the skeleton every train engine shares, on plain tensors (the engines: tests/engines/)."""

from __future__ import annotations

import random

import pytest
import torch

from tests.support.engines import gloo_world_one  # noqa: F401
from verl.config.schema import OptimConfig
from verl.engine_protocol import EngineConfig
from verl.engine_skeleton import Accumulator, TrainState, load_extra, micro_batches, optimizer_step, save_extra
from verl.protocol import DataProto


def _rows(n: int) -> DataProto:
    return DataProto.from_dict({"x": torch.arange(float(n))[:, None]})


def test_accumulator_weights_each_micro_batch_by_its_rows():
    def loss_fn(outputs, mb):
        loss = mb.batch["x"].mean()
        return loss, {"loss": float(loss)}

    acc = Accumulator(4, loss_fn)
    batch = _rows(4)
    weighted = [acc({}, mb) for mb in batch.split(3)]  # rows 0-2 (mean 1), row 3 (mean 3)
    assert [float(w) for w in weighted] == pytest.approx([1 * 3 / 4, 3 * 1 / 4])
    assert acc.totals == pytest.approx({"loss": 1.5})  # the whole batch's mean


def test_a_token_weighted_loss_weighs_micro_batches_by_their_tokens():
    """token-mean over micro-batches of 1 and 3 response tokens: shares 1/4 and 3/4, the whole batch's mean."""
    batch = DataProto.from_dict(
        {"x": torch.tensor([[1.0, 0.0], [2.0, 3.0]]), "response_mask": torch.tensor([[1, 0], [1, 1]])}
    )

    def loss_fn(outputs, mb):
        m = mb.batch["response_mask"]
        loss = (mb.batch["x"] * m).sum() / m.sum()
        return loss, {"loss": float(loss)}

    loss_fn.weight_by = "tokens"
    acc = Accumulator.for_batch(batch, loss_fn)
    weighted = [float(acc({}, mb)) for mb in batch.split(1)]
    assert weighted == pytest.approx([1.0 * 1 / 3, 2.5 * 2 / 3])
    assert sum(weighted) == pytest.approx((1 + 2 + 3) / 3) and acc.totals["loss"] == pytest.approx(2.0)


def _rows_of(lengths: list) -> DataProto:
    mask = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    return DataProto.from_dict({"attention_mask": mask, "row": torch.arange(len(lengths))})


def test_token_budget_micro_batches_by_hand():
    """Rows of 3, 5, 2, 4 and 9 tokens under a budget of 8: [3, 5], [2, 4], [9] (over the budget: alone)."""
    batch = _rows_of([3, 5, 2, 4, 9])
    pieces = micro_batches(batch, micro_batch_size=2, max_tokens=8)
    assert [p.batch["row"].tolist() for p in pieces] == [[0, 1], [2, 3], [4]]
    assert [len(p) for p in micro_batches(batch, micro_batch_size=2)] == [2, 2, 1]  # no budget: by rows


def test_token_budget_micro_batches_are_balanced_and_come_in_multiples():
    """As few micro-batches as the budget needs, the tokens balanced over them: rows of 6, 1, 1, 6 under 8 are
    [6, 1], [1, 6] (filling up to the budget would give [6, 1, 1], [6]); rounded up to a multiple of 2 for an
    interleaved pipeline, 3, 5, 2, 4, 9 make [3], [5], [2, 4], [9] (the largest pieces as small as 4 allow)."""
    rows = lambda pieces: [p.batch["row"].tolist() for p in pieces]  # noqa: E731
    assert rows(micro_batches(_rows_of([6, 1, 1, 6]), 1, max_tokens=8)) == [[0, 1], [2, 3]]
    assert rows(micro_batches(_rows_of([3, 5, 2, 4, 9]), 1, max_tokens=8, multiple=2)) == [[0], [1], [2, 3], [4]]
    # 3 asked, but a cap of 4 makes 2 and one of 3 makes 4: the piece of most tokens with rows to part is halved
    assert rows(micro_batches(_rows_of([2, 2, 2, 2]), 1, max_tokens=8, multiple=3)) == [[0], [1], [2, 3]]
    with pytest.raises(ValueError, match="cannot make 2 micro-batches"):
        micro_batches(_rows_of([4]), 1, max_tokens=8, multiple=2)


def test_token_budget_micro_batches_cut_between_prompt_groups():
    """Rows of one prompt stay in one micro-batch where their group fits (shared-prefix packing computes the
    prompt once): groups of 6, 10 and 4 tokens under 11 make [6], [10], [4] (by rows alone, [3, 3, 5], [5, 2, 2]
    would part the middle group); a group over the budget is cut by rows."""
    P = 2
    lengths = [3, 3, 5, 5, 2, 2]  # prompt (2 tokens, one per group) + response
    ids = torch.zeros(6, P + 4, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :P] = 10 + row // 2  # the group's prompt
        ids[row, P:n] = 20 + row
        mask[row, :n] = 1
    batch = DataProto.from_dict(
        {"input_ids": ids, "attention_mask": mask, "responses": ids[:, P:], "row": torch.arange(6)}
    )
    rows = lambda pieces: [p.batch["row"].tolist() for p in pieces]  # noqa: E731
    assert rows(micro_batches(batch, 1, max_tokens=11)) == [[0, 1], [2, 3], [4, 5]]
    assert rows(micro_batches(batch, 1, max_tokens=8)) == [[0, 1], [2], [3], [4, 5]]  # the 10-token group by rows


def test_a_non_finite_norm_skips_the_update_but_not_the_schedule():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    cfg = EngineConfig(model_path="m", optim=OptimConfig(lr=1.0, warmup_steps=4), total_steps=8)
    state, updates = TrainState(), []
    skipped = optimizer_step(state, opt, cfg, grad_norm=lambda: float("nan"), update=updates.append)
    ok = optimizer_step(state, opt, cfg, grad_norm=lambda: 2.0, update=updates.append)
    assert skipped["skipped_steps"] == 1.0 and skipped["lr"] == pytest.approx(0.25)
    assert "skipped_steps" not in ok and ok == {"grad_norm": 2.0, "lr": pytest.approx(0.5)}
    assert updates == [2.0] and state.steps == 2


def test_extra_state_restores_the_step_count_and_rng(gloo_world_one, tmp_path):  # noqa: F811
    save_extra(str(tmp_path), TrainState(steps=7))
    assert (tmp_path / "extra_rank0.pt").exists()
    want = (random.random(), torch.rand(3))
    restored = TrainState()
    load_extra(str(tmp_path), restored)
    assert restored.steps == 7
    got = (random.random(), torch.rand(3))
    assert got[0] == want[0] and torch.equal(got[1], want[1])
