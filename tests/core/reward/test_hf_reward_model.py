"""HFRewardModel: a sequence-classification reward model with its own tokenizer and chat template; responses are
decoded with the policy's tokenizer and re-rendered with the reward model's; sources combine by weights."""

from __future__ import annotations

import pytest
import torch

from tests.support.fixtures import build_reward_model
from verl.protocol import DataProto
from verl.reward import make_reward_manager
from verl.reward.hf_model import HFRewardModel


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    return build_reward_model(tmp_path_factory.mktemp("rm"))


def _direct(rm_dir: str, text: str) -> float:
    """The model's logit for one text, unbatched, with plain transformers."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(rm_dir)
    model = AutoModelForSequenceClassification.from_pretrained(rm_dir).eval()
    with torch.no_grad():
        return float(model(torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])).logits[0, 0])


def test_responses_are_rendered_with_the_reward_models_template_and_scored_in_batches(rm_dir, char_tokenizer):
    rm = HFRewardModel(rm_dir, batch_size=2)
    conversation = [{"role": "user", "content": "12+7="}]
    assert rm.render(conversation, "19") == "<user>12+7=<assistant>19"
    # its ids are not the policy's: the same text tokenizes differently
    assert rm.tokenizer("19")["input_ids"] != char_tokenizer("19", add_special_tokens=False)["input_ids"]
    responses = ["19", "2", "190", "1"]  # different lengths: batches are padded
    scores = rm.score_texts([conversation] * 4, responses)
    expected = [_direct(rm_dir, f"<user>12+7=<assistant>{r}") for r in responses]
    assert scores.tolist() == pytest.approx(expected, abs=1e-5)
    assert len(set(round(s, 6) for s in scores.tolist())) == 4


def test_the_manager_decodes_with_the_policy_tokenizer_and_weighs_the_sources(rm_dir, char_tokenizer):
    prompt = char_tokenizer("1+1=", add_special_tokens=False)["input_ids"]
    rows = [
        char_tokenizer(t, add_special_tokens=False)["input_ids"] + [char_tokenizer.eos_token_id] for t in ("2", "3")
    ]
    batch = DataProto.from_dict(
        {
            "prompts": torch.tensor([prompt, prompt]),
            "responses": torch.tensor(rows),
            "response_mask": torch.ones(2, 2, dtype=torch.long),
        },
        {
            "messages": [[{"role": "user", "content": "1+1="}]] * 2,
            "ground_truth": ["2", "2"],
            "data_source": ["embedded/arithmetic"] * 2,
        },
    )
    model = {"_target_": "verl.reward.hf_model.HFRewardModel", "path": rm_dir}
    rm_scores = HFRewardModel(rm_dir).score_texts([[{"role": "user", "content": "1+1="}]] * 2, ["2", "3"])
    manager = make_reward_manager({"model": model, "fn": "arithmetic", "weights": {"model": 0.5}}, char_tokenizer)
    scores, metrics = manager(batch)
    expected = torch.tensor([1.0, 0.0]) + 0.5 * rm_scores  # arithmetic: "2" is right, "3" wrong
    assert scores.sum(-1).tolist() == pytest.approx(expected.tolist(), abs=1e-6)
    assert metrics["reward/model_score/mean"] == pytest.approx(float(rm_scores.mean()), abs=1e-6)


def test_a_classifier_with_several_labels_is_refused(tmp_path):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    folder = build_reward_model(tmp_path / "rm")
    config = AutoConfig.from_pretrained(folder)
    config.num_labels = 3
    AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
    with pytest.raises(ValueError, match="num_labels=3; a reward model has one output"):
        HFRewardModel(folder)
