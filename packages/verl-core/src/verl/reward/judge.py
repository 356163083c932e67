"""A generative judge as a reward: an LLM prompted to rate each response, its rating parsed from what it writes.

    reward:
      model:
        _target_: verl.reward.judge.GenerativeJudge
        path: /models/judge                 # a Hugging Face causal LM folder
        backend: vllm                       # the rollout engine it generates with: hf | vllm | sglang

Keys (all but `path` optional):
  path, tokenizer_path   the judge model, and its tokenizer when elsewhere (None: `path`)
  backend                the rollout engine (verl-rollout's registry): hf (transformers, CPU or GPU), vllm, sglang
  template               the judge prompt; `{response}` is the policy's response, `{question}` the prompt's last
                         user message (optional placeholder); write literal braces as `{{` and `}}`
  score_pattern          a regex; its last match in the judge's output is the score (group 1 when it has groups)
  max_score              scores are divided by it (10: a 0-10 rating becomes 0-1)
  max_new_tokens         the judge's output length limit
  batch_size             prompts per generate call
  unparsed_score         the score of an output with no parseable match
  device, dtype          where the engine runs; dtype is for engines that take one (vllm/sglang on GPU: the hf
                         engine, and any engine on CPU, computes in float32)
  rollout                rollout config keys for the judge's engine, e.g. {gpu_memory_utilization: 0.2} beside a
                         vLLM policy on the same GPU

The judge prompt is rendered as one user message with the judge tokenizer's chat template (with the generation
prompt), or is the text itself when the tokenizer has none, and is generated greedily. The engine is built the way
the trainer builds its rollout (`RolloutEngine.build`) from a `RolloutConfig` of defaults with temperature 0 and no
sleep mode (the judge's engine never sleeps), plus `rollout`; it keeps its own weights and never receives new ones.
Prompts are not truncated: one longer than the judge's context is the engine's error.

After each call, `last_outputs` holds the decoded judge outputs and `last_metrics` (which RewardManager reports as
reward/model/<key>): judge/unparsed (outputs without a score), judge/truncated (outputs that hit max_new_tokens
before an eos) and judge/mean_output_tokens.
"""

from __future__ import annotations

import math
import re
import string
from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch

from verl.backends import check_backend
from verl.config.errors import errors
from verl.engine_protocol import DTYPES, RolloutSettings, eos_and_pad, load_engine
from verl.rollout_batch import left_padded

__all__ = ["DEFAULT_SCORE_PATTERN", "DEFAULT_TEMPLATE", "GenerativeJudge", "parse_score"]

DEFAULT_TEMPLATE = (
    "Rate how well the response answers the question, from 0 (wrong or unhelpful) to 10 (correct and complete).\n\n"
    "Question:\n{question}\n\n"
    "Response:\n{response}\n\n"
    "Reply with one short sentence of reasoning, then a last line of the form `Score: N`."
)
DEFAULT_SCORE_PATTERN = r"Score:\s*(-?\d+(?:\.\d+)?)"
_PLACEHOLDERS = ("question", "response")
_KEY = "reward.model"


class GenerativeJudge:
    def __init__(
        self,
        path: str,
        *,
        tokenizer_path: Optional[str] = None,
        backend: str = "hf",
        template: str = DEFAULT_TEMPLATE,
        score_pattern: str = DEFAULT_SCORE_PATTERN,
        max_score: float = 10.0,
        max_new_tokens: int = 32,
        batch_size: int = 16,
        unparsed_score: float = 0.0,
        device: str = "cpu",
        dtype: str = "bfloat16",
        rollout: Optional[Mapping[str, Any]] = None,
    ):
        from transformers import AutoTokenizer

        self.template = check_template(template)
        self.pattern = check_pattern(score_pattern)
        self.max_score = float(_positive("max_score", max_score))
        self.max_new_tokens = _positive("max_new_tokens", max_new_tokens, integer=True)
        self.batch_size = _positive("batch_size", batch_size, integer=True)
        self.unparsed_score = float(unparsed_score)
        if dtype not in DTYPES:
            raise ValueError(f"{_KEY}.dtype: '{dtype}' is not one of {', '.join(DTYPES)}")
        check_backend_name(backend)
        engine_cfg = _rollout_config(rollout)  # all checks before anything loads
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path or path)
        if self.tokenizer.eos_token_id is None:
            raise ValueError(f"{_KEY}.tokenizer_path: the judge's tokenizer has no eos token, so it could not stop")
        self.eos_ids, self.pad_id = eos_and_pad(self.tokenizer)
        # no prompt limit, no LoRA adapters
        settings = RolloutSettings(self.max_new_tokens, tuple(self.eos_ids), self.pad_id, device=device, dtype=dtype)
        self.engine = load_engine(backend, "rollout").build(engine_cfg, model_path=path, settings=settings)
        self.last_outputs: List[str] = []
        self.last_metrics: Dict[str, float] = {}

    def prompt(self, conversation: Sequence[Mapping[str, Any]], response: str) -> str:
        """The judge's prompt text: the template filled in, as one user message in the judge's chat template."""
        content = self.template.format(question=question_of(conversation), response=response)
        if not self.tokenizer.chat_template:
            return content
        messages = [{"role": "user", "content": content}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def prompt_ids(self, text: str) -> List[int]:
        """The prompt's token ids. A chat template writes its own special tokens (bos); plain text gets the
        tokenizer's usual ones, as the judge saw text in pre-training."""
        return self.tokenizer(text, add_special_tokens=not self.tokenizer.chat_template)["input_ids"]

    @torch.no_grad()
    def score_texts(
        self, conversations: Sequence[Sequence[Mapping[str, Any]]], responses: Sequence[str]
    ) -> torch.Tensor:
        """One score per (conversation, response): the judge's parsed rating / max_score, float32 [B]."""
        if len(conversations) != len(responses):
            raise ValueError(f"{len(conversations)} conversations but {len(responses)} responses")
        rows = [self.prompt_ids(self.prompt(c, r)) for c, r in zip(conversations, responses)]
        generated: List[List[int]] = []
        for start in range(0, len(rows), self.batch_size):
            generated += self._generate(rows[start : start + self.batch_size])
        outputs = self.tokenizer.batch_decode(generated, skip_special_tokens=True)
        parsed = [parse_score(text, self.pattern, self.max_score) for text in outputs]
        self.last_outputs = outputs
        self.last_metrics = {
            "judge/unparsed": float(sum(p is None for p in parsed)),
            # the mask ends at an eos, so an output ending on anything else ran out of tokens
            "judge/truncated": float(sum(not ids or ids[-1] not in self.eos_ids for ids in generated)),
            "judge/mean_output_tokens": float(sum(map(len, generated)) / len(generated)) if generated else 0.0,
        }
        scores = [self.unparsed_score if p is None else p for p in parsed]
        return torch.tensor(scores, dtype=torch.float32)

    def _generate(self, rows: List[List[int]]) -> List[List[int]]:
        """The greedy output token ids of each prompt row, up to and including its eos."""
        out = self.engine.generate(
            left_padded(rows, self.pad_id), n=1, temperature=0.0, max_new_tokens=self.max_new_tokens
        )
        responses, mask = out.batch["responses"], out.batch["response_mask"].bool()
        return [row[keep].tolist() for row, keep in zip(responses, mask)]


# ---------------------------------------------------------------------- parsing and checks


def parse_score(text: str, pattern: re.Pattern, max_score: float = 10.0) -> Optional[float]:
    """The last match of `pattern` in `text` (its group 1 when it has groups) as a number / max_score; None when
    nothing matches or the match is not a finite number."""
    matches = list(pattern.finditer(text))
    if not matches:
        return None
    last = matches[-1]
    try:
        value = float(last.group(1) if pattern.groups else last.group(0))
    except (TypeError, ValueError):  # TypeError: an optional group that did not take part
        return None
    return value / max_score if math.isfinite(value) else None


def question_of(conversation: Sequence[Mapping[str, Any]]) -> str:
    """The conversation's last user message, or (without one) its messages' contents, one per line."""
    for message in reversed(conversation):
        if message.get("role") == "user":
            return str(message.get("content", ""))
    return "\n".join(str(m.get("content", "")) for m in conversation)


def check_template(template: Any) -> str:
    """`template` when it is a str.format template with {response} and no placeholder but {question}/{response}."""
    fix = "write a prompt with {response} (and optionally {question}); literal braces as {{ and }}"
    if not isinstance(template, str):
        raise ValueError(f"{_KEY}.template: expected a string, got {type(template).__name__}; fix: {fix}")
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as e:  # an unmatched brace
        raise ValueError(f"{_KEY}.template: not a valid format string ({e}); fix: {fix}") from None
    unknown = sorted(fields - set(_PLACEHOLDERS))
    if unknown:
        shown = ", ".join("{" + name + "}" for name in unknown)
        raise ValueError(f"{_KEY}.template: unknown placeholder {shown}; fix: {fix}")
    if "response" not in fields:
        raise ValueError(f"{_KEY}.template: the template is missing {{response}}; fix: {fix}")
    return template


def check_pattern(score_pattern: Any) -> re.Pattern:
    """`score_pattern` compiled, or a ValueError naming the key."""
    fix = r"write a Python regex whose group 1 (or whole match) is the number, e.g. Score:\s*(-?\d+(?:\.\d+)?)"
    if not isinstance(score_pattern, str):
        raise ValueError(f"{_KEY}.score_pattern: expected a string, got {type(score_pattern).__name__}; fix: {fix}")
    try:
        return re.compile(score_pattern)
    except re.error as e:
        raise ValueError(f"{_KEY}.score_pattern: {score_pattern!r} is not a valid regex ({e}); fix: {fix}") from None


def check_backend_name(backend: str) -> None:
    """A ValueError naming the key unless `backend` is an installed rollout backend (verl-rollout's registry)."""
    problems = errors(check_backend(f"{_KEY}.backend", backend, "rollout"))
    if problems:
        raise ValueError("; ".join(f"{p.key}: {p.message}; fix: {p.fix}" for p in problems))


def _positive(name: str, value: Any, *, integer: bool = False) -> Any:
    """`value` when it is a positive finite number (an int when `integer`), else a ValueError naming the key."""
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not (0 < value < math.inf):
        what = "a positive integer" if integer else "a positive number"
        raise ValueError(f"{_KEY}.{name}: must be {what}, got {value!r}")
    return value


def _rollout_config(overrides: Optional[Mapping[str, Any]]) -> Any:
    """The judge engine's rollout config section: greedy, never asleep, with `overrides` (checked like a recipe's)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from verl.config.schema import RolloutConfig

    base = OmegaConf.structured(RolloutConfig(temperature=0.0, free_cache_engine=False))
    try:
        return OmegaConf.merge(base, dict(overrides or {}))
    except (OmegaConfBaseException, TypeError, ValueError) as e:
        full_key = getattr(e, "full_key", None)
        key = f"{_KEY}.rollout" + (f".{full_key}" if full_key else "")
        fix = "use the keys and types of the rollout section (verl.config.schema.RolloutConfig)"
        raise ValueError(f"{key}: {str(e).splitlines()[0]}; fix: {fix}") from None
