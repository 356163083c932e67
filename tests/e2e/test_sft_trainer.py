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


def _greedy_reproduces(model_dir: str, path: str) -> list[bool]:
    """Per example, whether transformers' greedy decoding writes its response and then eos."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    out = []
    for row in pd.read_parquet(path).to_dict("records"):
        messages = [{"role": m["role"], "content": m["content"]} for m in row["prompt"]]
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        reply = tok(row["response"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        with torch.no_grad():
            sequence = model.generate(prompt, do_sample=False, max_new_tokens=len(reply), pad_token_id=tok.pad_token_id)
        out.append(sequence[0, prompt.shape[1] :].tolist() == reply)
    return out


def test_exact_match_counts_the_examples_greedy_decoding_reproduces(tmp_path):
    """val/exact_match against transformers' greedy generate on the exported model, example by example: a
    partly trained model (100 steps: some answers right, most not), so a miscount either way shows."""
    data = _examples(tmp_path / "train.parquet", 48)
    run = _sft(
        tmp_path / "run",
        f"data.train_files=[{data}]",
        f"data.val_files=[{data}]",
        "checkpoint.save_hf=true",
        "actor.optim.lr=3e-3",
        steps=100,
    )
    summary, metrics = fit(run)
    reproduced = _greedy_reproduces(str(tmp_path / "run" / "hf"), data)
    assert 0 < sum(reproduced) < len(reproduced), reproduced  # partly right: the count is informative
    assert metrics[-1]["val/exact_match"] == sum(reproduced) / len(reproduced)



def test_stop_when_ends_the_run_at_the_first_validation_that_reaches_it(tmp_path, capsys):
    """A run with trainer.stop_when ends where the same run without it first meets the bound (its checkpoint
    saved there), and resuming it trains nothing more."""
    data = _examples(tmp_path / "train.parquet", 48)
    val = _examples(tmp_path / "val.parquet", 12, split="val")
    common = (
        f"data.train_files=[{data}]",
        f"data.val_files=[{val}]",
        "trainer.val_every=2",
        "actor.optim.lr=1e-2",
    )
    _, full = fit(_sft(tmp_path / "full", *common, steps=12))
    losses = {m["step"]: m["val/loss"] for m in full if "val/loss" in m}
    bound = (losses[4] + losses[6]) / 2 if losses[6] < losses[4] else None
    assert bound is not None and losses[2] > bound, losses  # (the loss falls past the bound between steps 4 and 6)
    stop = f"trainer.stop_when={{metric: val/loss, at_most: {bound}}}"
    first = min(s for s, v in losses.items() if v <= bound)
    summary, metrics = fit(_sft(tmp_path / "stopped", *common, stop, steps=12))
    assert summary["steps"] == first and metrics[-1]["step"] == first
    assert f"verl: stopped at step {first}: val/loss=" in capsys.readouterr().out
    assert os.path.isdir(tmp_path / "stopped" / "checkpoints" / f"step_{first}")
    summary, _ = fit(_sft(tmp_path / "stopped", *common, stop, steps=12))  # resume: auto
    assert summary["steps"] == first  # nothing trained after the stop


def test_a_model_given_by_hub_id_trains_from_the_local_cache_offline(tmp_path, tiny_model_dir, monkeypatch):
    """model.path: org/name, found in a Hugging Face cache with the hub offline: the run trains from that
    snapshot (the same start as from the folder itself: the same first-step loss)."""
    from huggingface_hub import constants  # pants: no-infer-dep (installed with transformers)

    from tests.core.test_model_source import hub_cache_with

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    hub_cache_with(tmp_path / "hub", "verl-test/tiny-llama", tiny_model_dir)
    data = _examples(tmp_path / "train.parquet", 16)
    _, by_id = fit(_sft(tmp_path / "id", f"data.train_files=[{data}]", "model.path=verl-test/tiny-llama", steps=1))
    _, by_folder = fit(_sft(tmp_path / "folder", f"data.train_files=[{data}]", f"model.path={tiny_model_dir}", steps=1))
    assert by_id[0]["actor/loss"] == by_folder[0]["actor/loss"]
