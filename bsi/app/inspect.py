"""Inspect tab: every basis of one layer in one round, as numbers.

For the chosen round and layer, :func:`basis_rows` lays out what the engine
saw and decided (a :class:`~bsi.reports.LayerRound`), reading the score's
own terms (``LayerRound.terms``) instead of re-deriving them::

    gradient term  = -sigma_i * g_i           (first-order Taylor term; scores bsi, bsi-grad)
    curvature term = 1/2 * sigma_i^2 * h_i    (second-order term; score bsi, candidate pool only)
    magnitude term = |sigma_i|                (score basel)
    importance     = the sum of the score's terms

The measured gradient ``g`` and curvature ``h`` are shown next to them when
the score used them. The curvature is estimated only over the candidate pool,
so a basis outside it shows a blank curvature (not measured), not 0. Each
basis' status: ``protected`` (outside the candidate pool, so it could not be
pruned this round), ``pool (kept)`` or ``pruned``. The same rows feed the
sortable table (numbers to four significant figures), the figure and the
CSV export (full precision).
"""

from __future__ import annotations

import csv
import io
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bsi.app.format import significant
from bsi.reports import LayerRound, RoundReport

STATUSES = ("protected", "pool (kept)", "pruned")


def columns(layer: LayerRound) -> list[str]:
    """The columns of ``layer``'s rows: what its score measured and added up."""
    measured = (["gradient"] if layer.grad is not None else []) + (["curvature"] if layer.hessian is not None else [])
    return ["basis", "sigma", *measured, *(f"{term} term" for term in layer.terms), "importance", "status"]


def basis_rows(layer: LayerRound) -> list[dict]:
    """One record per active basis of ``layer`` at the start of its round (see the module docstring)."""
    pool, pruned = set(layer.pool.tolist()), set(layer.pruned.tolist())
    vectors = {"sigma": layer.sigma, "gradient": layer.grad, "curvature": layer.hessian,
               **{f"{term} term": values for term, values in layer.terms.items()}, "importance": layer.importance}
    rows = []
    for i in range(layer.sigma.numel()):
        row = {"basis": int(layer.basis_ids[i])}
        for name in columns(layer)[1:-1]:
            measured_here = i in pool or not name.startswith("curvature")
            row[name] = float(vectors[name][i]) if measured_here else None
        row["status"] = "pruned" if i in pruned else ("pool (kept)" if i in pool else "protected")
        rows.append(row)
    return rows


def find_layer(rounds: Sequence[RoundReport], round_index: int | None, name: str | None) -> LayerRound | None:
    """The record of layer ``name`` in round ``round_index`` (1-based), or None."""
    for report in rounds:
        if report.round == round_index:
            for layer in report.layers:
                if layer.name == name:
                    return layer
    return None


def layer_summary(layer: LayerRound | None) -> str:
    """A one-line description above the table."""
    if layer is None:
        return "Run a compression (Compress tab), then choose a round and a layer."
    return (f"`{layer.name}`: {layer.rank_before} bases at the start of the round, candidate pool "
            f"{layer.pool.numel()}, pruned {layer.pruned.numel()}, {layer.rank_after} left "
            f"({layer.params_after:,} parameters after the round)")


def rows_to_csv(rows: Sequence[dict]) -> str:
    """The rows as CSV text with a header line (full precision; blank where not measured)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]) if rows else [], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def write_csv(rows: Sequence[dict], round_index: int, name: str, folder: str | Path | None = None) -> Path:
    """Write the rows to a new CSV file (in a fresh temporary folder by default) and return its path."""
    folder = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="bsi-inspect-"))
    path = folder / f"round{round_index}-{name.replace('.', '_')}.csv"
    path.write_text(rows_to_csv(rows), encoding="utf-8")
    return path


def table(rows: Sequence[dict]) -> dict:
    """The rows as ``gr.Dataframe`` takes them: headers and lists, numbers to four significant figures."""
    headers = list(rows[0]) if rows else ["basis", "sigma", "importance", "status"]
    data = [[significant(v) if isinstance(v, float) else v for v in row.values()] for row in rows]
    return {"headers": headers, "data": data}


def view(rounds: Sequence[RoundReport], round_index: int | None, name: str | None):
    """(summary, figure, table, csv path or None) for the chosen round and layer."""
    from bsi.analysis import figures

    layer = find_layer(rounds, round_index, name)
    rows = basis_rows(layer) if layer is not None else []
    path = str(write_csv(rows, int(round_index), str(name))) if layer is not None else None
    return layer_summary(layer), figures.basis_figure(rows), table(rows), path


def render(session_state):
    """Lay out the Inspect tab; returns its (round, layer) dropdowns for the Compress job to fill."""
    import gradio as gr

    gr.Markdown("Every basis of one layer in one pruning round: its learned coefficient sigma, what the score "
                "measured (the gradient g; the curvature h, estimated over the candidate pool only, so blank "
                "outside it), the score's terms (`-sigma*g`, `0.5*sigma^2*h`, or `|sigma|` for basel) and their "
                "sum, the importance. *protected* bases were outside the candidate pool; *pruned* ones were "
                "removed. Click a column header to sort; the CSV has full precision. The scores are explained in "
                "`docs/method.md` (section 3).")
    with gr.Row():
        round_choice = gr.Dropdown([], label="Round", elem_id="inspect-round", interactive=True)
        layer_choice = gr.Dropdown([], label="Layer", elem_id="inspect-layer", interactive=True)
        download = gr.DownloadButton("Download CSV", value=None, elem_id="inspect-csv")
    summary = gr.Markdown(layer_summary(None), elem_id="inspect-summary")
    figure = gr.Plot(label="Bases")
    frame = gr.Dataframe(value=table([]), interactive=False, label="Bases (sortable)", elem_id="inspect-table",
                         max_height=420, wrap=True)

    def on_choose(session, round_index, name):
        text, fig, values, path = view(session.rounds, round_index, name)
        datatype = ["str" if header == "status" else "number" for header in values["headers"]]
        return text, fig, gr.update(value=values, datatype=datatype), path

    for dropdown in (round_choice, layer_choice):
        dropdown.change(on_choose, [session_state, round_choice, layer_choice], [summary, figure, frame, download])
    return round_choice, layer_choice
