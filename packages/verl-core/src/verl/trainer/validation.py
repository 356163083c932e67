"""Held-out metrics as papers report them: one response per held-out prompt (greedy by default), and optionally k
samples per prompt for pass@k (the unbiased estimator), mean@k and majority@k; overall and per data source.

A sample is right by the reward function's "acc" when it returns one, else when its score is full credit
(>= 1.0; without a function: > 0): a format bonus does not make a wrong answer right (`RewardManager.last_correct`).
"""

from __future__ import annotations

from collections import Counter
from math import comb
from typing import Any, Dict, List, Optional, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of k samples drawn without replacement from n (c of them right) is right:
    1 - C(n-c, k) / C(n, k) (Chen et al. 2021, the unbiased estimator of pass@k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - comb(n - c, k) / comb(n, k)


def majority_right(answers: Sequence[Optional[str]], correct: Sequence[float]) -> float:
    """Whether the most common answer among a prompt's samples is right (ties: the answer seen first)."""
    votes = Counter(answers)  # (most_common keeps first-seen order among equal counts)
    top = votes.most_common(1)[0][0]
    return float(correct[list(answers).index(top)] >= 0.5)


def ks_for(n: int) -> List[int]:
    """The k of pass@k reported for n samples: 1, 2, 4, ... below n, and n."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]


def _scored(rollout: Any, reward: Any, loader: Any, n: int, temperature: float) -> Dict[str, list]:
    """Every held-out prompt's n samples (adjacent rows), with their source, score, correctness and answer."""
    out: Dict[str, list] = {"source": [], "score": [], "correct": [], "answer": []}
    for prompts in loader:
        batch = rollout.generate(prompts, n=n, temperature=temperature)
        seq_scores, _ = reward(batch)
        rows = len(batch)
        out["source"] += [str(s) for s in batch.non_tensor_batch.get("data_source", ["unknown"] * rows)]
        out["score"] += seq_scores.sum(-1).double().tolist()
        out["correct"] += list(reward.last_correct)
        out["answer"] += list(reward.last_answers)
    return out


def _groups(values: Dict[str, list], n: int, source: Optional[str]) -> List[range]:
    """The row ranges of each prompt's n samples (of one data source, or all)."""
    starts = range(0, len(values["score"]), n)
    return [range(s, s + n) for s in starts if source is None or values["source"][s] == source]


def _prefixes(sources: Sequence[str]) -> Dict[Optional[str], str]:
    """Metric prefixes: val for every prompt, val/<data_source> for each source's (val/data_source/<name> for a
    source named like an overall metric, which it must not overwrite)."""
    own = {"accuracy", "score", "n"}
    return {None: "val", **{s: f"val/data_source/{s}" if s in own else f"val/{s}" for s in dict.fromkeys(sources)}}


def greedy_metrics(values: Dict[str, list]) -> Dict[str, float]:
    """val/accuracy, val/score/mean and val/n, overall and per data source (one sample per prompt)."""
    metrics: Dict[str, float] = {}
    for source, prefix in _prefixes(values["source"]).items():
        rows = [r for r, s in enumerate(values["source"]) if source is None or s == source]
        metrics[f"{prefix}/accuracy"] = sum(values["correct"][r] for r in rows) / len(rows)
        metrics[f"{prefix}/score/mean"] = sum(values["score"][r] for r in rows) / len(rows)
        metrics[f"{prefix}/n"] = float(len(rows))
    return metrics


def sampled_metrics(values: Dict[str, list], n: int) -> Dict[str, float]:
    """val/pass@k for k in ks_for(n), val/mean@n and val/maj@n (when answers are known), overall and per source."""
    metrics: Dict[str, float] = {}
    for source, prefix in _prefixes(values["source"]).items():
        groups = _groups(values, n, source)
        rights = [[values["correct"][r] for r in g] for g in groups]
        hits = [sum(1 for v in right if v >= 0.5) for right in rights]
        for k in ks_for(n):
            metrics[f"{prefix}/pass@{k}"] = sum(pass_at_k(n, c, k) for c in hits) / len(groups)
        metrics[f"{prefix}/mean@{n}"] = sum(sum(right) / n for right in rights) / len(groups)
        answers = [[values["answer"][r] for r in g] for g in groups]
        if all(a is not None for group in answers for a in group):
            metrics[f"{prefix}/maj@{n}"] = sum(majority_right(a, r) for a, r in zip(answers, rights)) / len(groups)
    return metrics


def held_out_metrics(
    rollout: Any, reward: Any, loader: Optional[Any], temperature: float, n: int = 0, sample_temperature: float = 1.0
) -> Dict[str, float]:
    """The held-out metrics over `loader`'s prompts through `rollout` (a RolloutSource): one sample each at
    `temperature` (rollout.val_temperature; 0: greedy), and with n > 0 (rollout.val_n) n more at
    `sample_temperature` for pass@k / mean@n / maj@n; {} without a loader."""
    if loader is None:
        return {}
    metrics = greedy_metrics(_scored(rollout, reward, loader, 1, temperature))
    if n > 0:
        metrics.update(sampled_metrics(_scored(rollout, reward, loader, n, sample_temperature), n))
    return metrics
