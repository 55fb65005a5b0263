"""Plotly figure builders: plain data in, ``go.Figure`` out (no Gradio, no model).

Each builder takes the small records the dashboard keeps (step losses, round
reports, per-basis tables, spectra, sweep rows) and returns a figure, so the
notebooks can call them too and tests can check the traces.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from bsi.reports import RoundReport

_LAYOUT = dict(template="plotly_white", margin=dict(l=60, r=20, t=50, b=50), height=320,
               legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0))
STAGE_COLORS = {"finetune": "#7f7f7f", "train": "#1f77b4", "profile": "#ff7f0e", "recover": "#2ca02c"}
STATUS_COLORS = {"protected": "#9ecae1", "pool (kept)": "#3182bd", "pruned": "#e6550d"}


def _empty(title: str, message: str) -> go.Figure:
    fig = go.Figure(layout=dict(title=title, **_LAYOUT))
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def loss_figure(steps: Sequence[tuple[str, int, float]]) -> go.Figure:
    """Training loss against step, one trace per stage.

    Args:
        steps: ``(stage, step, loss)`` with ``step`` counted across the whole
            run (so the stages follow each other on the x axis).
    """
    if not steps:
        return _empty("Loss", "no steps yet: press Start")
    fig = go.Figure(layout=dict(title="Loss (answer-token cross-entropy)", xaxis_title="step",
                                yaxis_title="loss", **_LAYOUT))
    for stage in dict.fromkeys(s for s, _, _ in steps):
        xs = [x for s, x, _ in steps if s == stage]
        ys = [y for s, _, y in steps if s == stage]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers" if len(xs) < 60 else "lines", name=stage,
                                 line=dict(color=STAGE_COLORS.get(stage))))
    return fig


def params_figure(rounds: Sequence[RoundReport], params_before: int | None = None,
                  compressible_before: int | None = None) -> go.Figure:
    """Whole-model and compressible-layer parameters after each round (round 0 = before)."""
    if not rounds:
        return _empty("Parameters", "no round finished yet")
    xs = [0] + [r.round for r in rounds]
    total0 = params_before if params_before is not None else rounds[0].params_total
    comp0 = compressible_before if compressible_before is not None else rounds[0].compressible_before
    fig = go.Figure(layout=dict(title="Parameters vs round", xaxis_title="round", yaxis_title="parameters",
                                **_LAYOUT))
    fig.add_trace(go.Scatter(x=xs, y=[total0] + [r.params_total for r in rounds], name="whole model",
                             mode="lines+markers"))
    fig.add_trace(go.Scatter(x=xs, y=[comp0] + [r.params_compressible for r in rounds],
                             name="compressible layers", mode="lines+markers"))
    fig.update_xaxes(dtick=1)
    return fig


def rank_heatmap(rounds: Sequence[RoundReport]) -> go.Figure:
    """Active bases of every layer (rows) after every round (columns; column 0 = before)."""
    if not rounds:
        return _empty("Ranks", "no round finished yet")
    names = [layer.name for layer in rounds[0].layers]
    z = [[rounds[0].layers[i].rank_before] + [r.layers[i].rank_after for r in rounds] for i in range(len(names))]
    fig = go.Figure(go.Heatmap(z=z, x=[f"r{t}" for t in range(len(rounds) + 1)], y=names, colorscale="Viridis",
                               colorbar=dict(title="rank"),
                               hovertemplate="%{y}<br>%{x}: rank %{z}<extra></extra>"))
    fig.update_layout(title="Per-layer rank (layers x rounds)", **{**_LAYOUT, "height": max(320, 14 * len(names) + 120)})
    fig.update_yaxes(autorange="reversed", tickfont=dict(size=9))
    return fig


def basis_figure(rows: Sequence[dict]) -> go.Figure:
    """The per-basis terms of one layer in one round, against basis position.

    ``rows`` are :func:`bsi.app.inspect.basis_rows` records. Top panel:
    importance with each basis coloured by status (protected, in the pool and
    kept, pruned); the gradient and Hessian terms are overlaid as lines.
    """
    if not rows:
        return _empty("Bases", "choose a round and a layer")
    fig = go.Figure(layout=dict(title="Importance of every basis (prune small first)", xaxis_title="basis id (0 = largest SVD value)",
                                yaxis_title="predicted loss increase", **{**_LAYOUT, "height": 380}))
    for status, color in STATUS_COLORS.items():
        sel = [r for r in rows if r["status"] == status]
        if sel:
            fig.add_trace(go.Scatter(x=[r["basis_id"] for r in sel], y=[r["importance"] for r in sel], mode="markers",
                                     name=f"importance: {status}", marker=dict(color=color, size=6)))
    order = sorted(rows, key=lambda r: r["basis_id"])
    fig.add_trace(go.Scatter(x=[r["basis_id"] for r in order], y=[r["grad_term"] for r in order], mode="lines",
                             name="-sigma*g", line=dict(width=1, color="#756bb1")))
    fig.add_trace(go.Scatter(x=[r["basis_id"] for r in order], y=[r["hessian_term"] for r in order], mode="lines",
                             name="0.5 sigma^2 h", line=dict(width=1, color="#31a354", dash="dot")))
    return fig


def spectrum_figure(eigenvalues: Sequence[float], fit: tuple[float, float] | None = None,
                    title: str = "Hessian spectrum") -> go.Figure:
    """|eigenvalues| sorted descending against their index, on log-log axes.

    ``fit = (c, a)`` adds the least-squares power law ``c * k^-a`` and the
    envelope ``|lambda_1| k^-a`` of the assumption in METHOD.md sec. 7.
    """
    values = sorted((abs(float(v)) for v in eigenvalues), reverse=True)
    values = [v for v in values if v > 0]
    if not values:
        return _empty(title, "no spectrum yet: press Compute")
    ks = list(range(1, len(values) + 1))
    fig = go.Figure(layout=dict(title=title, xaxis_title="k", yaxis_title="|lambda_k|", **{**_LAYOUT, "height": 380}))
    fig.add_trace(go.Scatter(x=ks, y=values, mode="markers", name="|lambda_k|"))
    if fit is not None:
        c, a = fit
        fig.add_trace(go.Scatter(x=ks, y=[c * k ** -a for k in ks], mode="lines", name=f"fit {c:.3g} k^-{a:.2f}"))
        fig.add_trace(go.Scatter(x=ks, y=[values[0] * k ** -a for k in ks], mode="lines",
                                 name="envelope |lambda_1| k^-a", line=dict(dash="dash")))
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    return fig


def compare_figure(rows: Sequence[dict]) -> go.Figure:
    """Accuracy against model size, one line per method (a sweep's results.jsonl rows)."""
    if not rows:
        return _empty("Accuracy vs size", "load a sweep's results.jsonl")
    fig = go.Figure(layout=dict(title="Accuracy vs size", xaxis_title="parameters (whole model)",
                                yaxis_title="accuracy (%)", **{**_LAYOUT, "height": 420}))
    for method in dict.fromkeys(r["method"] for r in rows):
        sel = sorted((r for r in rows if r["method"] == method), key=lambda r: r["params_total"])
        fig.add_trace(go.Scatter(x=[r["params_total"] for r in sel], y=[100 * r["accuracy"] for r in sel],
                                 mode="lines+markers", name=method,
                                 text=[f"target {r.get('target')}, loss {r.get('loss', float('nan')):.3f}" for r in sel],
                                 hovertemplate="%{x:,} params<br>%{y:.1f}%<br>%{text}<extra>" + method + "</extra>"))
    return fig
