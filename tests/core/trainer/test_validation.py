"""Held-out metrics: pass@k against counting every draw, majority votes, and the per-source split, on samples
written out by hand (which are right, which answers, which sources)."""

from __future__ import annotations

from itertools import combinations

import pytest

from verl.trainer.validation import greedy_metrics, ks_for, majority_right, pass_at_k, sampled_metrics


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_pass_at_k_is_the_share_of_k_draws_with_a_right_sample(n):
    for c in range(n + 1):
        right = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            draws = list(combinations(range(n), k))
            counted = sum(any(right[i] for i in d) for d in draws) / len(draws)
            assert pass_at_k(n, c, k) == pytest.approx(counted, abs=1e-12), (n, c, k)


def test_pass_at_k_refuses_impossible_counts():
    with pytest.raises(ValueError, match="n=4, c=5"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="k=0"):
        pass_at_k(4, 1, 0)


def test_ks_are_powers_of_two_below_n_and_n():
    assert ks_for(1) == [1] and ks_for(4) == [1, 2, 4] and ks_for(6) == [1, 2, 4, 6] and ks_for(16) == [1, 2, 4, 8, 16]


def test_the_majority_answer_decides_and_a_tie_goes_to_the_answer_seen_first():
    assert majority_right(["12", "13", "12", "14"], [1.0, 0.0, 1.0, 0.0]) == 1.0
    assert majority_right(["13", "12", "13", "12"], [0.0, 1.0, 0.0, 1.0]) == 0.0  # tie: "13" came first
    assert majority_right(["7", "8", "8"], [1.0, 0.0, 0.0]) == 0.0  # one right answer, outvoted


def _values(groups):
    """Rows of (source, correct, answer) per prompt group, with score = correct + a format bonus of 0.1."""
    rows = [r for g in groups for r in g]
    return {
        "source": [r[0] for r in rows],
        "correct": [r[1] for r in rows],
        "answer": [r[2] for r in rows],
        "score": [r[1] + 0.1 for r in rows],
    }


def test_sampled_metrics_overall_and_per_source_by_hand():
    groups = [
        [("gsm8k", 1.0, "5"), ("gsm8k", 0.0, "6"), ("gsm8k", 1.0, "5"), ("gsm8k", 0.0, "4")],  # c=2, maj right
        [("gsm8k", 0.0, "1"), ("gsm8k", 0.0, "1"), ("gsm8k", 0.0, "2"), ("gsm8k", 0.0, "3")],  # c=0
        [("math", 0.0, "x"), ("math", 1.0, "y"), ("math", 0.0, "x"), ("math", 0.0, "z")],  # c=1, maj wrong
    ]
    m = sampled_metrics(_values(groups), 4)
    # pass@1 = c/4; pass@2 = 1 - C(4-c, 2)/6; pass@4 = [c > 0]
    assert m["val/gsm8k/pass@1"] == pytest.approx((0.5 + 0.0) / 2)
    assert m["val/gsm8k/pass@2"] == pytest.approx((1 - 1 / 6 + 0.0) / 2)
    assert m["val/gsm8k/pass@4"] == pytest.approx(0.5)
    assert m["val/math/pass@2"] == pytest.approx(1 - 3 / 6) and m["val/math/pass@4"] == 1.0
    assert m["val/pass@1"] == pytest.approx((0.5 + 0.0 + 0.25) / 3) == pytest.approx(m["val/mean@4"])
    assert m["val/pass@4"] == pytest.approx(2 / 3)
    assert m["val/maj@4"] == pytest.approx(1 / 3) and m["val/gsm8k/maj@4"] == 0.5 and m["val/math/maj@4"] == 0.0


def test_greedy_accuracy_counts_right_answers_not_a_format_bonus():
    values = _values([[("a", 1.0, "1")], [("a", 0.0, "2")], [("b", 0.0, "3")], [("accuracy", 1.0, "4")]])
    m = greedy_metrics(values)
    assert m["val/accuracy"] == 0.5 and m["val/n"] == 4.0  # every score is > 0 (the bonus); two are right
    assert m["val/score/mean"] == pytest.approx(0.6)
    assert m["val/a/accuracy"] == 0.5 and m["val/b/accuracy"] == 0.0 and m["val/b/n"] == 1.0
    assert m["val/data_source/accuracy/accuracy"] == 1.0  # a source named like a metric does not overwrite it


def test_majority_is_left_out_when_answers_are_unknown():
    values = _values([[("a", 1.0, None), ("a", 0.0, None)]])
    m = sampled_metrics(values, 2)
    assert "val/maj@2" not in m and m["val/pass@2"] == 1.0 and m["val/mean@2"] == 0.5
