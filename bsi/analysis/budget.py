"""A budget curve's statistics: does the methods' order survive as every model gets more training?

A comparison at one small recovery budget says little when training moves
accuracy more than the choice of bases does. ``bsi sweep --budgets 16,32,64,128``
gives every model the same *total* optimizer steps after the task fine-tune:
an engine method's own tuning steps on its way to the size plus a recovery
of the rest; a truncation (which trains nothing on its way) recovers for the
whole budget; and the fine-tuned dense model is trained for each budget too
(``dense-trained``: what the same training buys with no compression). Each
row of ``results.jsonl`` carries its ``budget``.

:func:`budget_stats` computes, per budget, the same pooled values and paired
differences from ``bsi`` as a study (:func:`bsi.analysis.study.study_stats`
on the rows of that budget); :func:`budget_markdown` renders one table per
size with a row per budget; :func:`budget_figure` draws accuracy and loss
against the budget.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from bsi.analysis.stats import value_interval
from bsi.analysis.study import ANCHOR, RUNS_NOTE, OutcomeLoader, _cell, _method_table, difference_text, is_text_study
from bsi.results import DENSE_TRAINED, REFERENCE, StudyRow


def budget_stats(rows: Sequence[StudyRow], load: OutcomeLoader, *, anchor: str = ANCHOR,
                 resamples: int = 4000) -> dict[str, Any]:
    """Per budget: every method's pooled values per size and the paired difference from ``anchor``; plain JSON.

    Returns ``{"anchor", "task", "budgets": [16, ...], "targets": [0.6, ...],
    "dense": the untrained reference, "curves": {"16": {method: {"0.6": entry}}}}``,
    an entry as in a study's table (``accuracy``, ``loss``, ``path_steps``,
    ``training_steps``, ``vs_anchor``...). ``dense-trained`` sits at target ``"1"``.
    """
    cache: dict[str, Any] = {}

    def outcomes(row: StudyRow):
        if row.outcomes not in cache:
            cache[row.outcomes] = load(row)
        return cache[row.outcomes]

    text = is_text_study(rows)
    curve = [r for r in rows if r.budget is not None and r.outcomes]
    budgets = sorted({int(r.budget) for r in curve if r.budget is not None})
    targets = sorted({r.target for r in curve if r.method != DENSE_TRAINED}, reverse=True)
    out: dict[str, Any] = {"anchor": anchor, "task": "text" if text else "qa", "budgets": budgets,
                           "targets": targets, "curves": {}}
    dense = sorted((r for r in rows if r.is_reference and r.outcomes), key=lambda r: r.seed)
    if dense:
        runs = [outcomes(r) for r in dense]
        out["dense"] = {"seeds": [r.seed for r in dense], "params_total": dense[0].params_total,
                        **{stat: value_interval(runs, stat, resamples=resamples).to_dict()
                           for stat in ("accuracy", "loss")}}
    for budget in budgets:
        mine = [r for r in curve if r.budget == budget]
        out["curves"][str(budget)] = _method_table(mine, [*targets, 1.0], outcomes, anchor, text, resamples)
    return out


def budget_markdown(stats: Mapping[str, Any], note: str = "") -> str:
    """``results.md`` of a budget curve: per size, a row per budget with each method's values and differences."""
    anchor, text = stats.get("anchor", ANCHOR), stats.get("task") == "text"
    curves, budgets = stats["curves"], stats["budgets"]
    methods = list(dict.fromkeys(m for b in budgets for m in curves[str(b)] if m != DENSE_TRAINED))
    others = [m for m in methods if m != anchor]
    lines = ["Every model has the same total training after the task fine-tune (the budget, in optimizer steps): "
             "an engine method's own tuning on its way to the size plus a recovery of the rest, a truncation a "
             "recovery of all of it, and `dense-trained` is the fine-tuned dense model trained for the whole "
             "budget with the same recovery settings, uncompressed.", ""]
    if note:
        lines += [note, ""]
    dense = stats.get("dense")
    if dense and not text:
        lines += [f"Dense fine-tuned model, no further training (seeds {', '.join(map(str, dense['seeds']))}): "
                  f"accuracy {100 * dense['accuracy']['estimate']:.1f}%, answer-token loss "
                  f"{dense['loss']['estimate']:.4f}.", ""]
    what = "perplexity / loss" if text else "accuracy % / answer-token loss"
    for target in stats["targets"]:
        key = f"{target:g}"
        ratio = next((curves[str(b)][m][key]["compression_ratio"] for b in budgets for m in methods
                      if key in curves[str(b)].get(m, {})), math.nan)
        lines += [f"### {key} of the linear layers kept ({ratio:.2f}x)", "",
                  f"Cells: {what} with 95% bootstrap intervals, then (own steps + recovery steps). Differences: "
                  f"`{anchor}` minus the method, accuracy points / loss, paired bootstrap 95% interval; **bold**: "
                  f"it excludes 0. {RUNS_NOTE}", "",
                  "| budget | `dense-trained` | " + " | ".join(f"`{m}`" for m in methods) + " | "
                  + " | ".join(f"`{anchor}` minus `{m}`" for m in others) + " |",
                  "|---|---|" + "---|" * (len(methods) + len(others))]
        for budget in budgets:
            table = curves[str(budget)]
            trained = _cell((table.get(DENSE_TRAINED) or {}).get("1"), text)
            cells = []
            for method in methods:
                entry = (table.get(method) or {}).get(key)
                steps = f" ({entry['path_steps']:g} + {entry['recover_steps']})" if entry and "path_steps" in entry else ""
                cells.append(_cell(entry, text) + steps)
            diffs = [difference_text(((table.get(m) or {}).get(key) or {}).get("vs_anchor"), text) for m in others]
            lines.append(f"| {budget} | {trained} | " + " | ".join(cells) + " | " + " | ".join(diffs) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def budget_figure(stats: Mapping[str, Any]):
    """Accuracy (top) and loss (bottom) against the budget (log2 axis), a column per size, a line per method.

    The dense model trained for the same budget is the dashed line of every
    panel; the untrained dense model a dotted one. Bars: 95% bootstrap intervals.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from bsi.analysis.figures import METHOD_COLORS

    text = stats.get("task") == "text"
    targets, budgets, curves = stats["targets"], stats["budgets"], stats["curves"]
    first = "perplexity" if text else "accuracy"
    scale = 1.0 if text else 100.0
    fig = make_subplots(rows=2, cols=max(len(targets), 1), shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=[f"{t:g} of the linear layers kept" for t in targets])
    methods = list(dict.fromkeys(m for b in budgets for m in curves[str(b)]))
    colors = {m: METHOD_COLORS[i % len(METHOD_COLORS)] for i, m in enumerate(x for x in methods if x != DENSE_TRAINED)}
    for col, target in enumerate(targets, start=1):
        for method in methods:
            key = "1" if method == DENSE_TRAINED else f"{target:g}"
            points = [(b, curves[str(b)][method][key]) for b in budgets if key in curves[str(b)].get(method, {})]
            if not points:
                continue
            for row, stat in ((1, first), (2, "loss")):
                values = [e[stat] for _, e in points]
                factor = scale if stat != "loss" else 1.0  # accuracy in %, the loss as it is
                fig.add_trace(go.Scatter(
                    x=[b for b, _ in points], y=[factor * v["estimate"] for v in values], mode="lines+markers", name=method, legendgroup=method,
                    showlegend=col == 1 and row == 1,
                    line={"color": colors.get(method, "#555555"),
                          "dash": "dash" if method == DENSE_TRAINED else "solid"},
                    error_y={"type": "data", "symmetric": False,
                             "array": [factor * (v["high"] - v["estimate"]) for v in values],
                             "arrayminus": [factor * (v["estimate"] - v["low"]) for v in values]},
                    customdata=[[e.get("path_steps", 0), e.get("recover_steps", 0)] for _, e in points],
                    hovertemplate=f"{method}<br>budget %{{x}} steps (own %{{customdata[0]}} + recovery "
                                  f"%{{customdata[1]}})<br>{stat} %{{y:.3f}}<extra></extra>"), row=row, col=col)
        dense = stats.get("dense")
        if dense and not text:
            for row, stat in ((1, "accuracy"), (2, "loss")):
                fig.add_hline(y=(scale if stat == "accuracy" else 1.0) * dense[stat]["estimate"], line={"dash": "dot", "color": "#999999"}, row=row, col=col)
        fig.update_xaxes(type="log", dtick=math.log10(2), title_text="total training after the fine-tune (steps)",
                         row=2, col=col)
        fig.update_yaxes(type="log", row=2, col=col)
    fig.update_yaxes(title_text="perplexity" if text else "accuracy (%)", row=1, col=1)
    fig.update_yaxes(title_text="loss (log axis)", row=2, col=1)
    fig.update_layout(height=640, template="plotly_white", legend={"orientation": "h", "y": -0.12},
                      title=f"The same total training for every model; dotted: the dense model ({REFERENCE}) "
                            "before any more training")
    return fig
