"""The dashboard's logic: one module per tab, the compression job, formatting, per-session state.

Everything here is importable and testable without a server: each tab module
(:mod:`~bsi.app.compress`, :mod:`~bsi.app.inspect`, :mod:`~bsi.app.spectra`,
:mod:`~bsi.app.chat`, :mod:`~bsi.app.answers`, :mod:`~bsi.app.compare`,
:mod:`~bsi.app.guide`) holds plain handler functions
(inputs in, values or generators of values out) and a ``render(...)``
function that lays the tab's components out and wires them to those
handlers; the Compress tab's form and its checks are :mod:`bsi.app.form`,
:mod:`bsi.app.job` is the streaming compression job, :mod:`bsi.app.saved` a
finished run read back for the first visit, and :mod:`bsi.app.format` how
numbers and messages are written. The figures are
:mod:`bsi.analysis.figures` and the maths is the library's: the tabs only
call them. ``app.py`` at the repository root composes the tabs with
:func:`bsi.app.build_app` and launches only under ``__main__``.

Gradio is imported lazily (inside ``render`` and ``build_app``), so the
handlers work with only the core dependencies.
"""

from __future__ import annotations

from typing import Any


def build_app(**kwargs: Any):
    """The Gradio Blocks app (see :func:`bsi.app.layout.build_app` for the arguments)."""
    from bsi.app.layout import build_app as _build

    return _build(**kwargs)


__all__ = ["build_app"]
