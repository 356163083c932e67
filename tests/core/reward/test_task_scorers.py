"""The task scorers on answers written the way models write them (each case checked by hand), and `default`'s
dispatch by data source."""

from __future__ import annotations

import pytest

from verl.agents.sandbox import sandbox_problem
from verl.reward.dispatch import register_source, scorer_for
from verl.reward.functions import REWARD_FNS, get_reward_fn
from verl.reward.task_scorers import code_block, code_tests_score

# (response, ground truth, right?)
MATH_CASES = [
    ("So the sum is $\\boxed{\\frac{3}{4}}$.", "\\frac{3}{4}", True),
    ("The answer is \\boxed{0.75}.", "\\frac{3}{4}", True),  # a decimal for a fraction
    ("\\boxed{\\dfrac34}", "\\frac{3}{4}", True),  # \dfrac and unbraced arguments
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", True),  # equal radicals
    ("\\boxed{(x+1)^2}", "x^2+2x+1", True),  # an equivalent expression
    ("\\boxed{10\\text{ cm}}", "10", True),  # units
    ("\\boxed{1,000}", "1000", True),  # a thousands separator
    ("Final: $\\boxed{\\frac{1}{2}}$", "Half is $\\boxed{\\frac{1}{2}}$.", True),  # a ground truth that is a solution
    ("\\boxed{\\frac{2}{3}}", "\\frac{3}{4}", False),
    ("\\boxed{2\\sqrt{3}}", "\\sqrt{8}", False),
    ("I am not sure.", "7", False),
]


@pytest.mark.parametrize("response, truth, right", MATH_CASES)
def test_math_verify_judges_real_answer_formats(response, truth, right):
    out = REWARD_FNS.get("math_verify")("", response, truth, {})
    assert out["acc"] == float(right) and out["score"] == float(right)


def test_math_verify_gives_format_credit_to_a_wrong_answer_only_when_one_was_read():
    fn = get_reward_fn({"_target_": "math_verify", "format_score": 0.1})
    assert fn("", "\\boxed{5}", "6", {}) == {"score": 0.1, "acc": 0.0, "pred": "5"}
    assert fn("", "no idea", "6", {})["score"] == 0.0


@pytest.mark.parametrize(
    "response, truth, right",
    [
        ("48/2 = 24\n48 + 24 = 72\n#### 72", "72", True),
        ("#### 1,000", "1000", True),
        ("#### $18", "18", True),
        ("#### 71", "72", False),
        ("The answer is 72.", "72", False),  # strict: no "####"
    ],
)
def test_gsm8k_strict(response, truth, right):
    assert REWARD_FNS.get("gsm8k")("", response, truth, {}) == float(right)


def test_gsm8k_flexible_reads_the_last_number_without_a_marker():
    fn = REWARD_FNS.get("gsm8k_flexible")
    assert fn("", "The answer is 72.", "72", {}) == 1.0 and fn("", "So 3 + 4 = 7, then 70", "72", {}) == 0.0


@pytest.mark.parametrize(
    "response, pred",
    [
        ("The answer is (B).", "B"),
        ("Answer: C", "C"),
        ("**D**", "D"),
        ("A is wrong because ... so the answer is B", "B"),  # the last standalone letter
        ("\\boxed{C} (not A)", "C"),  # a box wins
        ("I think it is 4.", None),
    ],
)
def test_multiple_choice_reads_the_option_letter(response, pred):
    out = REWARD_FNS.get("multiple_choice")("", response, "B", {})
    assert out["pred"] == pred and out["acc"] == float(pred == "B")


def test_default_dispatches_by_data_source_and_names_an_unknown_one():
    default = get_reward_fn("default")
    assert default("", "\\boxed{\\frac12}", "0.5", {"data_source": "HuggingFaceH4/MATH-500"})["acc"] == 1.0
    assert default("", "#### 72", "72", {"data_source": "openai/gsm8k"}) == 1.0
    assert default("", "(B)", "B", {"data_source": "cais/mmlu"})["acc"] == 1.0
    assert default("", "12", "12", {"data_source": "embedded/arithmetic"}) == 1.0
    assert scorer_for("reasoning_gym/basic_arithmetic") is REWARD_FNS.get("reasoning_gym")  # by its prefix
    with pytest.raises(ValueError, match="no scorer for data_source 'my/set'.*register_source"):
        default("", "x", "y", {"data_source": "my/set"})


def test_a_registered_source_is_scored_by_its_scorer():
    register_source("verl-test/exact", lambda prompt, response, ground_truth, extra: float(response == ground_truth))
    try:
        assert get_reward_fn("default")("", "yes", "yes", {"data_source": "verl-test/exact"}) == 1.0
    finally:
        from verl.reward.dispatch import SOURCE_SCORERS

        SOURCE_SCORERS.unregister("verl-test/exact")


@pytest.mark.parametrize(
    "response, answer",
    [
        ("Adding up the terms.\n214", "214"),
        ("The final answer is 2.", "2"),
        ("1 + 5 = 6", "6"),
        ("205 - 838 + 505 = -128", "-128"),
        ("<answer>-4</answer> and more text", "-4"),  # a tag wins
        ("", ""),
    ],
)
def test_a_reasoning_gym_answer_is_read_from_the_tag_or_the_last_lines_final_clause(response, answer):
    from verl.reward.task_scorers import final_answer

    assert final_answer(response) == answer


MBPP_TESTS = '["assert first_repeated(\\"abcabc\\") == \\"a\\"", "assert first_repeated(\\"abc\\") is None"]'
SOLUTION = """def first_repeated(s):
    seen = set()
    for c in s:
        if c in seen:
            return c
        seen.add(c)
    return None
"""


def _code_score(response: str, truth: str = MBPP_TESTS, **extra):
    return get_reward_fn("default")("", response, truth, {"data_source": "mbpp", **extra})


@pytest.mark.skipif(sandbox_problem() is not None, reason=f"no sandbox on this machine: {sandbox_problem()}")
def test_code_is_right_when_its_tests_pass_in_the_sandbox():
    right = _code_score(f"Here it is:\n```python\n{SOLUTION}```\nIt keeps a set.")
    assert right == {"score": 1.0, "acc": 1.0, "pred": SOLUTION.strip()}
    assert _code_score(f"```python\n{SOLUTION.replace('return c', 'return None')}```")["acc"] == 0.0  # a test fails
    assert _code_score(f"```\n{SOLUTION}```")["acc"] == 1.0  # a bare block
    assert _code_score(SOLUTION) == {"score": 0.0, "acc": 0.0, "pred": None}  # no block: nothing was answered
    sleeper = "```python\nimport time\ndef first_repeated(s):\n    time.sleep(60)\n```"
    assert code_tests_score("", sleeper, MBPP_TESTS, {}, wall_s=2.0)["acc"] == 0.0  # (the wall limit ends it)
    # the tests run after setup code; the host's files are not there to read
    setup = "import collections"
    assert _code_score(f"```python\n{SOLUTION}```", test_setup_code=setup)["acc"] == 1.0
    leaky = "```python\ndef first_repeated(s):\n    return open('/etc/hostname').read()[0]\n```"
    assert _code_score(leaky, '["assert first_repeated(\\"x\\")"]')["acc"] == 0.0
    assert _code_score("```py\ndef f():\n    return 1\n```", '"assert f() == 1"')["acc"] == 1.0  # one test, bare


def test_code_block_takes_the_last_python_block():
    text = "```python\nx = 1\n```\nthen\n```python\nx = 2\n```"
    assert code_block(text) == "x = 2\n" and code_block("no code") is None
