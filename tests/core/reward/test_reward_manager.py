"""RewardManager on hand-made batches decoded by a real (character-level) tokenizer."""

from __future__ import annotations

import logging
import math
import threading

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from tests.support.fixtures import make_cfg
from verl.config.errors import ConfigError
from verl.config.schema import RewardConfig
from verl.protocol import DataProto
from verl.reward import RewardFunctionError, RewardManager, make_reward_manager
from verl.reward.functions import arithmetic

PAD, EOS = 0, 1
CHARS = " abcdefghijklmnopqrstuvwxyz0123456789+-=#.,{}\\?\n"


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    """One token per character; <pad> and <eos> are special, so decoding skips them."""
    vocab = {"<pad>": PAD, "<eos>": EOS, "<unk>": 2, **{c: i + 3 for i, c in enumerate(CHARS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()  # characters join without spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def make_batch(tokenizer, responses, ground_truths, *, width=8, eos=None, raw_prompts=None, **non_tensors):
    """Right-padded responses [B, width]; eos[i] appends <eos> (a generated, masked token) to row i."""
    eos = eos or [False] * len(responses)
    ids = torch.full((len(responses), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(responses), width), dtype=torch.long)
    for i, (text, with_eos) in enumerate(zip(responses, eos)):
        row = tokenizer.encode(text, add_special_tokens=False) + ([EOS] if with_eos else [])
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    prompts = raw_prompts or [f"q{i}" for i in range(len(responses))]
    return DataProto.from_dict(
        tensors={"responses": ids, "response_mask": mask},
        non_tensors={"raw_prompt": prompts, "ground_truth": ground_truths, **non_tensors},
    )


def table_reward(prompt, response, ground_truth, extra):
    """The score is written in the response itself: "nan", "inf", "-inf" or a number."""
    return float(response)


# --------------------------------------------------------------------------- placement and metrics


def test_scores_sit_on_the_last_response_token(tokenizer):
    batch = make_batch(
        tokenizer,
        ["42", "7", "", "41"],
        ["42", "7", "1", "42"],
        eos=[False, True, False, False],
        data_source=["add", "add", "add", "mul"],
    )
    scores, metrics = RewardManager(arithmetic, tokenizer=tokenizer)(batch)
    expected = torch.zeros(4, 8)
    expected[0, 1] = 1.0  # "42": 2 tokens -> position 1
    expected[1, 1] = 1.0  # "7<eos>": 2 masked tokens -> position 1; decoding drops <eos>, so "7" == "7"
    # row 2 is empty: its score has no token to sit on
    # row 3 "41" != "42": 0.0 at position 1, which is the zero already there
    assert scores.dtype == torch.float32
    torch.testing.assert_close(scores, expected, rtol=0, atol=0)
    assert metrics["reward/empty_responses"] == 1.0
    assert metrics["reward/nonfinite_count"] == 0.0
    # per-sample rewards training sees: [1, 1, 0, 0]
    assert metrics["reward/score/mean"] == 0.5
    assert metrics["reward/score/max"] == 1.0
    assert metrics["reward/score/min"] == 0.0
    assert metrics["reward/accuracy"] == 0.5  # 2 of 4 function scores are >= 1 (the empty "" != "1")
    assert metrics["reward/add/mean"] == pytest.approx(2 / 3)  # rows 0-2: (1 + 1 + 0) / 3
    assert metrics["reward/add/accuracy"] == pytest.approx(2 / 3)
    assert metrics["reward/mul/mean"] == 0.0


def test_only_masked_tokens_are_decoded(tokenizer):
    seen = []

    def record(prompt, response, ground_truth, extra):
        seen.append(response)
        return 1.0

    batch = make_batch(tokenizer, ["ab", "c"], ["", ""])
    batch.batch["responses"][0, 2:] = tokenizer.convert_tokens_to_ids("z")  # not special, but masked out
    scores, _ = RewardManager(record, tokenizer=tokenizer)(batch)
    assert seen == ["ab", "c"]
    assert scores[0].tolist() == [0, 1, 0, 0, 0, 0, 0, 0]


def test_score_goes_after_the_last_masked_token_when_the_mask_has_holes(tokenizer):
    # A multi-turn response: tokens 2-3 are a tool's output (mask 0) between two generated parts.
    batch = make_batch(tokenizer, ["abcdef"], [""])
    batch.batch["response_mask"][0] = torch.tensor([1, 1, 0, 0, 1, 1, 0, 0])
    scores, _ = RewardManager(lambda p, r, g, e: 2.0, tokenizer=tokenizer)(batch)
    assert scores[0].tolist() == [0, 0, 0, 0, 0, 2.0, 0, 0]


def test_fn_receives_prompt_ground_truth_and_extra(tokenizer):
    calls = []

    def record(prompt, response, ground_truth, extra):
        calls.append((prompt, response, ground_truth, extra))
        return 0.0

    batch = make_batch(
        tokenizer,
        ["x", "y"],
        ["1", "2"],
        raw_prompts=["what is 0+1?", "what is 1+1?"],
        data_source=["src", "src"],
        extra_info=[{"split": "train"}, None],
    )
    RewardManager(record, tokenizer=tokenizer)(batch)
    assert calls == [
        ("what is 0+1?", "x", "1", {"split": "train", "data_source": "src"}),
        ("what is 1+1?", "y", "2", {"data_source": "src"}),
    ]


def test_dataset_index_falls_back_to_extra_info_then_the_row(tokenizer):
    batch = make_batch(tokenizer, ["x", "y"], ["1", "0"], extra_info=[{"index": 40}, {}])
    with pytest.raises(RewardFunctionError) as info:
        RewardManager(lambda p, r, g, e: 1 / int(g), tokenizer=tokenizer)(batch)
    assert info.value.index == 1  # row 1 has no index anywhere: its row number
    batch = make_batch(tokenizer, ["x", "y"], ["0", "1"], extra_info=[{"index": 40}, {}])
    with pytest.raises(RewardFunctionError) as info:
        RewardManager(lambda p, r, g, e: 1 / int(g), tokenizer=tokenizer)(batch)
    assert info.value.index == 40


def test_a_missing_ground_truth_value_is_an_empty_string(tokenizer):
    seen = []
    batch = make_batch(tokenizer, ["x"], [None])
    RewardManager(lambda p, r, g, e: seen.append(g) or 0.0, tokenizer=tokenizer)(batch)
    assert seen == [""]


def test_prompts_are_decoded_when_the_batch_has_no_raw_prompt(tokenizer):
    seen = []
    batch = make_batch(tokenizer, ["x"], ["1"])
    batch.pop(non_tensor_keys=["raw_prompt"])
    prompt_ids = [PAD, PAD] + tokenizer.encode("1+2=", add_special_tokens=False)  # left-padded
    batch = batch.union(DataProto.from_dict(tensors={"prompts": torch.tensor([prompt_ids])}))
    RewardManager(lambda p, r, g, e: seen.append(p) or 0.0, tokenizer=tokenizer)(batch)
    assert seen == ["1+2="]


def test_missing_ground_truth_is_named(tokenizer):
    batch = make_batch(tokenizer, ["x"], ["1"])
    batch.pop(non_tensor_keys=["ground_truth"])
    with pytest.raises(KeyError, match="no non-tensor 'ground_truth'"):
        RewardManager(arithmetic, tokenizer=tokenizer)(batch)


def test_missing_response_mask_is_named(tokenizer):
    batch = make_batch(tokenizer, ["x"], ["1"])
    batch.pop(tensor_keys=["response_mask"])
    with pytest.raises(KeyError, match="no tensor 'response_mask'"):
        RewardManager(arithmetic, tokenizer=tokenizer)(batch)


def test_a_data_source_named_like_a_metric_does_not_overwrite_it(tokenizer):
    batch = make_batch(tokenizer, ["1", "0"], ["1", "1"], data_source=["score", "gsm8k"])
    _, metrics = RewardManager(arithmetic, tokenizer=tokenizer)(batch)
    assert metrics["reward/score/mean"] == 0.5  # over both rows: (1 + 0) / 2
    assert metrics["reward/data_source/score/mean"] == 1.0
    assert metrics["reward/gsm8k/mean"] == 0.0


def test_data_source_defaults_to_unknown(tokenizer):
    _, metrics = RewardManager(arithmetic, tokenizer=tokenizer)(make_batch(tokenizer, ["1"], ["1"]))
    assert metrics["reward/unknown/mean"] == 1.0


# --------------------------------------------------------------------------- dict results


def test_dict_results_log_extras_and_acc(tokenizer):
    def scored(prompt, response, ground_truth, extra):
        correct = response == ground_truth
        return {"score": 1.0 if correct else 0.1, "acc": correct, "length": len(response), "pred": response}

    batch = make_batch(tokenizer, ["7", "123", "9"], ["7", "12", "8"])
    scores, metrics = RewardManager(scored, tokenizer=tokenizer)(batch)
    assert scores.sum(dim=1).tolist() == pytest.approx([1.0, 0.1, 0.1])
    assert metrics["reward/accuracy"] == pytest.approx(1 / 3)  # from "acc", not from score >= 1
    assert metrics["reward/extra/length"] == pytest.approx(5 / 3)  # (1 + 3 + 1) / 3
    assert "reward/extra/pred" not in metrics  # non-numeric entries are not metrics
    assert "reward/extra/acc" not in metrics


def test_each_rows_correctness_and_answer_are_kept_for_validation(tokenizer):
    def graded(prompt, response, ground_truth, extra):  # format credit for "=..." answers; "pred" the number
        if response.startswith("="):
            return {"score": 0.5, "acc": float(response[1:] == ground_truth), "pred": response[1:]}
        return 1.0 if response == ground_truth else 0.2

    batch = make_batch(tokenizer, ["=7", "=8", "7 ", "6"], ["7", "7", "7 ", "7"])
    manager = RewardManager(graded, tokenizer=tokenizer)
    manager(batch)
    assert manager.last_correct == [1.0, 0.0, 1.0, 0.0]  # "acc" where given, else full credit (>= 1.0)
    assert manager.last_answers == ["7", "8", "7", "6"]  # "pred" where given, else the response, stripped


def test_dict_without_score_is_an_error(tokenizer):
    batch = make_batch(tokenizer, ["7"], ["7"])
    with pytest.raises(RewardFunctionError, match="needs a 'score' entry"):
        RewardManager(lambda p, r, g, e: {"acc": 1.0}, tokenizer=tokenizer)(batch)


def test_non_numeric_score_is_an_error(tokenizer):
    batch = make_batch(tokenizer, ["7"], ["7"])
    with pytest.raises(RewardFunctionError, match="must be a real number.*str '1.0'"):
        RewardManager(lambda p, r, g, e: "1.0", tokenizer=tokenizer)(batch)


# --------------------------------------------------------------------------- non-finite scores and clamp


def test_nonfinite_scores_are_counted_and_replaced_by_the_clamp_bounds(tokenizer, caplog):
    batch = make_batch(tokenizer, ["nan", "inf", "-inf", "5", "0.5"], [""] * 5, index=[10, 11, 12, 13, 14])
    with caplog.at_level(logging.WARNING, logger="verl.reward.manager"):
        scores, metrics = RewardManager(table_reward, tokenizer=tokenizer, clamp=(-1.0, 2.0))(batch)
    # nan -> low (-1), inf -> high (2), -inf -> low (-1), 5 clamped to 2, 0.5 kept
    assert scores.sum(dim=1).tolist() == [-1.0, 2.0, -1.0, 2.0, 0.5]
    assert scores[0, 2] == -1.0  # "nan" is 3 tokens: position 2
    assert metrics["reward/nonfinite_count"] == 3.0
    assert metrics["reward/score/mean"] == pytest.approx(0.5)  # (-1 + 2 - 1 + 2 + 0.5) / 5
    assert torch.isfinite(scores).all()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 3
    assert "non-finite reward nan from reward.fn on batch row 0" in warnings[0]
    assert "index=10" in warnings[0] and "'nan'" in warnings[0]
    assert "replaced by 2.0" in warnings[1]


def test_nonfinite_scores_become_zero_without_a_clamp(tokenizer):
    batch = make_batch(tokenizer, ["nan", "inf", "-inf", "3"], [""] * 4)
    scores, metrics = RewardManager(table_reward, tokenizer=tokenizer)(batch)
    assert scores.sum(dim=1).tolist() == [0.0, 0.0, 0.0, 3.0]
    assert metrics["reward/nonfinite_count"] == 3.0


def test_warnings_are_capped_per_batch(tokenizer, caplog):
    batch = make_batch(tokenizer, ["nan"] * 6, [""] * 6)
    with caplog.at_level(logging.WARNING, logger="verl.reward.manager"):
        _, metrics = RewardManager(table_reward, tokenizer=tokenizer)(batch)
    assert metrics["reward/nonfinite_count"] == 6.0
    assert len(caplog.records) == 4  # 3 samples shown, then one line for the rest
    assert "3 more non-finite rewards" in caplog.records[-1].getMessage()


@pytest.mark.parametrize("clamp", [(1.0, 0.0), (0.0, math.inf), (1.0,), "ab"])
def test_bad_clamp(tokenizer, clamp):
    with pytest.raises(ValueError, match="clamp must be"):
        RewardManager(arithmetic, tokenizer=tokenizer, clamp=clamp)


# --------------------------------------------------------------------------- failures


def test_a_raising_reward_function_names_the_sample(tokenizer):
    def divide(prompt, response, ground_truth, extra):
        return 1.0 / int(ground_truth)

    long_response = "9" * 1000
    batch = make_batch(
        tokenizer,
        ["1", long_response],
        ["1", "0"],
        width=1000,
        raw_prompts=["q one", "what is 9 / 0?"],
        data_source=["math", "divzero"],
        index=[10, 11],
    )
    with pytest.raises(RewardFunctionError) as info:
        RewardManager(divide, tokenizer=tokenizer)(batch)
    message = str(info.value)
    assert "divide raised ZeroDivisionError: float division by zero" in message
    assert "batch row 1" in message
    assert "data_source='divzero'" in message
    assert "dataset index=11" in message
    assert "prompt: 'what is 9 / 0?'" in message
    assert "ground_truth: '0'" in message
    assert "...[700 chars]..." in message  # 1000 characters: the first and last 150 are shown
    assert "9" * 151 not in message
    assert len(message) < 800
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert (info.value.row, info.value.index, info.value.data_source) == (1, 11, "divzero")


@pytest.mark.parametrize("num_workers", [0, 4])
def test_on_error_score_gives_failing_samples_the_error_score_and_counts_them(tokenizer, caplog, num_workers):
    def picky(prompt, response, ground_truth, extra):
        if ground_truth == "raise":
            raise RuntimeError("judge unavailable")
        return None if ground_truth == "none" else ("text" if ground_truth == "str" else 1.0)

    batch = make_batch(tokenizer, ["1", "2", "3", "4"], ["ok", "raise", "none", "str"])
    cfg = {"fn": picky, "on_error": "score", "error_score": -1.0}
    manager = make_reward_manager(cfg, tokenizer, num_workers=num_workers)
    with caplog.at_level(logging.WARNING):
        token_scores, metrics = manager(batch)
    assert token_scores.sum(dim=1).tolist() == [1.0, -1.0, -1.0, -1.0]
    assert metrics["reward/fn_errors"] == 3.0
    assert sum("judge unavailable" in r.getMessage() for r in caplog.records) == 1  # each failure named
    assert sum("batch row 3" in r.getMessage() for r in caplog.records) == 1
    with pytest.raises(RewardFunctionError, match="batch row 1"):  # the default: the first failure stops the run
        make_reward_manager({"fn": picky}, tokenizer)(batch)


def test_threaded_scoring_matches_serial_and_reports_the_first_failing_row(tokenizer):
    threads = set()

    def slow(prompt, response, ground_truth, extra):
        threads.add(threading.get_ident())
        if response == "boom":
            raise RuntimeError(f"row {ground_truth}")
        return float(len(response))

    texts = ["a", "bb", "ccc", "dddd", "eeeee", "f"]
    batch = make_batch(tokenizer, texts, [""] * 6)
    serial = RewardManager(slow, tokenizer=tokenizer)(batch)
    threaded = RewardManager(slow, tokenizer=tokenizer, num_workers=3)(batch)
    torch.testing.assert_close(threaded[0], serial[0])
    assert threaded[1] == serial[1]
    failing = make_batch(tokenizer, ["a", "boom", "boom", "b"], ["0", "1", "2", "3"])
    with pytest.raises(RewardFunctionError, match="batch row 1") as info:
        RewardManager(slow, tokenizer=tokenizer, num_workers=3)(failing)
    assert str(info.value.__cause__) == "row 1"


# --------------------------------------------------------------------------- reward model


class TinyRewardModel(torch.nn.Module):
    """Scores weight x (number of non-pad response tokens) + bias x (number of non-pad prompt tokens)."""

    def __init__(self, weight: float = 1.0, bias: float = 0.0):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor(weight))
        self.bias = bias

    def forward(self, prompt_ids: torch.Tensor, response_ids: torch.Tensor) -> torch.Tensor:
        return self.weight * (response_ids != PAD).sum(-1) + self.bias * (prompt_ids != PAD).sum(-1)


def with_prompts(batch: DataProto, prompt_lengths: list[int]) -> DataProto:
    width = max(prompt_lengths)
    prompts = torch.zeros(len(prompt_lengths), width, dtype=torch.long)
    for i, n in enumerate(prompt_lengths):
        prompts[i, width - n :] = 5  # left-padded
    return batch.union(DataProto.from_dict(tensors={"prompts": prompts}))


def test_reward_model_from_target_scores_when_there_is_no_fn(tokenizer):
    cfg = RewardConfig(model={"_target_": f"{__name__}.TinyRewardModel", "weight": 0.5, "bias": 1.0})
    manager = make_reward_manager(cfg, tokenizer)
    assert isinstance(manager.reward_model, TinyRewardModel) and manager.fn is None
    batch = with_prompts(make_batch(tokenizer, ["abc", "a", ""], ["", "", ""]), [2, 1, 3])
    scores, metrics = manager(batch)
    # model: 0.5 x response tokens + 1.0 x prompt tokens = [1.5 + 2, 0.5 + 1, 0 + 3] = [3.5, 1.5, 3.0]
    assert scores[0].tolist() == [0, 0, 3.5, 0, 0, 0, 0, 0]
    assert scores[1].tolist() == [1.5, 0, 0, 0, 0, 0, 0, 0]
    assert scores[2].abs().sum() == 0  # empty response: the model's 3.0 has nowhere to go
    assert metrics["reward/model_score/mean"] == pytest.approx((3.5 + 1.5 + 3.0) / 3)
    assert metrics["reward/score/mean"] == pytest.approx((3.5 + 1.5 + 0.0) / 3)
    assert "reward/accuracy" not in metrics  # only a function has a notion of correct
    assert not scores.requires_grad


def test_reward_model_and_fn_scores_are_summed(tokenizer):
    cfg = {"fn": "arithmetic", "model": {"_target_": f"{__name__}.TinyRewardModel", "weight": 0.25}, "clamp": None}
    batch = with_prompts(make_batch(tokenizer, ["12", "13"], ["12", "12"]), [1, 1])
    scores, _ = make_reward_manager(cfg, tokenizer)(batch)
    # arithmetic [1, 0] + 0.25 x 2 tokens [0.5, 0.5] = [1.5, 0.5]
    assert scores.sum(dim=1).tolist() == [1.5, 0.5]


def test_reward_model_nonfinite_output_is_clamped(tokenizer):
    class Broken:
        def forward(self, prompt_ids, response_ids):
            return torch.tensor([math.nan, 1.0])

    batch = with_prompts(make_batch(tokenizer, ["a", "b"], ["", ""]), [1, 1])
    scores, metrics = RewardManager(None, tokenizer=None, reward_model=Broken(), clamp=(-0.5, 0.5))(batch)
    assert scores.sum(dim=1).tolist() == [-0.5, 0.5]
    assert metrics["reward/nonfinite_count"] == 1.0


def test_reward_model_with_a_wrong_output_shape(tokenizer):
    class Wrong:
        def forward(self, prompt_ids, response_ids):
            return torch.zeros(len(prompt_ids), 3)

    batch = with_prompts(make_batch(tokenizer, ["a"], [""]), [1])
    with pytest.raises(ValueError, match=r"returned shape \(1, 3\); expected \[1\]"):
        RewardManager(None, tokenizer=None, reward_model=Wrong())(batch)


def test_reward_model_needs_prompts(tokenizer):
    with pytest.raises(KeyError, match="no tensor 'prompts'"):
        RewardManager(None, tokenizer=None, reward_model=TinyRewardModel())(make_batch(tokenizer, ["a"], [""]))


# --------------------------------------------------------------------------- make_reward_manager


def length_reward(prompt, response, ground_truth, extra, *, scale=1.0):
    return scale * len(response)


def test_make_reward_manager_with_a_target_fn_and_kwargs(tokenizer):
    cfg = RewardConfig(fn={"_target_": f"{__name__}.length_reward", "scale": 0.5}, clamp=[0.0, 1.0])
    manager = make_reward_manager(cfg, tokenizer)
    assert manager.clamp == (0.0, 1.0)
    scores, _ = manager(make_batch(tokenizer, ["a", "abc"], ["", ""]))
    assert scores.sum(dim=1).tolist() == [0.5, 1.0]  # 0.5 x 1, and 0.5 x 3 = 1.5 clamped to 1


def test_reward_fn_argument_overrides_the_config(tokenizer):
    manager = make_reward_manager(RewardConfig(fn="gsm8k"), tokenizer, reward_fn=length_reward)
    assert manager.fn is length_reward
    assert make_reward_manager(RewardConfig(fn="gsm8k"), tokenizer, reward_fn="arithmetic").fn is arithmetic


def test_make_reward_manager_from_a_dictconfig(tokenizer):
    cfg = make_cfg({"reward": {"fn": "math_boxed", "clamp": [-1, 1]}})
    manager = make_reward_manager(cfg.reward, tokenizer, num_workers=2)
    assert manager.clamp == (-1.0, 1.0) and manager.num_workers == 2


def test_no_reward_configured():
    with pytest.raises(ConfigError) as info:
        make_reward_manager(RewardConfig(), tokenizer=None)
    (problem,) = info.value.problems
    assert problem.key == "reward.fn" and "no reward is configured" in problem.message


def test_bad_clamp_in_config_names_the_key(tokenizer):
    with pytest.raises(ConfigError) as info:
        make_reward_manager(RewardConfig(fn="gsm8k", clamp=[1.0, -1.0]), tokenizer)
    (problem,) = info.value.problems
    assert problem.key == "reward.clamp"


def test_reward_model_without_forward_is_a_config_error(tokenizer):
    with pytest.raises(ConfigError) as info:
        make_reward_manager(RewardConfig(model={"_target_": "builtins.dict"}), tokenizer)
    (problem,) = info.value.problems
    assert problem.key == "reward.model" and "no forward()" in problem.message


# --------------------------------------------------------------------------- a reward_fn on whole token rows


def test_a_reward_fn_on_token_rows_is_detected_by_its_signature_and_scores_the_rows(tokenizer):
    """PPOTrainer(config, reward_fn=fn) with fn(input_ids, attention_mask) -> Tensor[B]: fn sees the whole rows
    (prompt and response) and their mask; its scores go on each row's last response token."""
    batch = make_batch(tokenizer, ["12", "345"], ["", ""])
    b = batch.batch
    b["input_ids"] = torch.cat([torch.full((2, 3), 7), b["responses"]], 1)
    b["attention_mask"] = torch.cat([torch.ones(2, 3, dtype=torch.long), b["response_mask"]], 1)
    seen = {}

    def tokens_reward(input_ids, attention_mask):
        seen["shapes"] = (tuple(input_ids.shape), tuple(attention_mask.shape))
        return attention_mask.sum(-1).float() / 10  # the number of tokens, a tenth each

    manager = make_reward_manager({}, tokenizer, reward_fn=tokens_reward)
    assert manager.fn is None and manager.sequence_fn is tokens_reward
    scores, _ = manager(batch)
    assert seen["shapes"] == ((2, 11), (2, 11))
    assert scores[0, 1].item() == pytest.approx(0.5) and scores[1, 2].item() == pytest.approx(0.6)
    assert scores.sum().item() == pytest.approx(1.1)

    manager = make_reward_manager({}, tokenizer, reward_fn=lambda input_ids, attention_mask: 1.0)  # not a Tensor
    with pytest.raises(TypeError, match="must return a Tensor of shape"):
        manager(batch)
