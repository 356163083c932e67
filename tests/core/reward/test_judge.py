"""GenerativeJudge: an LLM prompted to rate responses, generating through the project's rollout engine; its rating
parsed from what it writes; its counts reported by the RewardManager."""

from __future__ import annotations

import re

import pytest
import torch

from tests.support.fixtures import build_judge_model
from verl.protocol import DataProto
from verl.reward import make_reward_manager
from verl.reward.judge import DEFAULT_SCORE_PATTERN, GenerativeJudge, parse_score

TEMPLATE = "Q: {question}\nA: {response}\nScore:"
DIGIT = r"(\d)"  # the random judge never writes "Score:", but digits now and then: some outputs parse, some do not
CONVERSATIONS = [
    [{"role": "user", "content": "1+1="}],
    [{"role": "user", "content": "What is 12*7?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "9-3="}],
    [{"role": "user", "content": "2+2="}],
]
RESPONSES = ["2", "84", "blue", "6", "four"]


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
    return build_judge_model(tmp_path_factory.mktemp("judge"))


# ---------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Score: 7", 0.7),
        ("Score: 3 at first... on reflection\nScore: 8", 0.8),  # the last match counts
        ("Score:7.5", 0.75),
        ("Score: -2", -0.2),
        ("Score:\n  10", 1.0),
        ("I would give it a 7", None),  # no "Score:" line
        ("Score: seven", None),
        ("", None),
    ],
)
def test_the_last_match_of_the_pattern_is_the_score_over_max_score(text, expected):
    result = parse_score(text, re.compile(DEFAULT_SCORE_PATTERN), 10.0)
    assert result == (None if expected is None else pytest.approx(expected))


def test_a_pattern_without_groups_scores_its_whole_match_and_max_score_scales():
    assert parse_score("rated 4 of 5", re.compile(r"\d(?= of)"), 5.0) == pytest.approx(0.8)
    assert parse_score("rated 4", re.compile(r"rated (\d+)|(none)"), 1.0) == 4.0
    assert parse_score("none", re.compile(r"rated (\d+)|(none)"), 1.0) is None  # group 1 did not take part
    assert parse_score("Score: 1e999", re.compile(r"Score: (\S+)"), 10.0) is None  # not finite


# ---------------------------------------------------------------------- a real judge, through the hf engine


def _greedy(judge_dir: str, text: str, max_new_tokens: int) -> str:
    """One prompt's greedy output with plain transformers, unbatched."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(judge_dir)
    model = AutoModelForCausalLM.from_pretrained(judge_dir).eval()
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
    return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def test_the_judge_generates_through_the_rollout_engine_as_plain_greedy_generate_does(judge_dir):
    from verl_rollout.hf import HFRollout

    settings = dict(template=TEMPLATE, score_pattern=DIGIT, max_score=5, max_new_tokens=4, batch_size=2)
    judge = GenerativeJudge(judge_dir, **settings, unparsed_score=-1.0)
    assert isinstance(judge.engine, HFRollout)
    # the template as one user message in the judge's chat template, with its generation prompt; the question is
    # the last user message
    assert judge.prompt(CONVERSATIONS[3], "6") == "<user>Q: 9-3=\nA: 6\nScore:<assistant>"

    scores = judge.score_texts(CONVERSATIONS, RESPONSES)  # 5 prompts in batches of 2: left-padded, a short last one

    expected = [_greedy(judge_dir, judge.prompt(c, r), 4) for c, r in zip(CONVERSATIONS, RESPONSES)]
    assert judge.last_outputs == expected
    digits = [re.findall(r"\d", text) for text in expected]
    assert scores.dtype == torch.float32
    assert scores.tolist() == pytest.approx([int(d[-1]) / 5 if d else -1.0 for d in digits])
    unparsed = sum(not d for d in digits)
    assert 0 < unparsed < len(digits)  # both paths taken
    assert judge.last_metrics["judge/unparsed"] == unparsed
    assert judge.last_metrics["judge/mean_output_tokens"] == pytest.approx(4.0)  # no eos in 4 tokens: all truncated
    assert judge.last_metrics["judge/truncated"] == 5


def test_a_judge_tokenizer_without_a_chat_template_reads_the_text_itself(judge_dir):
    judge = GenerativeJudge(judge_dir, template="{question} / {response}", max_new_tokens=2)
    judge.tokenizer.chat_template = None
    assert judge.prompt([{"role": "system", "content": "a"}, {"role": "tool", "content": "b"}], "c") == "a\nb / c"
    assert judge.score_texts([], []).shape == (0,)


def test_the_manager_reports_the_judges_metrics_under_reward_model(judge_dir, char_tokenizer):
    spec = {
        "_target_": "verl.reward.judge.GenerativeJudge",
        "path": judge_dir,
        "template": TEMPLATE,
        "score_pattern": DIGIT,
        "max_new_tokens": 4,
    }
    manager = make_reward_manager({"model": spec}, char_tokenizer)
    rows = [char_tokenizer(r, add_special_tokens=False)["input_ids"] for r in RESPONSES]
    width = max(map(len, rows))
    responses = torch.tensor([r + [char_tokenizer.pad_token_id] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    batch = DataProto.from_dict({"responses": responses, "response_mask": mask}, {"messages": CONVERSATIONS})

    scores, metrics = manager(batch)

    judge = manager.reward_model
    expected = judge.score_texts(CONVERSATIONS, RESPONSES)  # the responses decoded with the policy's tokenizer
    assert scores.sum(-1).tolist() == pytest.approx(expected.tolist())
    for key in ("judge/unparsed", "judge/truncated", "judge/mean_output_tokens"):
        assert metrics[f"reward/model/{key}"] == judge.last_metrics[key]


# ---------------------------------------------------------------------- configuration errors


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"template": "Rate this: {question}"}, r"reward.model.template: the template is missing \{response\}"),
        ({"template": "{question} {answer}"}, r"reward.model.template: unknown placeholder \{answer\}"),
        ({"template": "JSON: {score: N} {response}"}, r"reward.model.template: .*literal braces as \{\{ and \}\}"),
        ({"template": "{response} }"}, r"reward.model.template: not a valid format string \(Single '\}'"),
        ({"score_pattern": "Score: (\\d+"}, r"reward.model.score_pattern: 'Score: \(\\\\d\+' is not a valid regex"),
        ({"max_score": 0}, r"reward.model.max_score: must be a positive number, got 0"),
        ({"max_new_tokens": 2.5}, r"reward.model.max_new_tokens: must be a positive integer"),
        ({"dtype": "fp8"}, r"reward.model.dtype: 'fp8' is not one of float32"),
        ({"backend": "vlm"}, r"reward.model.backend: unknown rollout backend 'vlm'.*did you mean 'vllm'"),
        ({"backend": "fsdp"}, r"reward.model.backend: 'fsdp' is a train backend"),
        ({"rollout": {"gpu_memory_util": 0.2}}, r"reward.model.rollout.gpu_memory_util: .*Did you mean"),
    ],
)
def test_bad_settings_name_their_key_before_anything_loads(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GenerativeJudge("/nonexistent/judge", **kwargs)
