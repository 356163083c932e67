"""Pulling a final answer out of model text: gsm8k "#### 42" answers and LaTeX \\boxed{...} answers.

Pure string functions with no scoring policy, so each can be tested on its own; the reward functions in
`verl.reward.functions` decide what a match is worth.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["gsm8k_answer", "last_boxed", "last_number", "math_answers_equal", "normalize_math_answer", "parse_number"]

# A number as people write it: optional sign, digits with optional thousands commas, optional decimals.
# "1,000", "-3", "2.50", ".5"; the trailing "." of a sentence ("is 42.") is not part of the number.
_NUMBER = r"[-+]?(?:\d[\d,]*(?:\.\d+)?|\.\d+)"
_NUMBER_RE = re.compile(_NUMBER)
_GSM8K_RE = re.compile(r"####\s*\$?\s*(" + _NUMBER + r")")
_THOUSANDS_RE = re.compile(r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?=[\s{])")  # a box command, not the word "\boxed" in prose


def parse_number(text: str) -> Fraction | None:
    """The exact value of a plain number ("1,000", "-2.5", "3/4"), or None when `text` is not one."""
    text = text.strip().replace(",", "")
    if not text:
        return None
    try:
        # Fraction parses "3", "-2.5", "1e3" and "3/4" exactly, so 0.1 + 0.2 style float error cannot arise.
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def gsm8k_answer(text: str) -> str | None:
    """The number after the last "####" in `text` (commas kept), or None when there is none."""
    matches = _GSM8K_RE.findall(text)
    return matches[-1] if matches else None


def last_number(text: str) -> str | None:
    """The last number written anywhere in `text`, or None."""
    matches = _NUMBER_RE.findall(text)
    return matches[-1] if matches else None


def last_boxed(text: str) -> str | None:
    r"""The content of the last \boxed{...} (or \fbox{...}) in `text`, braces balanced; None when absent.

    `\boxed 5` (a box without braces) gives "5". An unclosed last box gives None rather than an earlier
    box: a response cut off while writing a new answer has not given the old one.
    """
    boxes = list(_BOX_RE.finditer(text))
    if not boxes:
        return None
    rest = text[boxes[-1].end() :]
    if rest.startswith("{"):
        return _braced(rest, 0)
    match = re.match(r"\s+([^\s$]+)", rest)  # "\boxed 5$": the argument runs to the next space or "$"
    return match.group(1) if match else None


def _braced(text: str, open_at: int) -> str | None:
    """The text inside the brace group opening at text[open_at] == "{", or None if it never closes."""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i]
    return None


def _unwrap_command(text: str, command: str) -> str:
    r"""Replace every `\command{arg}` by `arg` (balanced braces; nested commands too)."""
    prefix = "\\" + command + "{"
    while (start := text.find(prefix)) >= 0:
        open_at = start + len(prefix) - 1
        inner = _braced(text, open_at)
        if inner is None:  # unbalanced: leave the rest alone rather than loop forever
            break
        text = text[:start] + inner + text[open_at + len(inner) + 2 :]
    return text


def _fix_fracs(text: str) -> str:
    r"""\frac12 -> \frac{1}{2} and \frac1{22} -> \frac{1}{22}: the shorthand takes one character per argument."""
    return re.sub(
        r"\\frac(?:\s*)(\{[^{}]*\}|[0-9a-zA-Z])(?:\s*)(\{[^{}]*\}|[0-9a-zA-Z])",
        lambda m: "\\frac" + "".join(a if a.startswith("{") else "{" + a + "}" for a in m.groups()),
        text,
    )


# Removed outright. Order matters: "\left(" loses "\left" before spacing commands are stripped.
_DROP = ("\\left", "\\right", "\\displaystyle", "\\!", "\\,", "\\;", "\\:", "\\ ", "\\$", "$", "\\%", "%")
_DEGREES_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?")
_FRAC_RE = re.compile(r"^([-+]?)\\frac\{([^{}]+)\}\{([^{}]+)\}$")
_VARIABLE_LHS_RE = re.compile(r"^[a-zA-Z](?:_\{?\w+\}?)?=")  # "x=", "k=", "x_1=", "a_{n}="
# After normalisation thousands commas are gone, so a comma here separates values: no commas allowed.
_PLAIN_NUMBER_RE = re.compile(r"[-+]?(?:\d+(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?")


def normalize_math_answer(text: str) -> str:
    r"""A canonical string for a final answer, so that equal answers written differently compare equal.

    Drops spaces, \left/\right, spacing commands, "$", "\%", degree marks and a trailing ".";
    unwraps \text{...} (and \textbf, \textrm, \mathrm, \mbox); \dfrac/\tfrac -> \frac, \frac12 ->
    \frac{1}{2}, \sqrt2 -> \sqrt{2}; strips "x=" from a single-variable answer; removes thousands commas
    ("1,000" -> "1000", while "1,2" stays a pair).
    """
    text = text.strip()
    for command in ("text", "textbf", "textrm", "mathrm", "mbox"):
        text = _unwrap_command(text, command)
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = _DEGREES_RE.sub("", text)
    for token in _DROP:
        text = text.replace(token, "")
    text = re.sub(r"\s+", "", text)
    text = text.rstrip(".")
    if text.count("=") == 1:
        text = _VARIABLE_LHS_RE.sub("", text)
    if _THOUSANDS_RE.match(text):
        text = text.replace(",", "")
    text = _fix_fracs(text)
    text = re.sub(r"\\sqrt([0-9a-zA-Z])", r"\\sqrt{\1}", text)
    return text


def _plain_number(text: str) -> Fraction | None:
    return Fraction(text) if _PLAIN_NUMBER_RE.fullmatch(text) else None


def _as_fraction(normalized: str) -> Fraction | None:
    r"""The exact value of a normalised answer that is a number, "a/b" or \frac{a}{b} of numbers."""
    sign = 1
    match = _FRAC_RE.match(normalized)
    if match:
        sign = -1 if match.group(1) == "-" else 1
        numerator, denominator = match.group(2), match.group(3)
    elif normalized.count("/") == 1:
        numerator, denominator = normalized.split("/")
    else:
        return _plain_number(normalized)
    num, den = _plain_number(numerator), _plain_number(denominator)
    if num is None or den is None or den == 0:
        return None
    return sign * num / den


def math_answers_equal(answer: str, reference: str) -> bool:
    """Whether two final answers agree after normalisation: as strings, or as exact numbers (0.5 == 1/2)."""
    a, b = normalize_math_answer(answer), normalize_math_answer(reference)
    if a == b:
        return bool(a)  # two empty answers are not a match
    value_a, value_b = _as_fraction(a), _as_fraction(b)
    return value_a is not None and value_a == value_b
