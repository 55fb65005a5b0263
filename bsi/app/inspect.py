"""Inspect tab: every basis of one layer in one round, as numbers.

For the chosen round and layer, :func:`basis_rows` lays out what the engine
saw and decided (a :class:`~bsi.reports.LayerRound`)::

    grad_term    = -sigma_i * g_i            (first-order Taylor term)
    hessian_term = 1/2 * sigma_i^2 * h_i     (second-order term; 0 outside the pool)
    importance   = the score the run used (for ``bsi``: grad_term + hessian_term)

and each basis' status: ``protected`` (outside the candidate pool, so it could
not be pruned this round), ``pool (kept)`` or ``pruned``. The same rows feed
the sortable table, the figure and the CSV export.
"""

from __future__ import annotations

import csv
import io
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bsi.reports import LayerRound, RoundReport

COLUMNS = ["basis_id", "position", "sigma", "grad", "hessian", "grad_term", "hessian_term", "importance", "status"]


def basis_rows(layer: LayerRound) -> list[dict]:
    """One record per active basis of ``layer`` at the start of its round (see the module docstring)."""
    sigma, grad, hessian = layer.sigma.float(), layer.grad.float(), layer.hessian.float()
    grad_term = -sigma * grad  # (r,)
    hessian_term = 0.5 * sigma.square() * hessian  # (r,)
    pool, pruned = set(layer.pool.tolist()), set(layer.pruned.tolist())
    rows = []
    for i in range(sigma.numel()):
        status = "pruned" if i in pruned else ("pool (kept)" if i in pool else "protected")
        rows.append({
            "basis_id": int(layer.basis_ids[i]), "position": i, "sigma": float(sigma[i]), "grad": float(grad[i]),
            "hessian": float(hessian[i]), "grad_term": float(grad_term[i]), "hessian_term": float(hessian_term[i]),
            "importance": float(layer.importance[i]), "status": status,
        })
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
    """The rows as CSV text with a header line."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def write_csv(rows: Sequence[dict], round_index: int, name: str, folder: str | Path | None = None) -> Path:
    """Write the rows to a new CSV file (in a fresh temporary folder by default) and return its path."""
    folder = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="bsi-inspect-"))
    path = folder / f"round{round_index}-{name.replace('.', '_')}.csv"
    path.write_text(rows_to_csv(rows), encoding="utf-8")
    return path


def table(rows: Sequence[dict]) -> list[list]:
    """The rows as a list of lists in :data:`COLUMNS` order (what ``gr.Dataframe`` takes)."""
    return [[row[c] for c in COLUMNS] for row in rows]


def view(rounds: Sequence[RoundReport], round_index: int | None, name: str | None):
    """(summary, figure, table rows, csv path or None) for the chosen round and layer."""
    from bsi.app import plots

    layer = find_layer(rounds, round_index, name)
    rows = basis_rows(layer) if layer is not None else []
    path = str(write_csv(rows, int(round_index), str(name))) if layer is not None else None
    return layer_summary(layer), plots.basis_figure(rows), table(rows), path


def render(session_state):
    """Lay out the Inspect tab; returns its (round, layer) dropdowns for the Compress job to fill."""
    import gradio as gr

    gr.Markdown("Every basis of one layer in one pruning round: its learned coefficient sigma, the gradient "
                "term `-sigma*g`, the Hessian term `0.5*sigma^2*h` and the importance the run scored it by. "
                "*protected* bases were outside the candidate pool; *pruned* ones were removed. Click a column "
                "header to sort.")
    with gr.Row():
        round_choice = gr.Dropdown([], label="Round", elem_id="inspect-round", interactive=True)
        layer_choice = gr.Dropdown([], label="Layer", elem_id="inspect-layer", interactive=True)
        download = gr.DownloadButton("Download CSV", value=None, elem_id="inspect-csv")
    summary = gr.Markdown(layer_summary(None), elem_id="inspect-summary")
    figure = gr.Plot(label="Bases")
    frame = gr.Dataframe(headers=COLUMNS, value=[], interactive=False, label="Bases (sortable)",
                         elem_id="inspect-table", max_height=420)

    def on_choose(session, round_index, name):
        text, fig, rows, path = view(session.rounds, round_index, name)
        return text, fig, rows, path

    for dropdown in (round_choice, layer_choice):
        dropdown.change(on_choose, [session_state, round_choice, layer_choice], [summary, figure, frame, download])
    return round_choice, layer_choice
