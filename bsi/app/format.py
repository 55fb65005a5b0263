"""How the dashboard writes numbers and messages.

* Numbers carry about four significant figures (:func:`significant`,
  :func:`number_text`): enough to compare, short enough that a table's
  columns fit on screen. Tables keep them as numbers (so sorting works);
  text gets them as strings.
* Messages speak the app's language (:func:`in_app_words`): the library's
  errors name command-line flags (``--out``) and configuration fields
  (``target_ratio``); the dashboard shows the labels of its own inputs
  instead.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

DIGITS = 4


def significant(value: float | None, digits: int = DIGITS) -> float | None:
    """``value`` rounded to ``digits`` significant figures (None, 0, inf and NaN pass through).

    >>> significant(0.000123456), significant(-98765.4321), significant(3)
    (0.0001235, -98770.0, 3.0)
    """
    if value is None:
        return None
    value = float(value)
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))


def number_text(value: float | None, digits: int = DIGITS) -> str:
    """``value`` as text with ``digits`` significant figures; blank for None, thousands separators for
    large whole numbers (``1,234,567``), plain ``g`` notation otherwise (``0.01234``, ``1.235e-07``)."""
    if value is None:
        return ""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    value = float(value)
    if math.isfinite(value) and value.is_integer() and abs(value) >= 10 ** digits:
        return f"{int(value):,}"
    return f"{value:.{digits}g}"


#: Command-line flags the library's messages may name, and what the app calls the same thing.
FLAG_LABELS = {
    "--out": "'Save to folder'",
    "--resume": "Resume",
    "--force": "a new 'Save to folder'",
    "--max-length": "the maximum length",
}


def in_app_words(message: str, labels: Mapping[str, str] | None = None) -> str:
    """A library message rewritten with the app's names.

    Args:
        message: a :class:`~bsi.errors.BSIError` message.
        labels: configuration field name -> the label of the app's input
            for it (``{"target_ratio": "Target ratio"}``); a message that
            starts with a field name (``"rounds must be ..."``) or quotes one
            gets the label instead.

    Flags (``--out``) become the app's inputs (:data:`FLAG_LABELS`); other
    flags lose their dashes.
    """
    for flag, label in FLAG_LABELS.items():
        message = re.sub(rf"(?<![\w-]){re.escape(flag)}(?![\w-])( folder)?", label, message)
    message = re.sub(r"(?<![\w-])--([a-z][\w-]*)", lambda m: m.group(1).replace("-", " "), message)
    for name, label in (labels or {}).items():
        if not message.startswith(label):  # (rewriting twice changes nothing)
            message = re.sub(rf"^{re.escape(name)}\b", label, message)
        message = re.sub(rf"\b{re.escape(name)}=", f"{label} = ", message)
    return message
