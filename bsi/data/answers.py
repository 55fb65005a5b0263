"""Reading the final number out of a solution, and comparing answers."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_NUMBER = re.compile(r"(?:(?<![\w)])-)?\$?\d[\d,]*(?:\.\d+)?")  # "-" only as a sign, not "20-14"


def _normalise(number: str) -> str:
    """``"$1,200.00"`` -> ``"1200"``; ``"3.50"`` -> ``"3.5"``; ``"-$4"`` -> ``"-4"``."""
    text = number.replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    if text in ("-0", ""):
        text = "0"
    return text


def extract_answer(text: str) -> str | None:
    """The final numeric answer in a solution, normalised; ``None`` if there is none.

    The number right after the last ``####`` wins; without ``####``, the last
    number in the text. Commas, ``$`` and a trailing period go, and so do
    zero decimals: ``"#### $1,200.00"`` gives ``"1200"``.
    """
    if "####" in text:
        found = _NUMBER.search(text.rsplit("####", 1)[1])
        if found:
            return _normalise(found.group())
    numbers = _NUMBER.findall(text)
    return _normalise(numbers[-1]) if numbers else None


def answers_match(pred: str | None, gold: str) -> bool:
    """Whether a predicted answer equals the gold one (numerically when both are numbers).

    Both sides go through the same normalisation as :func:`extract_answer`,
    so ``"19.0"`` matches ``"19"`` and ``"1,200"`` matches ``"1200"``.
    """
    if pred is None:
        return False
    a, b = _normalise(pred.strip()), _normalise(gold.strip())
    try:
        return Decimal(a) == Decimal(b)
    except InvalidOperation:
        return a == b
