"""SFTTrainer end to end: the validation loss against plain transformers, training lowers it, FSDP over two Ray
workers trains as one, and an exact resume."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from tests.support.run_configs import fit, tiny_config
from verl.embedded.arithmetic import make_sft_rows

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/BUILD too)


@pytest.fixture(autouse=True)
def _cache(embedded_cache, monkeypatch):  # noqa: F811
    monkeypatch.setenv("VERL_CACHE", embedded_cache)


def _examples(path, n: int, split: str = "train") -> str:
    pd.DataFrame(make_sft_rows(n, seed=0, split=split)).to_parquet(path)
    return str(path)


def _transformers_loss(model_dir: str, path: str) -> float:
    """The token-mean NLL of each example's response and eos, with plain transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    nll, tokens = 0.0, 0
    for row in pd.read_parquet(path).to_dict("records"):
        messages = [{"role": m["role"], "content": m["content"]} for m in row["prompt"]]
        prompt = tok(
            tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False), add_special_tokens=False
        )["input_ids"]
        reply = tok(row["response"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + reply])).logits[0, len(prompt) - 1 : -1].double()
        nll -= float(torch.log_softmax(logits, -1).gather(-1, torch.tensor(reply)[:, None]).sum())
        tokens += len(reply)
    return nll / tokens


def _sft(out, *overrides, steps=2):
    return tiny_config(
        "sft_tiny", str(out), "data.train_batch_size=8", "actor.ppo_mini_batch_size=8", *overrides, steps=steps
    )


def test_sft_lowers_the_validation_loss_measured_as_transformers_measures_it(tmp_path, tiny_model_dir):
    val = _examples(tmp_path / "val.parquet", 12, split="val")
    cfg = _sft(
        tmp_path / "run", f"data.val_files=[{val}]", "trainer.val_before_train=true", "actor.optim.lr=1e-2", steps=4
    )
    summary, metrics = fit(cfg)
    assert metrics[0]["step"] == 0 and metrics[0]["val/n"] == 12
    assert metrics[0]["val/loss"] == pytest.approx(_transformers_loss(tiny_model_dir, val), abs=1e-5)
    assert summary["val_loss_before"] == metrics[0]["val/loss"]
    assert summary["val_loss_after"] < summary["val_loss_before"] - 0.5  # 4 steps at lr 1e-2 on a random model
    assert all("actor/loss" in m and m["sft/loss_tokens"] > 0 for m in metrics[1:])
    from verl.trainer.summary import format_summary

    assert "validation loss" in format_summary("sft", summary)


def test_sft_on_two_fsdp_workers_trains_as_one(tmp_path, ray_two_cpus):  # noqa: F811
    data = _examples(tmp_path / "train.parquet", 32)
    common = (f"data.train_files=[{data}]", "checkpoint.save_hf=true", "actor.optim.lr=1e-2")
    fit(_sft(tmp_path / "one", *common))
    two_workers = ("placement.devices_per_node=2", "trainer.controller=ray", "trainer.profile={steps: [1, 2]}")
    fit(_sft(tmp_path / "two", *common, *two_workers))
    timeline = json.load(open(tmp_path / "two" / "profile" / "ray_timeline.json"))  # Ray's, of both workers
    assert any("update_actor" in e.get("name", "") for e in timeline)
    one = load_file(os.path.join(tmp_path, "one", "hf", "model.safetensors"))
    two = load_file(os.path.join(tmp_path, "two", "hf", "model.safetensors"))
    for k in one:
        torch.testing.assert_close(two[k], one[k], rtol=0, atol=1e-5, msg=k)


def test_sft_resumed_from_its_checkpoint_ends_with_the_same_weights(tmp_path, capsys):
    data = _examples(tmp_path / "train.parquet", 48)  # 6 batches of 8: the data order matters
    common = (f"data.train_files=[{data}]", "checkpoint.save_hf=true", "actor.optim.lr=1e-2")
    fit(_sft(tmp_path / "straight", *common, steps=4))
    fit(_sft(tmp_path / "resumed", *common, steps=2))
    capsys.readouterr()
    _, metrics = fit(_sft(tmp_path / "resumed", *common, steps=4))  # resume: auto
    assert "(step 2)" in capsys.readouterr().out  # "verl: resumed from ... (step 2)"
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    straight = load_file(os.path.join(tmp_path, "straight", "hf", "model.safetensors"))
    resumed = load_file(os.path.join(tmp_path, "resumed", "hf", "model.safetensors"))
    for k in straight:
        assert torch.equal(straight[k], resumed[k]), k
