"""Compare tab: a sweep's results, accuracy (or perplexity) and loss against size, with intervals.

A sweep folder (``bsi sweep --out DIR``) holds ``results.jsonl`` (one row per
evaluated model), each model's per-problem outcomes and ``stats.json``, the
intervals computed from them (:mod:`bsi.analysis.study`). The tab reads
``stats.json`` (or computes it from the outcomes when it is missing), draws
:func:`bsi.analysis.figures.study_figure` (accuracy and loss against size, one
line per method, 95% bands) and tabulates every cell: the pooled accuracy and
loss with their intervals and the paired difference from ``bsi``, starred when
its interval excludes 0. A sweep on a text task shows the perplexity instead
of the accuracy, and ``bsi``'s perplexity over each method's (below 1:
``bsi``'s is lower); models evaluated before recovery are listed as
``method (no recovery)``. A sweep written before outcomes were kept is drawn
from its rows alone, without intervals (:func:`~bsi.analysis.figures.results_figure`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from bsi.analysis.study import folder_loader, study_stats
from bsi.app.format import significant
from bsi.errors import BSIError
from bsi.results import StudyRow, read_study_rows

REQUIRED = ("method", "target", "params_total", "accuracy", "loss")
HEADERS = ["protocol", "method", "target", "params (M)", "accuracy (%)", "95% interval", "loss", "95% interval",
           "bsi − method, accuracy (points)", "bsi − method, loss"]
TEXT_HEADERS = ["protocol", "method", "target", "params (M)", "perplexity", "95% interval", "mean next-token loss",
                "95% interval", "bsi / method, perplexity", "bsi − method, loss"]
NO_RECOVERY = " (no recovery)"
"""Appended to the method of a model evaluated before recovery."""


def results_path(spec: str) -> Path:
    """``DIR/results.jsonl`` for a folder, or the file itself."""
    path = Path((spec or "").strip()).expanduser()
    if not str(spec or "").strip():
        raise BSIError("type the folder of a sweep (it holds results.jsonl)")
    if path.is_dir():
        path = path / "results.jsonl"
    if not path.is_file():
        raise BSIError(f"'{path}' does not exist: give a sweep folder holding results.jsonl")
    return path


def load_results(spec: str) -> list[StudyRow]:
    """The rows of a sweep's results.jsonl, checked; raises BSIError naming a bad line."""
    path = results_path(spec)
    rows = read_study_rows(path, needs=REQUIRED)
    if not rows:
        raise BSIError(f"{path} holds no results yet")
    return rows


def sweep_model(spec: str) -> str | None:
    """The model a sweep compressed, from its ``sweep.json`` (None when the folder has none or it is unreadable)."""
    try:
        config = json.loads((results_path(spec).parent / "sweep.json").read_text(encoding="utf-8"))["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return config.get("model") if isinstance(config, dict) else None


def load_stats(spec: str, rows: Sequence[StudyRow]) -> dict | None:
    """The sweep's intervals: its ``stats.json``, else computed from the outcomes; None for a sweep without outcomes."""
    folder = results_path(spec).parent
    saved = folder / "stats.json"
    if saved.is_file():
        try:
            return json.loads(saved.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise BSIError(f"{saved} is not valid JSON ({err}); delete it to compute it again from the outcomes") from None
    if not all(r.outcomes for r in rows):
        return None
    protocols = sorted({r.protocol for r in rows} - {None, "dense", "published"}) or ["tuned"]
    try:
        if any(r.budget is not None for r in rows):
            from bsi.analysis.budget import budget_stats

            return budget_stats(rows, folder_loader(folder), resamples=2000)
        return study_stats(rows, folder_loader(folder), protocols, resamples=2000)
    except (OSError, KeyError, ValueError) as err:
        raise BSIError(f"cannot read the outcomes of the sweep in {folder} ({err})") from None


def _interval(entry: dict | None, scale: float, signed: bool = False) -> tuple[float | None, str]:
    if not entry or not isinstance(entry.get("estimate"), (int, float)) or not math.isfinite(entry["estimate"]):
        return None, ""
    text = f"[{significant(scale * entry['low'])}, {significant(scale * entry['high'])}]"
    return significant(scale * entry["estimate"]), text + (" *" if signed and entry.get("excludes_zero") else "")


def _table_row(group: str, method: str, target: str, e: dict, text: bool) -> list:
    """One cell of a sweep's statistics as a table row (``group``: its protocol, or a budget curve's budget)."""
    first, first_ci = _interval(e["perplexity"], 1) if text else _interval(e["accuracy"], 100)
    loss, loss_ci = _interval(e["loss"], 1)
    diff = e.get("vs_anchor") or {}
    if text:
        d_first, d_first_ci = _interval(diff.get("perplexity_ratio"), 1, signed=True)
        d_first_text = "" if d_first is None else f"{d_first:g} {d_first_ci}"
    else:
        d_first, d_first_ci = _interval(diff.get("accuracy"), 100, signed=True)
        d_first_text = "" if d_first is None else f"{d_first:+g} {d_first_ci}"
    d_loss, d_loss_ci = _interval(diff.get("loss"), 1, signed=True)
    return [group, method, float(target), significant(e["params_total"] / 1e6), first, first_ci, loss, loss_ci,
            d_first_text, "" if d_loss is None else f"{d_loss:+g} {d_loss_ci}"]


def table(stats: dict) -> list[list]:
    """One row per protocol, method and target (:data:`HEADERS` order, :data:`TEXT_HEADERS` on a text task).

    Numbers to four significant figures; the recovered models first, then
    those evaluated before recovery (``method (no recovery)``). A budget
    curve's statistics (:func:`bsi.analysis.budget.budget_stats`) give a row
    per budget, method and size, the first column naming the budget.
    """
    text = stats.get("task") == "text"
    out = []
    for budget, methods in stats.get("curves", {}).items():
        for method, cells in methods.items():
            for target, e in sorted(cells.items(), key=lambda kv: -float(kv[0])):
                out.append(_table_row(f"{budget} steps", method, target, e, text))
    for protocol, block in stats.get("protocols", {}).items():
        for group, suffix in (("methods", ""), ("no_recovery", NO_RECOVERY)):
            for method, cells in (block.get(group) or {}).items():
                for target, e in sorted(cells.items(), key=lambda kv: -float(kv[0])):
                    out.append(_table_row(protocol, method + suffix, target, e, text))
    return out


def plain_table(rows: Sequence[StudyRow]) -> list[list]:
    """Rows of a sweep without outcomes: point estimates only."""
    ordered = sorted(rows, key=lambda r: (r.protocol or "", r.method, -r.params_total))
    return [[r.protocol or "", r.method, r.target, significant(r.params_total / 1e6),
             significant(100 * r.metrics.accuracy), "",
             significant(r.metrics.loss if math.isfinite(r.metrics.loss) else None), "", "", ""]
            for r in ordered]


def view(spec: str):
    """(status, figure, table, headers) for a sweep folder."""
    from bsi.analysis.figures import results_figure, study_figure

    rows = load_results(spec)
    stats = load_stats(spec, rows)
    methods = sorted({r.method for r in rows})
    seeds = sorted({r.seed for r in rows})
    model = sweep_model(spec)
    status = (f"{f'`{model}`: ' if model else ''}{len(rows)} evaluated models, methods: {', '.join(methods)}; "
              f"seeds {', '.join(map(str, seeds))}")
    if stats is None:
        return (status + " (no per-problem outcomes in this sweep: no intervals)", results_figure(rows),
                plain_table(rows), HEADERS)
    if stats.get("task") == "text":
        protocol = stats.get("perplexity_protocol") or {}
        said = f" Perplexity on {protocol['source']}: {protocol['description']}." if protocol else ""
        return (status + "; the loss is the mean next-token NLL and the perplexity exp of it; 95% bootstrap "
                         "intervals over the held-out windows, * marks a difference whose interval excludes 0 (a "
                         "perplexity ratio's: 1)." + said, study_figure(stats), table(stats), TEXT_HEADERS)
    if "curves" in stats:  # a budget curve: accuracy and loss against the total training
        from bsi.analysis.budget import budget_figure

        return (status + "; a budget curve: every model had the same total training after the fine-tune (first "
                         "column); 95% bootstrap intervals over the test problems, * marks a difference whose "
                         "interval excludes 0", budget_figure(stats), table(stats), ["budget", *HEADERS[1:]])
    return (status + "; 95% bootstrap intervals over the test problems, * marks a difference whose interval "
                     "excludes 0", study_figure(stats), table(stats), HEADERS)


def opening(spec: str) -> tuple[str, object, dict]:
    """(status, figure, table) of ``spec``, or one line saying what to change with an empty figure and table.

    What the tab shows before any click (the shipped study) and after Load: a
    folder that cannot be shown leaves nothing of the previous one on the page.
    """
    from bsi.analysis.figures import study_figure

    try:
        status, fig, rows, headers = view(spec)
    except BSIError as err:
        return f"**Error:** {err}", study_figure({"protocols": {}}), {"data": [], "headers": HEADERS}
    return status, fig, {"data": rows, "headers": headers}


def render(default_dir: str = ""):
    """Lay out the Compare tab, open on ``default_dir`` (the shipped study when there is one)."""
    import gradio as gr

    from bsi.analysis.figures import study_figure
    from bsi.shipped import shipped_sweep, shipped_sweep_names

    if default_dir:
        first_status, first_figure, first_table = opening(default_dir)
    else:
        first_status, first_figure, first_table = ("Type a sweep folder and press Load.", study_figure({"protocols": {}}),
                                                   {"data": [], "headers": HEADERS})
    shipped = [(name, str(shipped_sweep(name))) for name in shipped_sweep_names()]  # (label, folder)
    with gr.Row():
        folder = gr.Textbox(value=default_dir, label="Sweep folder (holds results.jsonl, written by `bsi sweep`)",
                            scale=4, elem_id="compare-folder")
        load = gr.Button("Load", variant="primary", scale=1, elem_id="compare-load")
    picker = gr.Dropdown(choices=shipped, value=default_dir if default_dir in dict(shipped).values() else None,
                         label="Or one of the sweeps shipped in data/sweeps (another model, another task)",
                         visible=bool(shipped), elem_id="compare-shipped")
    status = gr.Markdown(first_status, elem_id="compare-status")
    figure = gr.Plot(first_figure, label="Accuracy and loss against size", elem_id="compare-figure")
    frame = gr.Dataframe(value=first_table, interactive=False, label="Runs", wrap=True, elem_id="compare-table",
                         datatype=["str", "str", "number", "number", "number", "str", "number", "str", "str", "str"])

    load.click(opening, folder, [status, figure, frame])
    picker.input(lambda chosen: (chosen or "", *opening(chosen or "")), picker, [folder, status, figure, frame])
