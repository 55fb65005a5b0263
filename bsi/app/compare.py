"""Compare tab: a sweep's results, accuracy and loss against size.

A sweep writes ``DIR/results.jsonl``, one JSON object per finished run with
at least ``method``, ``target``, ``params_total``, ``accuracy`` (in [0, 1])
and ``loss``; other fields are kept and ignored. :func:`load_results` reads
and checks it (a bad line is named); the figure is the sweep's own
``figure.html`` (:func:`bsi.analysis.figures.results_figure`: an accuracy and
a loss panel) and the table shows sizes in millions and numbers to four
significant figures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from bsi.errors import BSIError
from bsi.files import json_object

from bsi.app.format import significant

REQUIRED = ("method", "target", "params_total", "accuracy", "loss")
HEADERS = ["method", "target", "params (M)", "accuracy (%)", "loss"]


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


def load_results(spec: str) -> list[dict]:
    """The rows of a sweep's results.jsonl, checked; raises BSIError naming a bad line."""
    path = results_path(spec)
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        row = json_object(line, number, path)
        missing = [k for k in REQUIRED if k not in row]
        if missing:
            raise BSIError(f"{path}, line {number}: missing field(s) {', '.join(missing)}")
        if not isinstance(row["params_total"], (int, float)) or not isinstance(row["accuracy"], (int, float)):
            raise BSIError(f"{path}, line {number}: params_total and accuracy must be numbers")
        rows.append(row)
    if not rows:
        raise BSIError(f"{path} holds no results yet")
    return rows


def table(rows: Sequence[dict]) -> list[list]:
    """Rows sorted by method then size, as lists in :data:`HEADERS` order (four significant figures)."""
    ordered = sorted(rows, key=lambda r: (str(r["method"]), -r["params_total"]))
    out = []
    for r in ordered:
        loss = r["loss"] if isinstance(r["loss"], (int, float)) and math.isfinite(r["loss"]) else None
        out.append([r["method"], r["target"], significant(r["params_total"] / 1e6), significant(100 * r["accuracy"]),
                    significant(loss)])
    return out


def view(spec: str):
    """(status, figure, table) for a sweep folder."""
    from bsi.analysis.figures import results_figure

    rows = load_results(spec)
    methods = sorted({str(r["method"]) for r in rows})
    return f"{len(rows)} runs, methods: {', '.join(methods)}", results_figure(rows), table(rows)


def render(default_dir: str = "runs/sweep"):
    """Lay out the Compare tab."""
    import gradio as gr

    from bsi.analysis.figures import results_figure

    with gr.Row():
        folder = gr.Textbox(value=default_dir, label="Sweep folder (holds results.jsonl, written by `bsi sweep`)",
                            scale=4)
        load = gr.Button("Load", variant="primary", scale=1)
    status = gr.Markdown()
    figure = gr.Plot(results_figure([]), label="Accuracy and loss against size")
    frame = gr.Dataframe(headers=HEADERS, value=[], interactive=False, label="Runs",
                         datatype=["str", "number", "number", "number", "number"])

    def on_load(spec):
        try:
            return view(spec)
        except BSIError as err:
            return f"**Error:** {err}", gr.skip(), gr.skip()

    load.click(on_load, folder, [status, figure, frame])
