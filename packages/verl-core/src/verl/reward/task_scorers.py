"""Scorers for the tasks users train on, beside the built-ins of `verl.reward.functions`: MATH-style answers by
symbolic equivalence (math-verify), multiple choice, reasoning-gym's own checkers, and code run against its tests
in the sandbox. Each returns a dict with "score", "acc" (whether it is right) and "pred" (the answer it read, what a
majority vote counts).
"""

from __future__ import annotations

import json
import re
import threading
from functools import cache
from typing import Any, Callable, Optional

from verl.reward.answers import last_boxed
from verl.reward.functions import gsm8k, register_reward

# Where an option letter is an answer, not a word ("I think", "A is wrong"): "(B)", "answer: C" / "answer is C",
# "**D**", a line holding the letter alone ("C." too)
_CHOICE_RES = (
    re.compile(r"\(([A-Z])\)"),
    re.compile(r"answer\s*(?:is|:)?\s*\**\(?([A-Z])\b", re.I),
    re.compile(r"\*\*([A-Z])\*\*"),
    re.compile(r"^\s*([A-Z])[.)]?\s*$", re.M),
)
_ANSWER_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.S)
_CODE_BLOCK_RE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S | re.I)


def _result(right: bool, pred: Optional[str], format_score: float = 0.0) -> dict:
    score = 1.0 if right else (float(format_score) if pred is not None else 0.0)
    return {"score": score, "acc": float(right), "pred": pred}


@register_reward("math_verify")
def math_verify_score(prompt: str, response: str, ground_truth: str, extra: dict, *, format_score: float = 0.0) -> dict:
    r"""Right when the response's final answer (its last \boxed{...}, else the last LaTeX or plain expression) is
    mathematically equal to the ground truth (math-verify: fractions, radicals, units, thousands separators,
    equivalent expressions); `format_score` for an answer that is wrong. A ground truth holding a \boxed{...} (a
    whole MATH solution) is reduced to that box."""
    from math_verify import parse, verify  # pants: no-infer-dep (the `math` extra)

    # math-verify bounds its sympy work with SIGALRM, which only the main thread may set (reward.num_workers
    # scores from threads): there it runs without the bound
    main = threading.current_thread() is threading.main_thread()
    timeout = 5 if main else None
    reference = last_boxed(str(ground_truth))
    gold = parse(f"\\boxed{{{reference if reference is not None else ground_truth}}}", parsing_timeout=timeout)
    answer = parse(response, parsing_timeout=timeout)
    if not answer:
        return _result(False, None)
    right = bool(gold) and verify(gold, answer, timeout_seconds=timeout)
    return _result(right, str(answer[-1]), format_score)


@register_reward("gsm8k_flexible")
def gsm8k_flexible(prompt: str, response: str, ground_truth: str, extra: dict, *, format_score: float = 0.0) -> float:
    """gsm8k, reading the last number of the response when it has no "####" answer (GSM8K's flexible match)."""
    return gsm8k(prompt, response, ground_truth, extra, flexible=True, format_score=format_score)


def last_choice(response: str, letters: str) -> Optional[str]:
    """The option letter of `letters` the response answers with last ("(B)", "Answer: C", "**D**", "C" alone)."""
    found = [(m.start(1), m.group(1)) for r in _CHOICE_RES for m in r.finditer(response) if m.group(1) in letters]
    return max(found)[1] if found else None


@register_reward("multiple_choice")
def multiple_choice(prompt: str, response: str, ground_truth: str, extra: dict, *, letters: str = "ABCDEFGHIJ") -> dict:
    """Right when the last option letter in the response (its \\boxed{...} first) is the ground truth's letter."""
    boxed = (last_boxed(response) or "").strip().strip("()")
    pred = boxed if len(boxed) == 1 and boxed in letters else last_choice(response, letters)
    return _result(pred is not None and pred == str(ground_truth).strip().upper(), pred)


def final_answer(response: str) -> str:
    """What a reasoning-gym answer is read from: the last <answer>...</answer>; else the last non-empty line's final
    clause (after its last "=" or " is ": "The final answer is 6." and "1 + 5 = 6" both give "6"), without a
    trailing period."""
    tagged = _ANSWER_TAG_RE.findall(response)
    if tagged:
        return tagged[-1].strip()
    lines = [line.strip() for line in response.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    clause = re.split(r"=| is ", last)[-1].strip()
    return clause[:-1].rstrip() if clause.endswith(".") else clause


@cache
def _gym_checker(task: str) -> Callable[[Optional[str], dict], float]:
    import reasoning_gym  # pants: no-infer-dep (the `gym` extra)

    return reasoning_gym.get_score_answer_fn(task)


@register_reward("reasoning_gym")
def reasoning_gym_score(prompt: str, response: str, ground_truth: str, extra: dict) -> dict:
    """reasoning-gym's own checker for the row's task (extra_info.reasoning_gym: {task, entry}, as
    `verl data prepare reasoning_gym` writes it) on the response's final answer; right at a full score."""
    info: Any = extra.get("reasoning_gym")
    if not isinstance(info, dict) or "task" not in info or "entry" not in info:
        raise ValueError(
            "reasoning_gym scores rows written by `verl data prepare reasoning_gym` (extra_info.reasoning_gym with "
            f"task and entry); this row's extra_info has {sorted(extra)}"
        )
    entry = json.loads(info["entry"]) if isinstance(info["entry"], str) else info["entry"]
    pred = final_answer(response)
    score = float(_gym_checker(str(info["task"]))(pred, entry))
    return {"score": score, "acc": float(score >= 1.0), "pred": pred}


def code_block(response: str) -> Optional[str]:
    """The program in a response: its last ```python (or bare ```) block; None when it has none."""
    blocks = _CODE_BLOCK_RE.findall(response)
    return blocks[-1] if blocks else None


@register_reward("code_tests")
def code_tests_score(
    prompt: str, response: str, ground_truth: str, extra: dict, *, cpu_s: int = 5, wall_s: float = 10.0
) -> dict:
    """Right when the response's code passes every test (`ground_truth`: a JSON list of Python statements, e.g.
    asserts, as `verl data prepare mbpp` writes; extra_info.test_setup_code runs first), run in the sandbox
    (verl.agents.sandbox: no network, none of the host's files, `cpu_s` CPU and `wall_s` wall seconds)."""
    from verl.agents.sandbox import SandboxLimits, run_sandboxed_blocking, sandbox_problem

    problem = sandbox_problem()
    if problem:
        raise RuntimeError(f"code_tests runs code only in the sandbox, which this machine cannot make: {problem}")
    tests = json.loads(ground_truth) if ground_truth.lstrip().startswith("[") else [ground_truth]
    code = code_block(response)
    if code is None:
        return _result(False, None)
    program = "\n".join([str(extra.get("test_setup_code") or ""), code, *map(str, tests)])
    result = run_sandboxed_blocking(program, SandboxLimits(cpu_s=cpu_s, wall_s=wall_s))
    return _result(result.status == "ok", code.strip())
