"""Quantities written for people: how long something took, in the units a reader would say it."""

from __future__ import annotations


def duration(seconds: float) -> str:
    """``45 s``, ``4 min 10 s``, ``2 h 5 min``."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"
