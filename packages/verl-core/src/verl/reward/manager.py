"""Scoring a batch of rollouts: decode each response, score it, and put the score on its last token.

The score of a sample is the reward function's result, the reward model's output, or their sum when
both are configured. Non-finite scores never reach training: each is counted, reported with its sample,
and replaced (+inf by the clamp's high bound, -inf and NaN by its low bound, 0.0 without a clamp).
A clamp then bounds every score.

Metrics (all floats):
  reward/score/mean|max|min       over the per-sample reward training sees (token scores summed per row,
                                  so an empty response counts as 0: its score has no token to sit on)
  reward/accuracy                 the mean of the function's "acc" entry when it returns one, else the
                                  fraction of samples whose function score is >= 1.0 (full credit: 0/1
                                  and -1/1 rewards give the plain accuracy, a format bonus does not count)
  reward/<data_source>/mean       per data source; also .../accuracy when a function is configured
  reward/extra/<key>              the mean of each other numeric entry of dict results
  reward/model_score/mean         the reward model's mean output, when there is a model
  reward/model/<key>              each numeric entry of the model's `last_metrics`, when it keeps one
                                  (e.g. a generative judge's judge/unparsed)
  reward/empty_responses          samples with no generated token
  reward/nonfinite_count          NaN/inf scores replaced in this batch
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from numbers import Real
from typing import Any, List

import numpy as np
import torch

from verl.algos.utils import config_value
from verl.config.instantiate import instantiate
from verl.config.schema import RewardConfig
from verl.protocol import DataProto
from verl.reward.functions import RewardFn, _describe, _error, get_reward_fn, is_sequence_reward

__all__ = ["RewardFunctionError", "RewardManager", "make_reward_manager"]

logger = logging.getLogger(__name__)

_SHOWN_CHARS = 300  # of a prompt or response in an error message: the head and the tail
_MAX_WARNINGS = 3  # non-finite warnings per batch; the rest are only counted
_OWN_KEYS = {"score", "accuracy", "extra", "model_score", "empty_responses", "nonfinite_count", "fn_errors"}


class RewardFunctionError(RuntimeError):
    """A reward function failed on one sample; the message names the sample, the cause is chained."""

    def __init__(self, message: str, *, row: int, index: Any, data_source: str):
        super().__init__(message)
        self.row, self.index, self.data_source = row, index, data_source


@dataclass(frozen=True)
class _FnResult:
    score: float
    acc: float | None
    extras: dict[str, float]
    pred: str | None = None  # the answer read from the response: the function's "pred", else the text (votes)

    @property
    def correct(self) -> float:
        """The function's "acc" when it gives one, else full credit (score >= 1.0): a format bonus is not right."""
        return self.acc if self.acc is not None else float(self.score >= 1.0)


class RewardManager:
    """Turns a rollout batch into token-level scores [B, T] and reward metrics."""

    def __init__(
        self,
        fn: RewardFn | None,
        *,
        tokenizer: Any,
        clamp: tuple[float, float] | None = None,
        reward_model: Any = None,
        sequence_fn: Any = None,
        server: Any = None,
        weights: Mapping[str, float] | None = None,
        num_workers: int = 0,
        on_error: str = "raise",
        error_score: float = 0.0,
    ):
        if fn is None and reward_model is None and sequence_fn is None and server is None:
            raise ValueError("RewardManager needs a reward function (fn), a sequence_fn, a reward_model or a server")
        if fn is not None and tokenizer is None:
            raise ValueError("RewardManager needs a tokenizer to decode responses for the reward function")
        if reward_model is not None and not _scores_something(reward_model):
            raise TypeError(
                f"reward_model must have forward(prompt_ids, response_ids) or score_texts(conversations, responses), "
                f"got {type(reward_model)}"
            )
        self.fn = fn
        self.tokenizer = tokenizer
        self.clamp = _check_clamp(clamp)
        self.reward_model = reward_model
        self.sequence_fn = sequence_fn  # fn(input_ids, attention_mask) -> Tensor[B] on the whole rows
        self.server = server  # verl.reward.server_scores.ServerScores: scores from the reward server's clients
        self.last_missing = None  # with a server: the rows of the last call whose score did not arrive
        # per row of the last call: whether it is right (`_FnResult.correct`; without a function, score > 0) and
        # the answer it gave (the function's "pred", else the response text; None without a function)
        self.last_correct: list[float] = []
        self.last_answers: list[str | None] = []
        self.weights = dict(weights or {})  # reward.weights: source -> weight in the sum (1 when not given)
        self.num_workers = num_workers
        if on_error not in ("raise", "score"):
            raise ValueError(f"on_error must be 'raise' or 'score', got {on_error!r}")
        self.on_error, self.error_score = on_error, error_score

    def __call__(self, batch: DataProto) -> tuple[torch.Tensor, dict[str, float]]:
        responses = _tensor(batch, "responses")
        mask = _tensor(batch, "response_mask")
        if responses.shape != mask.shape or responses.dim() != 2:
            raise ValueError(
                f"responses {tuple(responses.shape)} and response_mask {tuple(mask.shape)} must both be [B, T]"
            )
        n = responses.shape[0]
        sources = [str(s) for s in batch.non_tensor_batch.get("data_source", ["unknown"] * n)]
        indices = _dataset_indices(batch, n)
        scores = torch.zeros(n, dtype=torch.float64)
        replaced: List[Any] = []  # (row, raw value, what replaced it, origin)
        metrics: dict[str, float] = {}

        fn_results = None
        if self.fn is not None:
            failures: list[RewardFunctionError] = []
            fn_results = self._fn_results(batch, responses, mask, sources, indices, failures)
            scores += self.weight("fn") * self._finite([r.score for r in fn_results], "reward.fn", replaced)
            metrics["reward/fn_errors"] = float(len(failures))
            for failure in failures[:_MAX_WARNINGS]:
                logger.warning("%s\n  scored %s (reward.on_error=score)", failure, self.error_score)
        if self.sequence_fn is not None:
            with torch.no_grad():
                out = self.sequence_fn(_tensor(batch, "input_ids"), _tensor(batch, "attention_mask"))
            scores += self.weight("fn") * self._finite(
                _per_sample(out, n, f"reward_fn {_describe(self.sequence_fn)}"), "reward_fn", replaced
            )
        self.last_missing = None
        if self.server is not None:  # scores posted by clients of the reward server (reward.server)
            server_scores, self.last_missing, server_metrics = self.server(
                _prompts(batch, self.tokenizer, n),
                self._texts(batch, responses, mask),
                sources,
                groups=batch.non_tensor_batch.get("uid"),  # a prompt's samples: what a preference compares
            )
            scores += self.weight("server") * self._finite(server_scores, "reward.server", replaced)
            metrics.update(server_metrics)
        if self.reward_model is not None:
            model_scores = self._finite(self._model_scores(batch, responses, mask), "reward.model", replaced)
            metrics["reward/model_score/mean"] = _mean(model_scores.tolist())
            metrics.update(_model_metrics(self.reward_model))
            scores += self.weight("model") * model_scores
        if self.clamp is not None:
            scores = scores.clamp(*self.clamp)
        self._warn_nonfinite(replaced, batch, sources, indices)

        # The score sits on the last generated token: the mask's last 1, not mask.sum() - 1, since a multi-turn
        # mask has holes (tool output). A row without a generated token has nowhere to put its score.
        keep = mask.bool()
        is_last = keep & (keep.flip(1).cumsum(dim=1).flip(1) == 1)
        token_level_scores = torch.where(is_last, scores.to(responses.device, torch.float32).unsqueeze(1), 0.0)

        seq_scores = token_level_scores.sum(dim=1).double().cpu()
        if fn_results is not None:
            self.last_correct, self.last_answers = [r.correct for r in fn_results], [r.pred for r in fn_results]
        else:
            self.last_correct, self.last_answers = [float(v > 0) for v in seq_scores.tolist()], [None] * n
        metrics.update(_score_metrics(seq_scores, sources, fn_results))
        metrics["reward/empty_responses"] = float(n - int(is_last.sum()))
        metrics["reward/nonfinite_count"] = float(len(replaced))
        return token_level_scores, metrics

    def weight(self, source: str) -> float:
        """A source's weight in the sum of scores: reward.weights[source], else 1."""
        return float(self.weights.get(source, 1.0))

    # ------------------------------------------------------------------ the reward function

    def _fn_results(
        self,
        batch: DataProto,
        responses: torch.Tensor,
        mask: torch.Tensor,
        sources: list[str],
        indices: list,
        failures: list,
    ) -> list[_FnResult]:
        """Each row's result; a row whose function raised or returned no number raises, or (on_error=score) scores
        error_score and is added to `failures`."""
        n = responses.shape[0]
        texts = self._texts(batch, responses, mask)
        agents = batch.non_tensor_batch.get("agent")  # and the whole episode (turns, tool calls) is extra["agent"]
        prompts = _prompts(batch, self.tokenizer, n)
        ground_truths = batch.non_tensor_batch.get("ground_truth")
        if ground_truths is None:
            raise KeyError(
                "the batch has no non-tensor 'ground_truth', which the reward function needs; "
                f"non-tensor keys are {sorted(batch.non_tensor_batch)} (the dataset must provide it)"
            )
        truths = ["" if t is None else str(t) for t in ground_truths]
        extra_infos = batch.non_tensor_batch.get("extra_info", [None] * n)

        def score(i: int) -> _FnResult:
            extra = dict(extra_infos[i]) if isinstance(extra_infos[i], Mapping) else {}
            extra.setdefault("data_source", sources[i])
            if agents is not None:
                extra["agent"] = agents[i]
            try:
                return _parse_result(self.fn(prompts[i], texts[i], truths[i], extra))
            except Exception as e:
                message = (
                    f"reward function {_describe(self.fn)} raised {type(e).__name__}: {e}\n"
                    f"  on batch row {i} (data_source={sources[i]!r}, dataset index={indices[i]!r})\n"
                    f"  prompt: {_shorten(prompts[i])!r}\n"
                    f"  response: {_shorten(texts[i])!r}\n"
                    f"  ground_truth: {_shorten(truths[i])!r}"
                )
                error = RewardFunctionError(message, row=i, index=indices[i], data_source=sources[i])
                if self.on_error == "raise":
                    raise error from e
                failures.append(error)  # list.append is atomic: safe from the scoring threads
                return _FnResult(self.error_score, None, {})

        if self.num_workers > 1 and n > 1:
            # Threads help only when the function waits (a sandbox, an HTTP judge); map keeps row order,
            # so the first failing row in order is the one reported.
            with ThreadPoolExecutor(max_workers=self.num_workers, thread_name_prefix="reward") as pool:
                results = list(pool.map(score, range(n)))
        else:
            results = [score(i) for i in range(n)]
        # the answer each gave: the function's "pred", else the response text
        return [r if r.pred is not None else replace(r, pred=t.strip()) for r, t in zip(results, texts)]

    def _texts(self, batch: DataProto, responses: torch.Tensor, mask: torch.Tensor) -> list[str]:
        """Each row's response as text."""
        if "response_text" in batch.non_tensor_batch:  # agent trajectories: the final model turn is the response
            return [str(t) for t in batch.non_tensor_batch["response_text"]]
        return self.tokenizer.batch_decode(
            [row[m].tolist() for row, m in zip(responses.cpu(), mask.bool().cpu())], skip_special_tokens=True
        )

    # ------------------------------------------------------------------ the reward model

    def _model_scores(self, batch: DataProto, responses: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        model = self.reward_model
        if callable(getattr(model, "score_texts", None)):  # a model with a tokenizer of its own: texts, re-rendered
            n = responses.shape[0]
            conversations: Any = batch.non_tensor_batch.get("messages")
            if conversations is None:  # (a batch from a dataset without the conversation: its prompt as one turn)
                conversations = [[{"role": "user", "content": p}] for p in _prompts(batch, self.tokenizer, n)]
            out = model.score_texts([list(c) for c in conversations], self._texts(batch, responses, mask))
            return _per_sample(out, n, "reward.model score_texts")
        prompts = _tensor(batch, "prompts")
        with torch.no_grad():
            # nn.Module.__call__ runs the module's hooks (FSDP gathers its parameters in one).
            out = model(prompts, responses) if isinstance(model, torch.nn.Module) else model.forward(prompts, responses)
        return _per_sample(out, responses.shape[0], "reward.model forward")

    # ------------------------------------------------------------------ non-finite scores

    def _finite(self, values: list[float] | torch.Tensor, origin: str, replaced: list) -> torch.Tensor:
        low, high = self.clamp if self.clamp is not None else (0.0, 0.0)
        raw = torch.as_tensor(values, dtype=torch.float64)
        out = torch.nan_to_num(raw, nan=low, posinf=high, neginf=low)  # NaN is no evidence of a good answer: low
        rows = torch.nonzero(~torch.isfinite(raw)).flatten().tolist()
        replaced.extend((row, raw[row].item(), out[row].item(), origin) for row in rows)
        return out

    def _warn_nonfinite(self, replaced: list, batch: DataProto, sources: list[str], indices: list) -> None:
        for row, value, substitute, origin in replaced[:_MAX_WARNINGS]:
            if self.tokenizer is None:
                response = "<no tokenizer>"
            else:
                ids = batch.batch["responses"][row][batch.batch["response_mask"][row].bool()]
                response = self.tokenizer.decode(ids.tolist(), skip_special_tokens=True)
            logger.warning(
                "non-finite reward %s from %s on batch row %d (data_source=%r, index=%r) replaced by %s; response: %r",
                value,
                origin,
                row,
                sources[row],
                indices[row],
                substitute,
                _shorten(response),
            )
        if len(replaced) > _MAX_WARNINGS:
            logger.warning("%d more non-finite rewards in this batch were replaced", len(replaced) - _MAX_WARNINGS)


def make_reward_manager(
    reward_cfg: RewardConfig,
    tokenizer: Any,
    reward_fn: Any = None,
    server: Any = None,
    model: Any = None,
    **kwargs: Any,
) -> RewardManager:
    """A RewardManager from the `reward` config section; `reward_fn` (name, mapping or callable) overrides `reward.fn`
    (a callable with parameters input_ids and attention_mask scores whole token rows, returning a Tensor[B]);
    `model` stands in for building reward.model here (the reward model on workers: a PooledRewardModel).

    Extra kwargs (e.g. num_workers) go to RewardManager.
    """
    # a reward_fn (texts, or whole token rows: fn(input_ids, attention_mask) -> Tensor[B]) stands in for reward.fn
    sequence_fn = reward_fn if reward_fn is not None and is_sequence_reward(reward_fn) else None
    if sequence_fn is not None:
        fn_spec = None
    else:
        fn_spec = reward_fn if reward_fn is not None else config_value(reward_cfg, "fn")
    fn = get_reward_fn(fn_spec) if fn_spec is not None else None
    model_spec = config_value(reward_cfg, "model")
    if model is None and model_spec is not None:
        model = instantiate(model_spec, key="reward.model")
    if model is not None and not _scores_something(model):
        raise _error(
            "reward.model",
            f"built a {type(model).__name__}, which has no forward()",
            "point _target_ at a class with forward(prompt_ids, response_ids) -> Tensor[B], or score_texts",
        )
    if fn is None and model is None and sequence_fn is None and server is None:
        raise _error(
            "reward.fn", "no reward is configured", "set reward.fn (e.g. gsm8k, math_boxed, arithmetic) or reward.model"
        )
    try:
        clamp = _check_clamp(config_value(reward_cfg, "clamp"))
    except ValueError as e:
        raise _error("reward.clamp", str(e), "write it as [low, high] with low <= high") from None
    errors = {
        "on_error": config_value(reward_cfg, "on_error", "raise"),
        "error_score": config_value(reward_cfg, "error_score", 0.0),
    }
    return RewardManager(
        fn,
        tokenizer=tokenizer,
        clamp=clamp,
        reward_model=model,
        sequence_fn=sequence_fn,
        server=server,
        weights=config_value(reward_cfg, "weights"),
        **errors,
        **kwargs,
    )


# ---------------------------------------------------------------------- helpers


def _scores_something(model: Any) -> bool:
    """A reward model scores the policy's token ids (forward) or texts it renders itself (score_texts)."""
    return callable(getattr(model, "forward", None)) or callable(getattr(model, "score_texts", None))


def _model_metrics(model: Any) -> dict[str, float]:
    """The reward model's `last_metrics` of its last call (numbers only) as reward/model/<key>."""
    reported = getattr(model, "last_metrics", None)
    if not isinstance(reported, Mapping):
        return {}
    return {f"reward/model/{k}": _number(v) for k, v in reported.items() if _is_number(v)}


def _per_sample(out: Any, n: int, origin: str) -> torch.Tensor:
    """A scorer's output as n float64 scores on CPU: a Tensor of shape [n] (or [n, 1]), else a clear error."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{origin} returned {type(out).__name__}; it must return a Tensor of shape [B]")
    if out.dim() == 2 and out.shape[1] == 1:
        out = out[:, 0]
    if tuple(out.shape) != (n,):
        raise ValueError(f"{origin} returned shape {tuple(out.shape)}; expected [{n}] (one score per sample)")
    return out.detach().double().cpu()


def _parse_result(result: Any) -> _FnResult:
    if isinstance(result, Mapping):
        if "score" not in result:
            raise TypeError(f"a dict result needs a 'score' entry, got keys {sorted(result)}")
        extras = {str(k): _number(v) for k, v in result.items() if k not in ("score", "acc") and _is_number(v)}
        acc = _number(result["acc"]) if "acc" in result else None
        pred = None if result.get("pred") is None else str(result["pred"])
        return _FnResult(_number(result["score"], "score"), acc, extras, pred)
    return _FnResult(_number(result, "score"), None, {})


def _is_number(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and not value.is_complex()
    return isinstance(value, (Real, np.bool_))  # numpy registers its ints and floats as Real


def _number(value: Any, what: str = "value") -> float:
    if not _is_number(value):
        raise TypeError(f"the {what} must be a real number (float, int, bool), got {type(value).__name__} {value!r}")
    return float(value.item() if isinstance(value, torch.Tensor) else value)


def _score_metrics(seq_scores: torch.Tensor, sources: list[str], fn_results: list[_FnResult] | None) -> dict:
    if len(seq_scores) == 0:
        return {}
    metrics = {
        "reward/score/mean": seq_scores.mean().item(),
        "reward/score/max": seq_scores.max().item(),
        "reward/score/min": seq_scores.min().item(),
    }
    correct = None
    if fn_results is not None:
        correct = [r.correct for r in fn_results]
        metrics["reward/accuracy"] = _mean(correct)
        extras = defaultdict(list)
        for r in fn_results:
            for k, v in r.extras.items():
                if math.isfinite(v):
                    extras[k].append(v)
        metrics.update({f"reward/extra/{k}": _mean(v) for k, v in extras.items()})
    for source in dict.fromkeys(sources):  # each once, in order of first appearance
        rows = [row for row, s in enumerate(sources) if s == source]
        # A data source called "score" must not overwrite reward/score/mean.
        prefix = f"reward/data_source/{source}" if source in _OWN_KEYS else f"reward/{source}"
        metrics[f"{prefix}/mean"] = _mean([seq_scores[r].item() for r in rows])
        if correct is not None:
            metrics[f"{prefix}/accuracy"] = _mean([correct[r] for r in rows])
    return metrics


def _shorten(text: str, limit: int = _SHOWN_CHARS) -> str:
    """`text` when short, else its head and tail around a count of what was cut (the answer is at the end)."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]} ...[{len(text) - 2 * half} chars]... {text[-half:]}"


def _prompts(batch: DataProto, tokenizer: Any, n: int) -> list[str]:
    """raw_prompt strings when the batch has them, else the decoded `prompts` tensor, else ""."""
    raw = batch.non_tensor_batch.get("raw_prompt")
    decoded = None
    if (raw is None or not all(isinstance(p, str) for p in raw)) and "prompts" in batch.tensor_keys:
        decoded = tokenizer.batch_decode(batch.batch["prompts"].tolist(), skip_special_tokens=True)
    if raw is None:
        return decoded if decoded is not None else [""] * n
    return [p if isinstance(p, str) else (decoded[i] if decoded is not None else str(p)) for i, p in enumerate(raw)]


def _tensor(batch: DataProto, key: str) -> torch.Tensor:
    if key not in batch.tensor_keys:
        raise KeyError(f"the batch has no tensor {key!r}; tensor keys are {batch.tensor_keys}")
    return batch.batch[key]


def _dataset_indices(batch: DataProto, n: int) -> list:
    """Each row's index in its dataset: the `index` column, else extra_info["index"], else the row number."""
    if "index" in batch.non_tensor_batch:
        return [_plain(i) for i in batch.non_tensor_batch["index"]]
    extra_infos = batch.non_tensor_batch.get("extra_info", [None] * n)
    return [_plain(e.get("index", i)) if isinstance(e, Mapping) else i for i, e in enumerate(extra_infos)]


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _mean(values: list[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def _check_clamp(clamp: Any) -> tuple[float, float] | None:
    if clamp is None:
        return None
    try:
        low, high = (float(v) for v in clamp)
    except (TypeError, ValueError):
        raise ValueError(f"clamp must be [low, high], got {clamp!r}") from None
    if not (math.isfinite(low) and math.isfinite(high) and low <= high):
        raise ValueError(f"clamp must be finite [low, high] with low <= high, got [{low}, {high}]")
    return low, high
