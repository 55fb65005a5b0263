"""Inspect tab: every basis of one layer in one round, as numbers.

For the chosen round and layer, :func:`basis_rows` lays out what the engine
saw and decided (a :class:`~bsi.reports.LayerRound`), reading the score's
own terms (``LayerRound.terms``) instead of re-deriving them::

    gradient term  = -sigma_i * g_i           (first-order Taylor term; scores bsi, bsi-grad)
    curvature term = 1/2 * sigma_i^2 * h_i    (second-order term; score bsi, candidate pool only)
    magnitude term = |sigma_i|                (score basel)
    importance     = the sum of the score's terms

The measured gradient ``g`` and curvature ``h`` are shown next to them when
the score used them. The Fisher curvature (bsi's default) comes for every
basis; Hutchinson's probes measure only the candidate pool, so under it (and
in runs recorded before the Fisher covered every basis, whose round says
``curvature_scope`` "pool") a basis outside the pool shows a blank curvature
(not measured), not 0. Each
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


def basis_rows(layer: LayerRound, curvature_everywhere: bool = False) -> list[dict]:
    """One record per active basis of ``layer`` at the start of its round (see the module docstring).

    ``curvature_everywhere``: the round measured the curvature of every basis
    (its ``curvature_scope`` is "all"); else it is blank outside the pool.
    """
    pool, pruned = set(layer.pool.tolist()), set(layer.pruned.tolist())
    vectors = {"sigma": layer.sigma, "gradient": layer.grad, "curvature": layer.hessian,
               **{f"{term} term": values for term, values in layer.terms.items()}, "importance": layer.importance}
    rows = []
    for i in range(layer.sigma.numel()):
        row = {"basis": int(layer.basis_ids[i])}
        for name in columns(layer)[1:-1]:
            measured_here = curvature_everywhere or i in pool or not name.startswith("curvature")
            row[name] = float(vectors[name][i]) if measured_here else None
        row["status"] = "pruned" if i in pruned else ("pool (kept)" if i in pool else "protected")
        rows.append(row)
    return rows


def find_round(rounds: Sequence[RoundReport], round_index: int | None) -> RoundReport | None:
    """Round ``round_index`` (1-based) of ``rounds``, or None."""
    return next((report for report in rounds if report.round == round_index), None)


def find_layer(rounds: Sequence[RoundReport], round_index: int | None, name: str | None) -> LayerRound | None:
    """The record of layer ``name`` in round ``round_index`` (1-based), or None."""
    report = find_round(rounds, round_index)
    return next((layer for layer in report.layers if layer.name == name), None) if report is not None else None


def gradient_test_text(report: RoundReport | None) -> str:
    """What the round's score kept of the gradient term: the share of the pool that passed the significance test.

    bsi keeps a basis' first-order term only where it stands out of its
    batch-to-batch noise (``gradient_z``); where it does not, the basis is
    scored by its curvature term alone. A share near 0 means the round
    ranked by curvature only.
    """
    if report is None:
        return ""
    share = report.significant_gradients
    if share != share:  # NaN: no test ran
        return f"Round {report.round}: no gradient test ({report.score or 'this'} score keeps its terms as they are)."
    return (f"Round {report.round}: the gradient term passed the significance test for {100 * share:.1f}% of the "
            f"candidate bases; the others are scored by their curvature term alone.")


def layer_summary(layer: LayerRound | None, report: RoundReport | None = None) -> str:
    """A one-line description above the table (and the round's gradient test, given its report)."""
    if layer is None:
        return "Run a compression (Compress tab), then choose a round and a layer."
    test = gradient_test_text(report)
    return (f"`{layer.name}`: {layer.rank_before} bases at the start of the round, candidate pool "
            f"{layer.pool.numel()}, pruned {layer.pruned.numel()}, {layer.rank_after} left "
            f"({layer.params_after:,} parameters after the round)" + (f". {test}" if test else ""))


def rows_to_csv(rows: Sequence[dict]) -> str:
    """The rows as CSV text with a header line (full precision; blank where not measured)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]) if rows else [], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def write_csv(rows: Sequence[dict], round_index: int, name: str, folder: str | Path) -> Path:
    """Write the rows to a CSV file in a new subfolder of ``folder`` and return its path.

    Each call gets its own subfolder, so two visitors looking at the same layer
    of different runs never overwrite each other's file, and the download keeps
    a readable name (``round4-model_layers_0_self_attn_q_proj.csv``).
    """
    own = Path(tempfile.mkdtemp(prefix="csv-", dir=folder))
    path = own / f"round{round_index}-{name.replace('.', '_')}.csv"
    path.write_text(rows_to_csv(rows), encoding="utf-8")
    return path


def table(rows: Sequence[dict]) -> dict:
    """The rows as ``gr.Dataframe`` takes them: headers and lists, numbers to four significant figures."""
    headers = list(rows[0]) if rows else ["basis", "sigma", "importance", "status"]
    data = [[significant(v) if isinstance(v, float) else v for v in row.values()] for row in rows]
    return {"headers": headers, "data": data}


def view(rounds: Sequence[RoundReport], round_index: int | None, name: str | None, folder: str | Path):
    """(summary, figure, table, csv path or None) for the chosen round and layer; the CSV goes under ``folder``."""
    from bsi.analysis import figures

    layer = find_layer(rounds, round_index, name)
    report = find_round(rounds, round_index)
    everywhere = report is not None and report.curvature_scope == "all"
    rows = basis_rows(layer, curvature_everywhere=everywhere) if layer is not None else []
    path = str(write_csv(rows, int(round_index), str(name), folder)) if layer is not None else None
    return layer_summary(layer, report), figures.basis_figure(rows), table(rows), path


MEASURED = 16
"""Candidates of the chosen layer measured one by one (spread along the bsi ranking)."""


def measure(session, round_index: int | None, name: str | None, count: int = MEASURED):
    """Remove each of ``count`` candidates of the chosen layer alone, in that round's model; yields (status, figure).

    The model is the run's at the end of the round, before its cut (the
    session's :class:`~bsi.analysis.ranking.RoundSnapshots`); the loss is the
    answer-token loss on held-out test problems. Every ranking's predicted
    value (``bsi``'s importance, ``-sigma g``, ``|sigma|``, random) is set
    against the measured change, with Spearman's correlation in the legend.
    """
    import torch

    from bsi.analysis import figures
    from bsi.analysis.ranking import rankings, single_removals, spearman, spread_sample
    from bsi.method.surgery import basis_layers
    from bsi.pipeline.evaluate import dataset_loss

    layer = find_layer(session.rounds, round_index, name)
    if layer is None:
        yield "Run a compression (Compress tab), then choose a round and a layer.", None
        return
    if session.snapshots is None or round_index not in session.snapshots.rounds or not session.held_out:
        yield ("This run kept no model of its rounds (a run from before this feature, a resumed run, or a model over "
               "the size limit): run a compression in this tab, then measure."), None
        return
    if layer.pool.numel() == 0:
        yield f"`{name}` had no candidates in round {round_index}: nothing to measure.", None
        return
    model = session.snapshots.model_at(int(round_index))
    layers = basis_layers(model)
    examples = session.held_out

    def loss() -> float:
        return dataset_loss(model, session.tokenizer, examples, batch_size=8)

    values = rankings(layer, torch.Generator().manual_seed(0))
    order = layer.pool[torch.argsort(layer.importance[layer.pool], stable=True)]
    chosen = spread_sample(order, count).tolist()
    base = loss()
    measured: list[float] = []
    for done, (_, delta) in enumerate(single_removals(layers, name, chosen, loss, base), start=1):
        measured.append(delta)
        yield f"Measuring: {done} of {len(chosen)} candidates removed one at a time (held-out loss {base:.4g})…", None
    truth = torch.tensor(measured)
    points = {r: ([float(v[i]) for i in chosen], measured, spearman(v[chosen], truth)) for r, v in values.items()}
    best = max(points, key=lambda r: points[r][2])
    text = (f"`{name}`, round {round_index}: {len(chosen)} of {layer.pool.numel()} candidates removed one at a time on "
            f"{len(examples)} held-out problems (loss {base:.4g} before). Spearman's correlation of predicted and "
            f"measured loss change: " + ", ".join(f"{r} {c:+.2f}" for r, (_, _, c) in points.items()) +
            f"; the closest ranking here is {best}. One round, one layer: a view, not a finding "
            "(bench/ranking.py measures whole rounds).")
    yield text, figures.ranking_figure(points)


def opening(rounds: Sequence[RoundReport]) -> tuple[list[int], int | None, list[str], str | None]:
    """(rounds, round shown, layers, layer shown) before any click: the last round's first layer of ``rounds``."""
    if not rounds:
        return [], None, [], None
    layers = [layer.name for layer in rounds[0].layers]
    return [r.round for r in rounds], rounds[-1].round, layers, layers[0]


def render(session_state, csv_folder: str | Path, rounds: Sequence[RoundReport] = ()):
    """Lay out the Inspect tab; returns its (round, layer) dropdowns for the Compress job to fill.

    ``rounds`` (a saved run's) fill the tab before any click. The CSV
    downloads are written under ``csv_folder``, which the caller owns and
    removes (:func:`bsi.app.layout.build_app` removes it with the app).
    """
    import gradio as gr

    gr.Markdown("Every basis of one layer in one pruning round: its learned coefficient sigma, what the score "
                "measured (the gradient g; the curvature h: the Fisher covers every basis, Hutchinson's probes "
                "only the candidate pool, blank outside it), the score's terms (`-sigma*g`, `0.5*sigma^2*h`, or `|sigma|` for basel) and their "
                "sum, the importance. *protected* bases were outside the candidate pool; *pruned* ones were "
                "removed. Click a column header to sort; the CSV has full precision. The scores are explained in "
                "`docs/method.md` (section 3).")
    round_ids, first_round, layer_names, first_layer = opening(rounds)
    text, fig, values, path = view(rounds, first_round, first_layer, csv_folder)
    with gr.Row():
        round_choice = gr.Dropdown(round_ids, value=first_round, label="Round", elem_id="inspect-round",
                                   interactive=True)
        layer_choice = gr.Dropdown(layer_names, value=first_layer, label="Layer", elem_id="inspect-layer",
                                   interactive=True)
        download = gr.DownloadButton("Download CSV", value=path, elem_id="inspect-csv")
    summary = gr.Markdown(text, elem_id="inspect-summary")
    figure = gr.Plot(fig, label="Bases", elem_id="inspect-figure")
    frame = gr.Dataframe(value=values, interactive=False, label="Bases (sortable)", elem_id="inspect-table",
                         max_height=420, wrap=True,
                         datatype=["str" if header == "status" else "number" for header in values["headers"]])

    def on_choose(session, round_index, name):
        text, fig, values, path = view(session.rounds, round_index, name, csv_folder)
        datatype = ["str" if header == "status" else "number" for header in values["headers"]]
        return text, fig, gr.update(value=values, datatype=datatype), path

    for dropdown in (round_choice, layer_choice):
        dropdown.change(on_choose, [session_state, round_choice, layer_choice], [summary, figure, frame, download])

    gr.Markdown("**Is the ranking right?** Remove a few of this layer's candidates one at a time from the model of "
                "that round (before its cut) and measure the loss change on held-out problems: each ranking's "
                "prediction against the measurement.")
    with gr.Row():
        measure_button = gr.Button("Measure candidates", elem_id="inspect-measure")
    measure_status = gr.Markdown(elem_id="inspect-measure-status")
    measure_figure = gr.Plot(label="Predicted against measured")

    def on_measure(session, round_index, name):
        for text, fig in measure(session, round_index, name):
            yield text, gr.skip() if fig is None else fig

    measure_button.click(on_measure, [session_state, round_choice, layer_choice], [measure_status, measure_figure])
    return round_choice, layer_choice
