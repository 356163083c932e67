"""DPOTrainer end to end in local mode: offline DPO (reference on the fly and precomputed), online DPO, and an
exact resume. The first step's loss is log 2 exactly: the policy is the reference, so every margin is 0."""

from __future__ import annotations

import math
import os

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from tests.support.run_configs import ODD_LENGTH_REWARD, fit, tiny_config
from verl.embedded.arithmetic import make_preference_rows

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/BUILD too)


@pytest.fixture(autouse=True)
def _cache(embedded_cache, monkeypatch):  # noqa: F811
    monkeypatch.setenv("VERL_CACHE", embedded_cache)


def _pairs(tmp_path, rows) -> str:
    path = str(tmp_path / "pairs.parquet")
    pd.DataFrame(rows).to_parquet(path)
    return path


def _reference_log_probs(model_dir: str, rows: list[dict]) -> list[tuple[float, float]]:
    """Each reply's summed log-probs (with its eos) under the untrained model, with plain transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    out = []
    for r in rows:
        prompt = tok(
            tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False), add_special_tokens=False
        )["input_ids"]
        sums = []
        for reply in (r["chosen"], r["rejected"]):
            ids = tok(reply, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            with torch.no_grad():
                logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
            sums.append(float(torch.log_softmax(logits.double(), -1).gather(-1, torch.tensor(ids)[:, None]).sum()))
        out.append(tuple(sums))
    return out


def test_dpo_starts_at_log_two_and_a_precomputed_reference_trains_the_same(tmp_path, tiny_model_dir):
    rows = make_preference_rows(16, seed=0)
    path = _pairs(tmp_path, rows)
    one_update = "actor.ppo_mini_batch_size=4"  # (two mini-batches: the second starts from moved weights)
    summary, metrics = fit(
        tiny_config("dpo_tiny", str(tmp_path / "on_the_fly"), f"data.train_files=[{path}]", one_update)
    )
    assert summary["steps"] == 2
    first = metrics[0]
    assert first["dpo/pairs"] == 4 and first["actor/dpo_loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert first["actor/dpo/nll_loss"] > 0  # the recipe's RPO term, logged apart from the preference loss
    assert metrics[1]["actor/dpo_loss"] != pytest.approx(math.log(2), abs=1e-4)  # the first update moved the policy
    assert metrics[1]["actor/dpo/reward_margins"] != 0

    # The same pairs with the reference's log-probs computed by plain transformers, and no reference model.
    for row, (chosen, rejected) in zip(rows, _reference_log_probs(tiny_model_dir, rows)):
        row["ref_chosen_logps"], row["ref_rejected_logps"] = chosen, rejected
    (tmp_path / "with_ref").mkdir()
    with_ref = _pairs(tmp_path / "with_ref", rows)
    _, again = fit(
        tiny_config(
            "dpo_tiny", str(tmp_path / "precomputed"), f"data.train_files=[{with_ref}]", "ref.enable=false", one_update
        )
    )
    for key in ("actor/dpo_loss", "actor/grad_norm", "actor/dpo/reward_margins", "actor/dpo/reward_accuracies"):
        assert [m[key] for m in again] == pytest.approx([m[key] for m in metrics], abs=1e-5), key


def test_without_a_reference_the_data_must_carry_its_log_probs(tmp_path):
    path = _pairs(tmp_path, make_preference_rows(8, seed=0))
    with pytest.raises(ValueError, match="ref.enable=false needs the reference's log-probs in the data"):
        fit(tiny_config("dpo_tiny", str(tmp_path), f"data.train_files=[{path}]", "ref.enable=false"))


def test_online_dpo_pairs_the_best_and_the_worst_sample_of_each_prompt(tmp_path):
    cfg = tiny_config(
        "dpo_tiny",
        str(tmp_path),
        "algorithm.name=online_dpo",
        "data.train_files=[embedded:arithmetic]",
        "rollout.n=4",
        ODD_LENGTH_REWARD,  # rewards with spread on an untrained model
        "actor.ppo_mini_batch_size=4",
    )
    _, metrics = fit(cfg)
    for m in metrics:
        assert 1 <= m["dpo/pairs"] <= 4 and m["dpo/pairs"] + m["dpo/tied_groups"] == 4
        assert m["dpo/score_gap"] == 1.0  # odd vs even length: the best scores 1, the worst 0
        assert "reward/score/mean" in m and "timing/gen_s" in m
    assert metrics[0]["actor/dpo_loss"] == pytest.approx(math.log(2), abs=1e-6)


def test_dpo_resumed_from_its_checkpoint_ends_with_the_same_weights(tmp_path, capsys):
    path = _pairs(tmp_path, make_preference_rows(24, seed=0))  # 6 batches of 4: the data order matters
    common = (f"data.train_files=[{path}]", "checkpoint.save_hf=true", "actor.optim.lr=1e-3")
    fit(tiny_config("dpo_tiny", str(tmp_path / "straight"), *common, steps=4))
    fit(tiny_config("dpo_tiny", str(tmp_path / "resumed"), *common, steps=2))
    capsys.readouterr()
    _, rest = fit(tiny_config("dpo_tiny", str(tmp_path / "resumed"), *common, steps=4))  # resume: auto
    out = capsys.readouterr().out
    assert "verl: resumed from" in out and "(step 2)" in out
    assert [m["step"] for m in rest] == [1, 2, 3, 4]  # each step once in the logs
    straight = load_file(os.path.join(tmp_path, "straight", "hf", "model.safetensors"))
    resumed = load_file(os.path.join(tmp_path, "resumed", "hf", "model.safetensors"))
    assert straight.keys() == resumed.keys()
    for k in straight:
        assert torch.equal(straight[k], resumed[k]), k
