"""Every plotly figure of bsi: plain records in, ``go.Figure`` out (no Gradio, no model).

One module for all of them, so the dashboard, ``bsi sweep``, ``bsi spectrum``
and the notebooks draw the same things the same way:

* the Compress tab's live charts: :func:`loss_figure`, :func:`params_figure`,
  :func:`rank_heatmap` (from step losses and :class:`~bsi.reports.RoundReport`);
* the Inspect tab's :func:`basis_figure` (the per-basis rows of one layer);
* :func:`spectrum_figure`, the Hessian spectra of a
  :class:`~bsi.analysis.spectrum.SpectrumResult` (``spectrum.html``, the Spectra tab);
* :func:`results_figure`, accuracy and loss of a list of runs against model size;
  :func:`study_figure`, a study's with interval bands (a sweep's ``figure.html``,
  the Compare tab).

A builder given nothing to draw returns a figure with a one-line message
instead of blank axes. Hover labels show about four significant figures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bsi.method.names import layer_block, layer_kind
from bsi.results import StudyRow

LAYOUT = dict(template="plotly_white", margin=dict(l=60, r=20, t=60, b=50), height=340,
              legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0))
STAGE_COLORS = {"finetune": "#7f7f7f", "train": "#1f77b4", "profile": "#ff7f0e", "recover": "#2ca02c"}
STATUS_COLORS = {"protected": "#9ecae1", "pool (kept)": "#3182bd", "pruned": "#e6550d"}
TERM_STYLES = {"gradient": dict(color="#756bb1"), "curvature": dict(color="#31a354", dash="dot"),
               "magnitude": dict(color="#636363")}
METHOD_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#d62728", "#e377c2", "#7f7f7f")


def empty_figure(title: str, message: str) -> go.Figure:
    """A titled figure holding only ``message`` (what a builder shows before there is data)."""
    fig = go.Figure(layout=dict(title=title, **LAYOUT))
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


# ------------------------------------------------------------- compress tab
def loss_figure(steps: Sequence[tuple[str, int, float]]) -> go.Figure:
    """Training loss against step, one trace per stage.

    Args:
        steps: ``(stage, step, loss)`` with ``step`` counted across the whole
            run (so the stages follow each other on the x axis).
    """
    if not steps:
        return empty_figure("Loss", "no steps yet: press Start")
    fig = go.Figure(layout=dict(title="Loss (answer-token cross-entropy)", xaxis_title="step",
                                yaxis_title="loss", **LAYOUT))
    for stage in dict.fromkeys(s for s, _, _ in steps):
        xs = [x for s, x, _ in steps if s == stage]
        ys = [y for s, _, y in steps if s == stage]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers" if len(xs) < 60 else "lines", name=stage,
                                 line=dict(color=STAGE_COLORS.get(stage)),
                                 hovertemplate="step %{x}: loss %{y:.4g}<extra>" + stage + "</extra>"))
    return fig


def params_figure(rounds: Sequence[Any], params_before: int | None = None,
                  compressible_before: int | None = None) -> go.Figure:
    """Whole-model and compressible-layer parameters after each round (round 0 = before compression)."""
    if not rounds:
        return empty_figure("Parameters", "no round finished yet")
    xs = [0] + [r.round for r in rounds]
    total0 = params_before if params_before is not None else rounds[0].params_total
    comp0 = compressible_before if compressible_before is not None else rounds[0].compressible_before
    fig = go.Figure(layout=dict(title="Parameters vs round", xaxis_title="round", yaxis_title="parameters",
                                **LAYOUT))
    hover = "round %{x}: %{y:.4s} parameters<extra>%{fullData.name}</extra>"
    fig.add_trace(go.Scatter(x=xs, y=[total0] + [r.params_total for r in rounds], name="whole model",
                             mode="lines+markers", hovertemplate=hover))
    fig.add_trace(go.Scatter(x=xs, y=[comp0] + [r.params_compressible for r in rounds],
                             name="compressible layers", mode="lines+markers", hovertemplate=hover))
    fig.update_xaxes(dtick=1)
    fig.update_yaxes(tickformat=".3~s", rangemode="tozero")
    return fig


def rank_heatmap(rounds: Sequence[Any]) -> go.Figure:
    """Kept share of every layer's bases after every round, one panel per layer kind, one row per block.

    A 30-block model has 210 layers; drawn as one row each they would not be
    readable. Here each kind (``self_attn.q_proj``, ``mlp.down_proj``, ...)
    gets a panel whose rows are the transformer blocks and whose columns are
    the rounds (the first column is the state before the first round shown),
    so the heatmap is as tall as the model is deep. Colour is rank / rank at
    the start (the kinds differ in size); hovering shows the rank itself.
    Layers outside the blocks (an untied ``lm_head``) get their own panel.
    """
    if not rounds:
        return empty_figure("Ranks", "no round finished yet")
    first = rounds[0]
    columns = [str(first.round - 1)] + [str(r.round) for r in rounds]
    panels: dict[str, dict[str, list[int]]] = {}  # kind -> row label -> ranks per column
    for i, layer in enumerate(first.layers):
        block = layer_block(layer.name)
        kind = layer_kind(layer.name) if block is not None else layer.name
        ranks = [layer.rank_before] + [r.layers[i].rank_after for r in rounds]
        panels.setdefault(kind, {})["–" if block is None else str(block)] = ranks
    rows = sorted({row for panel in panels.values() for row in panel}, key=lambda r: (r == "–", int(r) if r != "–" else 0))
    kinds = list(panels)
    fig = make_subplots(rows=1, cols=len(kinds), shared_yaxes=True, subplot_titles=kinds,
                        horizontal_spacing=min(0.02, 0.5 / max(len(kinds), 1)))
    for col, kind in enumerate(kinds, start=1):
        panel = panels[kind]
        ranks = [panel.get(row) for row in rows]
        z = [[r / max(values[0], 1) for r in values] if values else [None] * len(columns) for values in ranks]
        text = [[str(r) for r in values] if values else [""] * len(columns) for values in ranks]
        fig.add_trace(go.Heatmap(z=z, x=columns, y=rows, text=text, coloraxis="coloraxis", name=kind, xgap=1, ygap=1,
                                 hovertemplate=f"{kind}, block %{{y}}<br>after round %{{x}}: rank %{{text}} "
                                               "(%{z:.0%} of its start)<extra></extra>"), row=1, col=col)
    fig.update_layout(
        title="Ranks: share of each layer's bases kept (columns: rounds; rows: blocks)",
        coloraxis=dict(colorscale="Viridis", cmin=0, cmax=1, colorbar=dict(title="kept", tickformat=".0%")),
        **{**LAYOUT, "height": max(320, 16 * len(rows) + 170), "margin": dict(l=50, r=20, t=90, b=40)},
    )
    fig.update_annotations(font_size=10)
    fig.update_xaxes(title_text="round", tickfont=dict(size=9), type="category")
    fig.update_yaxes(autorange="reversed", type="category", tickfont=dict(size=9))
    fig.update_yaxes(title_text="block", row=1, col=1)
    return fig


# -------------------------------------------------------------- inspect tab
def basis_figure(rows: Sequence[dict]) -> go.Figure:
    """The per-basis numbers of one layer in one round, against the basis' original index.

    ``rows`` are :func:`bsi.app.inspect.basis_rows` records: ``basis``,
    ``importance``, ``status`` and one ``"<term> term"`` entry per term of the
    score (None where the term was not measured, e.g. the curvature outside
    the candidate pool). Markers: the importance, coloured by status
    (protected, in the pool and kept, pruned); lines: the score's terms.
    """
    if not rows:
        return empty_figure("Bases", "choose a round and a layer")
    fig = go.Figure(layout=dict(title="Importance of every basis (the smallest in the pool are pruned)",
                                xaxis_title="basis (0 = largest singular value at the start)",
                                yaxis_title="predicted loss increase", **{**LAYOUT, "height": 380}))
    for status, color in STATUS_COLORS.items():
        sel = [r for r in rows if r["status"] == status]
        if sel:
            fig.add_trace(go.Scatter(x=[r["basis"] for r in sel], y=[r["importance"] for r in sel], mode="markers",
                                     name=f"importance: {status}", marker=dict(color=color, size=6),
                                     hovertemplate="basis %{x}: %{y:.4g}<extra>" + status + "</extra>"))
    order = sorted(rows, key=lambda r: r["basis"])
    for key in (k for k in rows[0] if k.endswith(" term")):
        term = key.removesuffix(" term")
        fig.add_trace(go.Scatter(x=[r["basis"] for r in order], y=[r[key] for r in order], mode="lines", name=key,
                                 line=dict(width=1, **TERM_STYLES.get(term, {})),
                                 hovertemplate="basis %{x}: %{y:.4g}<extra>" + key + "</extra>"))
    return fig


# ------------------------------------------------------------------ spectra
def spectrum_figure(result: Any = None) -> go.Figure:
    """Log-log plots of ``|lambda_k|`` against ``k``: raw (left) and divided by ``|lambda_1|`` (right).

    ``result`` is a :class:`~bsi.analysis.spectrum.SpectrumResult`. Filled
    markers are positive eigenvalues, open markers negative ones. The right
    panel draws two power laws per layer, each named once:

    * the **envelope** (dashed), ``|lambda_1| k^-a_env`` with ``a_env = fit.alpha_envelope``:
      the steepest power law anchored at ``lambda_1`` that lies above every
      eigenvalue, the form the method's variance bound assumes (it needs
      ``a > 1/2``); it touches the data where the bound is tight;
    * the **least-squares fit** (dotted), ``c k^-a_fit`` (``fit.alpha``, ``c = exp(fit.log_c)``): a line through the
      middle of the points, which says how fast the bulk decays but bounds
      nothing.
    """
    if result is None or not result.layers:
        return empty_figure("Hessian spectrum", "no spectrum yet: choose a layer and press Compute")
    from plotly.colors import qualitative

    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.14,
                        subplot_titles=("|lambda_k|", "|lambda_k| / |lambda_1|, with two power laws"))
    for name, dash in (("envelope |lambda_1| k^-a_env (above every point)", "dash"),
                       ("least-squares fit c k^-a_fit (through the points)", "dot")):  # the line styles' key
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=name, hoverinfo="skip",
                                 line=dict(dash=dash, width=1.5, color="#444")), row=1, col=2)
    kinds = sorted({s.kind for s in result.layers})
    palette = {kind: qualitative.Plotly[i % len(qualitative.Plotly)] for i, kind in enumerate(kinds)}
    for s in result.layers:
        points = [(k, v) for k, v in enumerate(s.eigenvalues, start=1) if v != 0]
        ks = [k for k, _ in points]
        magnitudes = [abs(v) for _, v in points]
        symbols = ["circle" if v > 0 else "circle-open" for _, v in points]
        color = palette[s.kind]
        block = layer_block(s.name)
        short = s.name if block is None else f"{block}.{s.kind}"
        label = f"{short}: a_env {s.fit.alpha_envelope:.2f}, a_fit {s.fit.alpha:.2f}"
        common = dict(mode="markers+lines", line=dict(width=1, color=color), legendgroup=s.name,
                      marker=dict(symbol=symbols, size=5, color=color), hovertemplate="k = %{x}: %{y:.4g}")
        fig.add_trace(go.Scatter(x=ks, y=magnitudes, name=label, **common), row=1, col=1)
        fig.add_trace(go.Scatter(x=ks, y=[m / s.lambda_1 for m in magnitudes], name=label, showlegend=False,
                                 **common), row=1, col=2)
        every = list(range(1, len(s.eigenvalues) + 1))
        if math.isfinite(s.fit.alpha_envelope):
            fig.add_trace(go.Scatter(x=every, y=[k ** -s.fit.alpha_envelope for k in every], mode="lines",
                                     name=f"envelope k^-{s.fit.alpha_envelope:.2f}", showlegend=False,
                                     legendgroup=s.name, hovertemplate="envelope: %{y:.4g}<extra></extra>",
                                     line=dict(dash="dash", width=1.5, color=color)), row=1, col=2)
        if math.isfinite(s.fit.alpha) and math.isfinite(s.fit.log_c):
            scale = math.exp(s.fit.log_c) / s.lambda_1  # the fit's constant c, relative to |lambda_1|
            fig.add_trace(go.Scatter(x=every, y=[scale * k ** -s.fit.alpha for k in every], mode="lines",
                                     name=f"fit {scale:.3g} k^-{s.fit.alpha:.2f}", showlegend=False,
                                     legendgroup=s.name, hovertemplate="fit: %{y:.4g}<extra></extra>",
                                     line=dict(dash="dot", width=1.5, color=color)), row=1, col=2)
    top = max((len(s.eigenvalues) for s in result.layers), default=1)
    ticks = [t for t in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000) if t <= top]
    fig.update_xaxes(type="log", title_text="k (rank by magnitude)", tickvals=ticks)
    fig.update_yaxes(type="log", exponentformat="power")
    fig.update_yaxes(title_text="|lambda_k|", row=1, col=1)
    fig.update_yaxes(title_text="relative to |lambda_1|", title_standoff=4, row=1, col=2)
    fig.update_annotations(font_size=13)  # the subplot titles: short enough for their panels
    batches = f"{result.batches} batch" + ("es" if result.batches != 1 else "")
    fig.update_layout(title=f"Hessian spectra in sigma-space (top-{result.top_k} sigmas, {batches})",
                      template="plotly_white", height=500 + 22 * ((len(result.layers) + 3) // 2),
                      margin=dict(l=70, r=30, t=90, b=40),
                      legend=dict(orientation="h", yanchor="top", y=-0.16, x=0, font=dict(size=11)))
    return fig


# ------------------------------------------------------------------- sweeps
def results_figure(rows: Sequence[StudyRow], reference: str = "dense") -> go.Figure:
    """Accuracy (left) and answer-token loss (right) against model size, one line per method.

    ``rows`` are a sweep's :class:`~bsi.results.StudyRow` records (method,
    target, size, accuracy in [0, 1], loss); the row whose method is
    ``reference`` (the sweep's fine-tuned dense model) starts every line.
    The size axis runs from large to small, in millions of parameters; the
    accuracy axis starts at 0.
    """
    if not rows:
        return empty_figure("Accuracy and loss against model size", "no results yet: load a sweep's results.jsonl")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("accuracy on the test split", "answer-token loss"))
    ref = next((r for r in rows if r.method == reference), None)
    methods = list(dict.fromkeys(r.method for r in rows if r.method != reference))
    if not methods and ref is not None:
        methods = [reference]
    for i, method in enumerate(methods):
        mine = sorted((r for r in rows if r.method == method), key=lambda r: -r.params_total)
        points = ([ref] if ref is not None and method != reference else []) + mine
        x = [r.params_total / 1e6 for r in points]
        text = [f"{r.method} at target {r.target:g}" for r in points]
        for col, key, scale, unit in ((1, "accuracy", 100.0, "%"), (2, "loss", 1.0, "")):
            y = [getattr(r.metrics, key) * scale if _finite(getattr(r.metrics, key)) else None for r in points]
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=method, legendgroup=method,
                                     showlegend=col == 1, text=text, line={"color": METHOD_COLORS[i % len(METHOD_COLORS)]},
                                     hovertemplate="%{text}<br>%{x:.4g} M parameters<br>" + key +
                                                   " %{y:.4g}" + unit + "<extra></extra>"), row=1, col=col)
    accuracies = [100 * r.metrics.accuracy for r in rows if _finite(r.metrics.accuracy)]
    top = min(100.0, max(accuracies, default=0.0) * 1.15 + 2)
    for col in (1, 2):
        fig.update_xaxes(title_text="model size (M parameters, smaller to the right)", autorange="reversed",
                         tickformat=".3~g", row=1, col=col)
    fig.update_yaxes(title_text="accuracy (%)", range=[0, top], ticksuffix="%", row=1, col=1)
    fig.update_yaxes(title_text="loss", tickformat=".3~g", row=1, col=2)
    fig.update_layout(title="Accuracy and loss against model size (each line starts at the fine-tuned dense model)",
                      template="plotly_white", height=460, legend=dict(orientation="h", y=-0.2))
    return fig


def _training_hover(entry: dict) -> str:
    """A study entry's training after the fine-tune, for a hover ('' where not recorded)."""
    if "training_steps" not in entry:
        return ""
    tokens = f", {entry['training_tokens'] / 1000:.0f}k tokens" if "training_tokens" in entry else ""
    return f"<br>trained {entry['training_steps']:g} steps after the fine-tune ({entry['path_steps']:g} on the path{tokens})"


def study_figure(stats: dict, protocols: Sequence[str] | None = None) -> go.Figure:
    """A study's accuracy and loss against whole-model size, one line per method, with 95% interval bands.

    ``stats`` is :func:`bsi.analysis.study.study_stats`'s output (a sweep's
    ``stats.json``). One row of panels per protocol (accuracy left, loss
    right, the loss on a log axis), ``tuned`` first (bsi's own settings, the
    comparison a reader looks for); each line starts at the dense model; a
    band is the method's pooled bootstrap interval over the test problems of
    every seed. The size axis is logarithmic and runs from large to small.
    On a text task the left panel is the perplexity (log axis) and the right
    one the mean next-token loss; models evaluated before recovery (the
    sweep's ``also_unrecovered``) are dotted lines of the same colours.
    """
    from bsi.config import is_engine_method

    chosen = [p for p in (protocols or sorted(stats.get("protocols", {}), key=lambda name: name != "tuned"))
              if stats["protocols"].get(p, {}).get("methods") or stats["protocols"].get(p, {}).get("no_recovery")]
    if not chosen:
        return empty_figure("Accuracy and loss against model size", "no results yet: run or load a sweep")
    text = stats.get("task") == "text"
    first, first_scale = ("perplexity", 1.0) if text else ("accuracy", 100.0)
    loss_title = "mean next-token loss" if text else "answer-token loss"
    titles = [f"{title} ({p} protocol)" for p in chosen for title in (first, loss_title)]
    fig = make_subplots(rows=len(chosen), cols=2, subplot_titles=titles, vertical_spacing=0.24 / max(len(chosen), 1))
    dense = stats.get("dense")
    every = [m for p in chosen for g in ("methods", "no_recovery") for m in stats["protocols"][p].get(g, {})]
    colors = {m: METHOD_COLORS[i % len(METHOD_COLORS)] for i, m in enumerate(dict.fromkeys(every))}  # one per method
    for r, protocol in enumerate(chosen, start=1):
        block = stats["protocols"][protocol]
        for group, dash, suffix in (("methods", "solid", ""), ("no_recovery", "dot", "no recovery")):
            for method, cells in block.get(group, {}).items():
                # a truncation method runs as published under every protocol: its label says so
                tags = [t for t in ("" if is_engine_method(method) else "published", suffix) if t]
                color, name = colors[method], method + (f" ({', '.join(tags)})" if tags else "")
                points = sorted(cells.items(), key=lambda kv: -kv[1]["params_total"])
                start = [("dense", dense)] if dense else []
                for col, key, scale in ((1, first, first_scale), (2, "loss", 1.0)):
                    xs = [e["params_total"] / 1e6 for _, e in start + points]
                    mid = [e[key]["estimate"] * scale for _, e in start + points]
                    low = [e[key]["low"] * scale for _, e in start + points]
                    high = [e[key]["high"] * scale for _, e in start + points]
                    text_of = ["dense" if t == "dense" else f"{name} at {t}{_training_hover(e)}" for t, e in start + points]
                    band = dict(x=xs + xs[::-1], y=high + low[::-1], fill="toself", line=dict(width=0), opacity=0.18,
                                fillcolor=color, hoverinfo="skip", showlegend=False, legendgroup=name)
                    fig.add_trace(go.Scatter(**band), row=r, col=col)
                    fig.add_trace(go.Scatter(
                        x=xs, y=mid, mode="lines+markers", name=name, legendgroup=name,
                        showlegend=(r == 1 and col == 1), line=dict(color=color, dash=dash), text=text_of,
                        customdata=list(zip(low, high)),
                        hovertemplate="%{text}<br>%{x:.4g} M parameters<br>" + key +
                                      " %{y:.4g} [%{customdata[0]:.4g}, %{customdata[1]:.4g}]<extra></extra>"),
                        row=r, col=col)
        if text:
            fig.update_yaxes(title_text="perplexity", type="log", row=r, col=1)
        else:
            fig.update_yaxes(title_text="accuracy (%)", rangemode="tozero", row=r, col=1)
        fig.update_yaxes(title_text="loss", type="log", dtick="D2", row=r, col=2)  # 1, 2, 5 labels only
        for col in (1, 2):
            fig.update_xaxes(title_text="M parameters, whole model (fewer →)", type="log", nticks=6, tickangle=0,
                             autorange="reversed", row=r, col=col)
    what = "Perplexity and mean next-token loss" if text else "Accuracy and loss"
    unit = "held-out windows" if text else "problems"
    fig.update_layout(title=f"{what} against model size, 95% bootstrap bands ({unit} of every seed)",
                      template="plotly_white", height=420 * len(chosen) + 120, margin=dict(b=110),
                      # below the axis titles of the last row (paper units shrink as rows are added)
                      legend=dict(orientation="h", yanchor="top", y=-0.16 / len(chosen)))
    return fig


def ranking_figure(points: dict) -> go.Figure:
    """Predicted against measured loss change of removing single bases, one panel per ranking.

    ``points[name] = (predicted, measured, spearman)``: the ranking's value of
    each measured basis (low: removed first), the measured loss change, and
    their rank correlation (under the panel's name). Two panels a row, so
    that each panel's title has room on a static image.
    """
    if not points:
        return empty_figure("Predicted against measured", "press Measure candidates")
    names = list(points)
    cols = min(2, len(names))
    rows = math.ceil(len(names) / cols)
    count = len(next(iter(points.values()))[1])
    fig = make_subplots(rows=rows, cols=cols, horizontal_spacing=0.12, vertical_spacing=0.22 if rows > 1 else 0.1,
                        subplot_titles=[f"{n}: Spearman {points[n][2]:+.2f}" for n in names])
    for k, name in enumerate(names):
        predicted, measured, _ = points[name]
        row, col = k // cols + 1, k % cols + 1
        fig.add_trace(go.Scatter(x=predicted, y=measured, mode="markers", name=name, showlegend=False,
                                 marker=dict(color=METHOD_COLORS[k % len(METHOD_COLORS)], size=8),
                                 hovertemplate="predicted %{x:.4g}<br>measured %{y:.4g}<extra>" + name + "</extra>"),
                      row=row, col=col)
        fig.update_xaxes(title_text=f"{name}'s value (low: removed first)", row=row, col=col)
        fig.update_yaxes(title_text="measured loss change", row=row, col=col)
    fig.update_layout(title=f"Removing one basis at a time ({count} bases): each ranking against the measurement",
                      template="plotly_white", height=300 * rows + 80, margin=dict(l=70, r=20, t=90, b=50))
    return fig


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# -------------------------------------------------------------- what-if tab
RANK_COLORS = {"bsi": "#1f77b4", "magnitude": "#ff7f0e", "gradient": "#9467bd", "random": "#7f7f7f"}


def whatif_ranks_figure(cut: Any) -> go.Figure:
    """Kept share of every layer's bases under one what-if cut: bars grouped by block, one colour per layer kind.

    ``cut`` is a :class:`bsi.analysis.whatif.WhatIfCut`. A bar's height is
    the share of the layer's bases (at the round the cut starts from) that
    the cut keeps; hovering gives the count.
    """
    if cut is None:
        return empty_figure("Kept bases per layer", "choose a round and a size")
    groups: dict[str, tuple[list[str], list[float], list[str]]] = {}
    for name, rank in cut.ranks.items():
        block = layer_block(name)
        kind = layer_kind(name) if block is not None else name
        xs, ys, text = groups.setdefault(kind, ([], [], []))
        xs.append("–" if block is None else str(block))
        ys.append(cut.kept[name] / max(rank, 1))
        text.append(f"{cut.kept[name]} of {rank}")
    title = (f"Kept bases per layer: {cut.removed:,} removed, the whole model {cut.compression:.2f}x smaller "
             f"(compressible layers at {cut.compressible_ratio:.1%})")
    fig = go.Figure(layout=dict(title=dict(text=title, font=dict(size=13)), barmode="group", bargap=0.15,
                                xaxis_title="block", yaxis_title="share of the layer's bases kept",
                                **{**LAYOUT, "height": 360}))
    for k, (kind, (xs, ys, text)) in enumerate(groups.items()):
        fig.add_trace(go.Bar(x=xs, y=ys, name=kind, text=text, textposition="none",
                             marker_color=METHOD_COLORS[k % len(METHOD_COLORS)],
                             hovertemplate=f"{kind}, block %{{x}}: %{{text}} kept (%{{y:.0%}})<extra></extra>"))
    fig.update_yaxes(range=[0, 1.02], tickformat=".0%")
    fig.update_xaxes(type="category", tickfont=dict(size=9))
    return fig


def whatif_curve_figure(points: Sequence[Any], path: Sequence[Any], dense_loss: float | None = None) -> go.Figure:
    """What one-shot cuts measured, beside the run's own path: loss against size, and predicted against measured.

    Left: held-out loss against how many times smaller the whole model is,
    one marker per measured cut (coloured by ranking), the run's own model
    after each round (the gradual schedule and its tuning, no recovery) as a
    line, and the dense model as a dashed line. Right: the measured loss
    rise over the uncut model of the same round against the rise the scores
    predicted (the sum of the removed bases' importance), with the diagonal
    where prediction equals measurement; the run's points predict the sum of
    its rounds' predictions and measure against its first round's uncut model.

    ``points`` are :class:`bsi.analysis.whatif.MeasuredCut`, ``path``
    :class:`bsi.analysis.whatif.PathPoint` objects.
    """
    if not points and not path:
        return empty_figure("Predicted and measured", "press Measure to add a point")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=("Held-out loss against size", "Predicted against measured loss rise"))
    shown: set[str] = set()
    for point in points:
        cut = point.cut
        color = RANK_COLORS.get(cut.rank_by, "#333333")
        name = cut.rank_by
        hover = (f"{point.label}<br>%{{x:.3g}}x smaller, loss %{{y:.4g}}<extra>one-shot cut</extra>")
        fig.add_trace(go.Scatter(x=[cut.compression], y=[point.measurement.loss], mode="markers", name=name,
                                 legendgroup=name, showlegend=name not in shown, marker=dict(color=color, size=10),
                                 hovertemplate=hover), row=1, col=1)
        fig.add_trace(go.Scatter(x=[cut.predicted], y=[point.measured], mode="markers", name=name, legendgroup=name,
                                 showlegend=False, marker=dict(color=color, size=10),
                                 hovertemplate=f"{point.label}<br>predicted %{{x:.4g}}, measured %{{y:.4g}}"
                                               "<extra></extra>"), row=1, col=2)
        shown.add(name)
    if path:
        fig.add_trace(go.Scatter(x=[p.compression for p in path], y=[p.measurement.loss for p in path],
                                 mode="lines+markers", name="the run (rounds + tuning)", legendgroup="run",
                                 marker=dict(symbol="diamond", size=11, color="#000000"), line=dict(color="#000000"),
                                 text=[f"after round {p.round}" for p in path],
                                 hovertemplate="%{text}: %{x:.3g}x smaller, loss %{y:.4g}<extra>the run</extra>"),
                      row=1, col=1)
        fig.add_trace(go.Scatter(x=[p.predicted for p in path], y=[p.rise for p in path], mode="lines+markers",
                                 name="the run", legendgroup="run", showlegend=False, line=dict(color="#000000"),
                                 marker=dict(symbol="diamond", size=11, color="#000000"),
                                 text=[f"after round {p.round}" for p in path],
                                 hovertemplate="%{text}: predicted %{x:.4g}, measured %{y:.4g}<extra>the run</extra>"),
                      row=1, col=2)
    if dense_loss is not None:
        sizes = [p.cut.compression for p in points] + [p.compression for p in path]
        fig.add_trace(go.Scatter(x=[1.0, max(sizes, default=1.0)], y=[dense_loss, dense_loss], mode="lines",
                                 name="dense, fine-tuned", line=dict(color="#2ca02c", dash="dash"),
                                 hovertemplate="the dense model: loss %{y:.4g}<extra></extra>"), row=1, col=1)
    rises = [(p.cut.predicted, p.measured) for p in points] + [(p.predicted, p.rise) for p in path]
    shown = [(x, y) for x, y in rises if x > 0 and y > 0]
    if shown:
        low = min(min(x, y) for x, y in shown) / 2
        top = max(max(x, y) for x, y in shown) * 2
        fig.add_trace(go.Scatter(x=[low, top], y=[low, top], mode="lines", name="measured = predicted",
                                 line=dict(color="#bbbbbb", dash="dot"), hoverinfo="skip"), row=1, col=2)
    hidden = len(rises) - len(shown)
    if hidden:  # log axes: a measured fall (noise, or a cut that helped) has no place on them
        fig.add_annotation(text=f"{hidden} point{'s' if hidden > 1 else ''} with a measured fall (or no predicted "
                                "rise) not drawn", xref="x2 domain", yref="y2 domain", x=0.02, y=0.98,
                           showarrow=False, font=dict(size=10), xanchor="left")
    fig.update_layout(**{**LAYOUT, "height": 420, "margin": dict(l=60, r=20, t=40, b=110),
                         "legend": dict(orientation="h", yanchor="top", y=-0.22, x=0)})
    # log axes: a cut that breaks the model (a random one) sits orders of magnitude above the others
    fig.update_xaxes(title_text="whole model, times smaller", row=1, col=1)
    fig.update_yaxes(title_text="held-out answer-token loss", type="log", row=1, col=1)
    fig.update_xaxes(title_text="predicted rise (sum of removed importance)", type="log", row=1, col=2)
    fig.update_yaxes(title_text="measured rise over the uncut model", type="log", row=1, col=2)
    return fig


def eps_figure(study: Any, eps: float | None = None, rule_eps: float | None = None) -> go.Figure:
    """One layer's curvature at one eps, and the estimate's error at every eps tried.

    ``study`` is a :class:`bsi.analysis.whatif.EpsStudy`. Left: ``|h_i|`` per
    basis on a log axis: the Fisher (a line), Hutchinson's estimate at
    ``eps`` (markers; a negative estimate, which the Fisher never gives, in
    red), and the exact diagonal at the largest coefficients (black).
    Right: the relative error against the exact diagonal for every eps tried
    so far, the Fisher's as a dashed line, the rule's eps as a dotted one.
    """
    if study is None:
        return empty_figure("eps", "prepare the round models, then choose a layer and an eps")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, column_widths=[0.6, 0.4],
                        subplot_titles=(f"Curvature of {study.name}", "Error against the exact diagonal"))
    xs = list(range(study.sigma.numel()))
    fig.add_trace(go.Scatter(x=xs, y=study.fisher.abs().clamp_min(1e-12).tolist(), mode="lines", name="Fisher",
                             line=dict(color="#2ca02c"), hovertemplate="basis %{x}: %{y:.3g}<extra>Fisher</extra>"),
                  row=1, col=1)
    point = study.points.get(eps) if eps is not None else None
    if point is not None:
        values = point.curvature
        for negative, color, label in ((False, "#1f77b4", f"Hutchinson, eps {point.eps:.2g}"),
                                       (True, "#d62728", "Hutchinson < 0 (|h| shown)")):
            chosen = [i for i in xs if (float(values[i]) < 0) == negative]
            if chosen:
                fig.add_trace(go.Scatter(x=chosen, y=[max(abs(float(values[i])), 1e-12) for i in chosen],
                                         mode="markers", name=label, marker=dict(color=color, size=4),
                                         hovertemplate="basis %{x}: |h| %{y:.3g}<extra>" + label + "</extra>"),
                              row=1, col=1)
    fig.add_trace(go.Scatter(x=study.top.tolist(), y=study.exact.abs().clamp_min(1e-12).tolist(), mode="markers",
                             name="exact (double backward)", marker=dict(color="#000000", size=9, symbol="x"),
                             hovertemplate="basis %{x}: %{y:.3g}<extra>exact</extra>"), row=1, col=1)
    tried = sorted(study.points.values(), key=lambda p: p.eps)
    if tried:
        fig.add_trace(go.Scatter(x=[p.eps for p in tried], y=[p.error for p in tried], mode="lines+markers",
                                 name="Hutchinson's error", line=dict(color="#1f77b4"), showlegend=False,
                                 hovertemplate="eps %{x:.2g}: error %{y:.3g}<extra></extra>"), row=1, col=2)
    fig.add_hline(y=study.fisher_error, line_dash="dash", line_color="#2ca02c", annotation_text="Fisher",
                  annotation_position="bottom right", row=1, col=2)
    if rule_eps is not None:
        fig.add_vline(x=rule_eps, line_dash="dot", line_color="#555555", annotation_text="the rule",
                      annotation_position="top left", row=1, col=2)
    fig.update_layout(**{**LAYOUT, "height": 420, "margin": dict(l=60, r=20, t=40, b=110),
                         "legend": dict(orientation="h", yanchor="top", y=-0.22, x=0)})
    fig.update_xaxes(title_text="basis (0 = largest sigma at conversion)", row=1, col=1)
    fig.update_yaxes(title_text="|d2l/dsigma^2| estimate", type="log", row=1, col=1)
    fig.update_xaxes(title_text="eps", type="log", range=[-7.2, 0.1], row=1, col=2)  # the slider's range
    fig.update_yaxes(title_text="relative error at the largest sigmas", type="log", row=1, col=2)
    return fig
