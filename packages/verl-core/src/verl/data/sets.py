"""The data sets `verl data prepare` knows, each from its own published layout to verl's RL rows
(`verl.data.prepare`). Their data sources are the ones `reward.fn: default` scores (`verl.reward.dispatch`)."""

from __future__ import annotations

import io
import json
from typing import Any, Dict, List, Optional

from verl.data.prepare import register_data_set, rl_row
from verl.reward.answers import gsm8k_answer, last_boxed

GSM8K_FORMAT = 'Let\'s think step by step and output the final answer after "####".'
BOXED_FORMAT = "Let's think step by step and output the final answer within \\boxed{}."
CHOICE_FORMAT = "Answer with the letter of the correct option."
GYM_FORMAT = "Give only the final answer, on the last line."
CODE_FORMAT = "Write the function in Python, in one ```python code block."
LETTERS = "ABCDEFGHIJ"


@register_data_set(
    "gsm8k", hub_id="openai/gsm8k", hub_config="main", layout='{"question": ..., "answer": "... #### 72"}'
)
def gsm8k(record: Dict[str, Any], index: int, split: str) -> Optional[Dict[str, Any]]:
    """GSM8K: the number after "####" in the worked answer is the ground truth (commas dropped)."""
    answer = gsm8k_answer(str(record["answer"]))
    if answer is None:
        return None
    question = str(record["question"])
    return rl_row(
        "openai/gsm8k",
        f"{question} {GSM8K_FORMAT}",
        answer.replace(",", ""),
        split,
        index,
        extra={"question": question},
    )


def _math_row(source: str, record: Dict[str, Any], index: int, split: str) -> Optional[Dict[str, Any]]:
    """A MATH-style problem: the ground truth is `answer` when the set gives one, else the solution's last box."""
    answer = record.get("answer")
    if not answer:
        answer = last_boxed(str(record.get("solution", "")))
    if not answer:
        return None
    extra = {k: record[k] for k in ("level", "type", "subject", "unique_id") if record.get(k) is not None}
    return rl_row(source, f"{record['problem']} {BOXED_FORMAT}", str(answer), split, index, extra=extra)


@register_data_set(
    "math",
    hub_id="hendrycks/competition_math",
    layout='{"problem": ..., "solution": "... \\\\boxed{...}", "level": ..., "type": ...} (a file, or the release\'s folder)',
)
def math(record: Dict[str, Any], index: int, split: str) -> Optional[Dict[str, Any]]:
    """MATH (Hendrycks et al.): the answer is the solution's last \\boxed{...}."""
    return _math_row("lighteval/MATH", record, index, split)


@register_data_set(
    "math500",
    hub_id="HuggingFaceH4/MATH-500",
    layout='{"problem": ..., "solution": ..., "answer": ..., "subject": ..., "level": ..., "unique_id": ...}',
)
def math500(record: Dict[str, Any], index: int, split: str) -> Optional[Dict[str, Any]]:
    """MATH-500 (the held-out 500 of "Let's Verify Step by Step"): its `answer` column is the ground truth."""
    return _math_row("HuggingFaceH4/MATH-500", record, index, split)


@register_data_set(
    "dapo_math",
    hub_id="BytedTsinghua-SIA/DAPO-Math-17k",
    layout='verl rows: {"prompt": [{"role": "user", "content": ...}], "reward_model": {"ground_truth": ...}, ...}',
)
def dapo_math(record: Dict[str, Any], index: int, split: str) -> Optional[Dict[str, Any]]:
    """DAPO-Math-17k: already in verl's format with an integer answer; kept, its data source made `math_dapo`."""
    prompt = record.get("prompt")
    truth = (record.get("reward_model") or {}).get("ground_truth")
    if not prompt or truth is None:
        return None
    messages = [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]
    given = {k: v for k, v in (record.get("extra_info") or {}).items() if v is not None and k != "split"}
    extra = {("source_index" if k == "index" else k): str(v) for k, v in given.items()}
    row = rl_row("math_dapo", "", str(truth), split, index, extra=extra)
    return {**row, "prompt": messages}


@register_data_set(
    "mmlu",
    hub_id="cais/mmlu",
    hub_config="all",
    layout='{"question": ..., "choices": [4 options], "answer": index of the right one, "subject": ...}',
)
def mmlu(record: Dict[str, Any], index: int, split: str) -> Optional[Dict[str, Any]]:
    """MMLU-style multiple choice: options lettered A, B, ...; the ground truth is the right option's letter."""
    choices: List[str] = [str(c) for c in record["choices"]]
    options = "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(choices))
    question = f"{record['question']}\n\n{options}\n\n{CHOICE_FORMAT}"
    extra = {"subject": str(record["subject"])} if record.get("subject") else {}
    return rl_row("cais/mmlu", question, LETTERS[int(record["answer"])], split, index, "knowledge", extra)


@register_data_set(
    "mbpp",
    hub_id="google-research-datasets/mbpp",
    hub_config="full",
    layout='{"task_id": ..., "text": the task, "code": a solution, "test_list": ["assert f(...) == ...", ...], '
    '"test_setup_code": ...}',
)
def mbpp(record: Dict[str, Any], index: int, split: str) -> Optional[Dict[str, Any]]:
    """MBPP: the task and its tests in the prompt (so the function's name and signature are known); the tests are
    the ground truth, run against the answer's code in the sandbox (`reward.fn: code_tests`)."""
    tests = [str(t) for t in record["test_list"]]
    if not tests:
        return None
    shown = "\n".join(tests)
    question = f"{record['text']}\nYour code should pass these tests:\n{shown}\n{CODE_FORMAT}"
    extra = {"task_id": str(record.get("task_id", index)), "test_setup_code": str(record.get("test_setup_code") or "")}
    return rl_row("mbpp", question, json.dumps(tests), split, index, "code", extra)


@register_data_set(
    "geometry3k",
    hub_id="hiyouga/geometry3k",
    layout='{"images": [an image: {"bytes": ...} or PIL], "problem": "<image>... question", "answer": "..."}',
)
def geometry3k(record: Dict[str, Any], index: int, split: str) -> Optional[Dict[str, Any]]:
    """Geometry3K: a diagram and a question about it (its `<image>` placeholder where the diagram goes); the answer
    (a number or a LaTeX expression) is the ground truth, scored from the response's last box."""
    problem, images = str(record["problem"]), [image_bytes(i) for i in record["images"] or []]
    if problem.count("<image>") != len(images):  # (the loader would refuse the row; say it here, by record)
        raise ValueError(f"the problem has {problem.count('<image>')} <image> placeholders for {len(images)} images")
    row = rl_row("hiyouga/geometry3k", f"{problem} {BOXED_FORMAT}", str(record["answer"]), split, index)
    return {**row, "images": images}


def image_bytes(image: Any) -> bytes:
    """An image as encoded bytes: a parquet image cell ({"bytes": ...}) as it is, a PIL image (as the `datasets`
    library decodes one) as PNG."""
    if isinstance(image, dict) and image.get("bytes") is not None:
        return bytes(image["bytes"])
    if isinstance(image, (bytes, bytearray)):
        return bytes(image)
    if hasattr(image, "save"):
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        return buffer.getvalue()
    raise TypeError(f"an image must be encoded bytes, {{'bytes': ...}} or a PIL image, not {type(image).__name__}")


@register_data_set("reasoning_gym", hub_id=None, layout="generated by reasoning-gym (no input file)")
def reasoning_gym(
    split: str, size: int = 1000, seed: int = 0, task: str = "chain_sum", **options: Any
) -> List[Dict[str, Any]]:
    """`size` problems of a reasoning-gym task, generated offline from `seed` (a train and a test split want
    different seeds); `options` set the task's own config (chain_sum: max_terms=3, max_digits=2, ...). Each row
    keeps its entry for the task's own checker (`reward.fn: reasoning_gym`)."""
    import reasoning_gym as gym  # pants: no-infer-dep (the `gym` extra)

    try:
        generated = gym.create_dataset(task, size=size, seed=seed, **options)
    except (TypeError, AssertionError) as e:  # an option the task's config lacks, or a value it refuses
        raise ValueError(f"reasoning_gym task {task!r}: {e}") from e
    rows = []
    for i, entry in enumerate(generated):
        entry = json.loads(json.dumps(entry, default=list))  # (tuples in its metadata: what the checker reads back)
        checked = {"task": task, "entry": json.dumps(entry)}
        question = f"{entry['question']}\n{GYM_FORMAT}"
        rows.append(
            rl_row(f"reasoning_gym/{task}", question, str(entry["answer"]), split, i, extra={"reasoning_gym": checked})
        )
    return rows
