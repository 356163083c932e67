r"""Answer extraction and normalisation: gsm8k "####" numbers and \boxed{...} answers."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from verl.reward.answers import (
    gsm8k_answer,
    last_boxed,
    last_number,
    math_answers_equal,
    normalize_math_answer,
    parse_number,
)

# --------------------------------------------------------------------------- numbers


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", Fraction(42)),
        ("-3", Fraction(-3)),
        ("1,000", Fraction(1000)),
        ("1,234,567.5", Fraction(2469135, 2)),  # 1234567.5 = 2469135 / 2
        (".5", Fraction(1, 2)),
        ("2.50", Fraction(5, 2)),
        (" 7 ", Fraction(7)),
        ("3/4", Fraction(3, 4)),
        ("", None),
        ("abc", None),
        ("1/0", None),
        ("nan", None),
        ("inf", None),
    ],
)
def test_parse_number(text, value):
    assert parse_number(text) == value


@given(st.integers(-(10**12), 10**12))
def test_parse_number_reads_thousands_separators(n):
    assert parse_number(f"{n:,}") == n


def test_gsm8k_answer_takes_the_last_marker():
    assert gsm8k_answer("#### 3\nno wait\n#### 1,000") == "1,000"
    assert gsm8k_answer("#### -12.5 apples") == "-12.5"
    assert gsm8k_answer("####$18") == "18"  # a currency sign between marker and number
    assert gsm8k_answer("the total is 72.") is None  # no marker
    assert gsm8k_answer("#### none") is None


def test_gsm8k_answer_drops_a_sentence_full_stop():
    assert gsm8k_answer("#### 72.") == "72"


def test_last_number():
    assert last_number("3 cats and 4 dogs make 7.") == "7"
    assert last_number("costs -1,250 dollars") == "-1,250"
    assert last_number("no digits here") is None


# --------------------------------------------------------------------------- \boxed


@pytest.mark.parametrize(
    ("text", "content"),
    [
        (r"so the answer is \boxed{42}.", "42"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{\sqrt{2}}{2}"),  # nested braces two deep
        (r"first \boxed{1}, then \boxed{2}", "2"),  # the last box wins
        (r"\boxed{a} and \boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"\fbox{3}", "3"),
        (r"$\boxed 5$", "5"),  # a box without braces takes one token
        (r"the \boxed command: \boxed{7}", "7"),  # the word in prose is not a box
        (r"\boxed{-3}", "-3"),
        (r"\boxed{}", ""),
        ("no box at all", None),
        (r"\boxed{1} then \boxed{2", None),  # cut off in a new answer: not the old one
        (r"\boxed.", None),
    ],
)
def test_last_boxed(text, content):
    assert last_boxed(text) == content


# Balanced brace content without backslashes: what \boxed{...} may hold.
balanced = st.recursive(
    st.text(alphabet="0123456789abc+-*/ ", max_size=5),
    lambda inner: st.builds(lambda a, b, c: a + "{" + b + "}" + c, inner, inner, inner),
    max_leaves=8,
)


@given(balanced, st.text(alphabet="xyz .,", max_size=10), st.text(alphabet="xyz .,", max_size=10))
def test_last_boxed_returns_balanced_content(content, before, after):
    assert last_boxed(f"{before}\\boxed{{{content}}}{after}") == content


# --------------------------------------------------------------------------- normalisation


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        (" 42 ", "42"),
        (r"\left( 1, 2 \right)", "(1,2)"),
        (r"\dfrac{1}{2}", r"\frac{1}{2}"),
        (r"\tfrac{3}{4}", r"\frac{3}{4}"),
        (r"\frac12", r"\frac{1}{2}"),
        (r"\frac1{10}", r"\frac{1}{10}"),
        (r"\sqrt2", r"\sqrt{2}"),
        ("5.", "5"),
        (r"\text{5 cm}", "5cm"),
        (r"\textbf{\text{yes}}", "yes"),  # nested unwrapping
        (r"\mathrm{B}", "B"),
        ("90^\\circ", "90"),
        ("90^{\\circ}", "90"),
        (r"50\%", "50"),
        (r"\$3.50", "3.50"),
        ("$x$", "x"),
        ("1,000", "1000"),
        ("1,000,000.25", "1000000.25"),
        ("1,2", "1,2"),  # a pair, not a thousands separator
        ("x = 3", "3"),
        ("a_{n}=7", "7"),
        ("x=1,y=2", "x=1,y=2"),  # two equations: not a single-variable answer
        (r"3\,000", "3000"),
        ("-3", "-3"),
    ],
)
def test_normalize_math_answer(text, normalized):
    assert normalize_math_answer(text) == normalized


@pytest.mark.parametrize(
    ("answer", "reference"),
    [
        ("0.5", r"\frac{1}{2}"),
        ("1/2", r"\frac{1}{2}"),
        (r"\dfrac{1}{2}", "0.5"),
        (r"-\frac{3}{4}", "-0.75"),
        (r"\frac{-3}{4}", "-.75"),
        ("1,000", "1000"),
        ("1000.0", "1000"),
        ("2", "2.00"),
        (r"\left(1, 2\right)", "(1,2)"),
        (r"\text{(A)}", "(A)"),
        (r"x = \frac{1}{2}", "1/2"),
        (r"\frac{\sqrt{3}}{2}", r"\dfrac{\sqrt3}{2}"),  # symbolic, equal as normalised strings
    ],
)
def test_equal_answers(answer, reference):
    assert math_answers_equal(answer, reference)
    assert math_answers_equal(reference, answer)


@pytest.mark.parametrize(
    ("answer", "reference"),
    [
        ("0.33", r"\frac{1}{3}"),  # exact comparison: 0.33 != 1/3
        ("1,2", "12"),
        ("-1", "1"),
        (r"\frac{1}{0}", "0"),  # no value, and different strings
        ("", ""),  # an empty box answers nothing
        ("2", "3"),
        (r"\sqrt{2}", "1.414"),
    ],
)
def test_unequal_answers(answer, reference):
    assert not math_answers_equal(answer, reference)


@given(st.integers(-1000, 1000), st.integers(1, 1000))
@example(1, 512)  # 0.001953125
def test_fraction_forms_agree(p, q):
    # \frac{p}{q}, p/q and (when q has only the factors 2 and 5) the exact decimal are one value.
    assert math_answers_equal(f"\\frac{{{p}}}{{{q}}}", f"{p}/{q}")
    value = Fraction(p, q)
    d = value.denominator
    while d % 2 == 0:
        d //= 2
    while d % 5 == 0:
        d //= 5
    if d == 1:  # a terminating decimal, written out exactly (q <= 1000 needs at most 10 digits)
        decimal = format(Decimal(p) / Decimal(q), "f")
        assert math_answers_equal(decimal, f"\\dfrac{{{p}}}{{{q}}}")


@given(st.text(alphabet="0123456789{}\\fracdtexsqrt ,.=$%-xy", max_size=30))
def test_normalization_is_idempotent(text):
    once = normalize_math_answer(text)
    assert normalize_math_answer(once) == once
