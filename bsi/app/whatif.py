"""What-if tab: cut the whole model at once from one round's scores, see the size and the predicted loss at once,
measure it in seconds, and see what eps does to one layer's curvature.

Two speeds, kept apart (:mod:`bsi.analysis.whatif`):

* **instant**, from the round records alone (the shipped run's too): moving
  the size slider, the rule, the ranking, the selection or the round
  redraws every layer's kept share, the whole model's size and the
  predicted loss rise (:func:`plan_view`);
* **seconds**, on the round's model: *Measure* removes the planned bases
  (coefficients set to zero, undone afterwards), scores the held-out
  problems and answers three of them beside the uncut round model and the
  dense model (:func:`measure`), then adds the run's own model after each
  round (the gradual schedule and its tuning) as the reference; the eps
  section estimates one layer's curvature at an eps beside the Fisher and
  the exact diagonal (:func:`eps_view`).

A saved run has no weights: *Prepare* rebuilds its round models by running
its compression stage again (the cached fine-tune, the cached conversion,
its rounds; no evaluation, no recovery), after saying how long that takes
(:func:`prepare_text`, from measured times). A run made in the Compress tab
is measurable at once. The job board is shared with Compress: one heavy job
per server at a time.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Iterator
from typing import Any

from bsi.app.format import number_text
from bsi.app.state import JobBoard, Session, Visitors, session_hash_of, with_request
from bsi.errors import BSIError
from bsi.units import duration

RULE_CHOICES = [("KeepRatio (the paper's mass rule, once)", "keep"), ("target share of the compressible layers", "target")]
RANK_CHOICES = [("bsi (importance)", "bsi"), ("|sigma|", "magnitude"), ("gradient term only", "gradient"),
                ("random", "random")]
SELECTION_CHOICES = [("auto", "auto"), ("across layers", "global"), ("per layer", "per-layer")]
PROBLEMS = 20
"""Held-out test problems a measurement scores (three of them answered): the 20 the ``tour`` preset evaluates.
On 2 cores the loss of 20 problems takes about 3 s on the dense model, the three answers about 1 s."""
ANSWERED = 3
EPS_LAYER_BATCHES = 2
"""Batches of four held-out problems the eps study estimates one layer's curvature on."""


# ------------------------------------------------------------------ which run
def explorer(session: Session) -> Any:
    """The session's :class:`~bsi.analysis.whatif.WhatIf` over the rounds it shows (made once per run)."""
    from bsi.pipeline.whatif import WhatIf

    if session.whatif is None and session.rounds:
        measurable = session.snapshots is not None and bool(session.held_out)
        dense = session.original.model if session.original is not None else None
        session.whatif = WhatIf(session.rounds, session.snapshots if measurable else None, session.held_out,
                                session.tokenizer, dense, answered=ANSWERED)
    return session.whatif


def round_choices(session: Session) -> tuple[list[int], int | None]:
    """The rounds to choose from and the one shown first (the first: a one-shot cut from the start)."""
    whatif = explorer(session)
    ids = whatif.round_ids if whatif is not None else []
    return ids, (ids[0] if ids else None)


def source_text(session: Session, saved: Any = None) -> str:
    """What the tab is showing, and whether *Measure* can run now or needs *Prepare* first (with its time)."""
    whatif = explorer(session)
    if whatif is None:
        return "No run yet: run a compression in the Compress tab (or open the app on a saved run)."
    label = "this session's run" if session.config is not None else saved_label(saved)
    if whatif.can_measure:
        return (f"Scores of {label}, {len(whatif.round_ids)} rounds; its round models are in memory: "
                "**Measure** answers in seconds.")
    wait = f" {prepare_text(saved)}" if saved is not None else ""
    return (f"Scores of {label}: moving the size redraws at once. Measuring needs the round models, which a saved "
            f"run does not keep: **Prepare** rebuilds them.{wait}")


def saved_label(saved: Any) -> str:
    """``the saved run of preset tour (data/runs/tour)``."""
    if saved is None:
        return "the saved run"
    from bsi.app.saved import shown_path

    preset = (saved.summary.get("config") or {}).get("preset") or "?"
    return f"the saved run of preset `{preset}` (`{shown_path(saved.folder)}`)"


def saved_config(saved: Any) -> Any:
    """The configuration of the saved run (from its summary), as the pipeline takes it."""
    from bsi.config import PipelineConfig

    try:
        return PipelineConfig.from_dict(saved.summary["config"])
    except (KeyError, TypeError, ValueError) as err:
        raise BSIError(f"the saved run's summary holds no usable configuration ({err}); run it again") from None


def prepare_text(saved: Any) -> str:
    """How long *Prepare* takes for ``saved``, from measured times, and which caches this machine already has."""
    from bsi.config import PRESET_COSTS
    from bsi.pipeline.runner import Pipeline

    try:
        config = saved_config(saved)
        pipeline = Pipeline(config)
    except BSIError as err:
        return f"(It cannot be prepared here: {err})"
    cost = PRESET_COSTS.get(config.preset or "")
    finetuned = (pipeline.finetune_folder / "config.json").is_file() or config.skip_finetune or not config.finetune.steps
    converted = pipeline.bases_cache.present
    parts = [f"the fine-tune {'is cached' if finetuned else 'runs once'}",
             f"the conversion {'is cached' if converted else 'runs once'}"]
    if cost is None or cost.prepare_seconds is None:
        return f"Its time was not measured for this preset; {', '.join(parts)}."
    seconds = cost.prepare_seconds
    extra = []
    if not finetuned and cost.uncached_seconds and cost.cached_seconds:
        seconds += cost.uncached_seconds - cost.cached_seconds
        extra.append("the fine-tune")
    if not converted and cost.cached_seconds and cost.warm_seconds:
        seconds += cost.cached_seconds - cost.warm_seconds
        extra.append("the conversion")
    return (f"Preparing takes about **{duration(seconds)}** on 2 CPU cores ({', '.join(parts)}; measured "
            f"{cost.measured}: {duration(cost.prepare_seconds)} with both cached"
            + (f", plus {' and '.join(extra)} this time" if extra else "") + ").")


# ------------------------------------------------------------------ instant
KEEP_RANGE = (0.8, 1.0, 0.001, 0.995)
"""The KeepRatio slider: (minimum, maximum, step, start). A basis' importance is concentrated in few bases, so the
mass rule applied once cuts deep already near 1: on the shipped tour run's first round 0.995 keeps 63% of the
compressible layers, 0.99 keeps 50%, 0.9 keeps 14%."""


def slider_settings(rule: str, target: float) -> dict[str, Any]:
    """The size slider's range, step, value and label for ``rule`` (``target``: the run's own size to start)."""
    if rule == "keep":
        low, high, step, start = KEEP_RANGE
        return {"minimum": low, "maximum": high, "step": step, "value": start,
                "label": "KeepRatio: each layer keeps the bases holding this share of its positive importance"}
    return {"minimum": 0.05, "maximum": 1.0, "step": 0.01, "value": round(target, 2),
            "label": "Target: the compressible layers' share of their dense size"}


def plan(session: Session, round_index: int | None, rule: str, value: float, rank_by: str, selection: str) -> Any:
    """The :class:`~bsi.analysis.whatif.WhatIfCut` the controls describe (None without a run)."""
    whatif = explorer(session)
    if whatif is None or round_index is None:
        return None
    return whatif.plan(int(round_index), rule, float(value), rank_by, selection)


def summary_text(cut: Any, scores: Any) -> str:
    """One paragraph: the size, the bases removed, the predicted loss rise, and what the rule needed to say."""
    from bsi.analysis.whatif import RANK_LABELS

    rule = f"KeepRatio {cut.value:g}" if cut.rule == "keep" else f"target {cut.value:.0%} of the compressible layers"
    text = (f"**{cut.compression:.2f}x smaller** whole model ({cut.params_total:,} of {cut.params_before:,} "
            f"parameters; compressible layers at {cut.compressible_ratio:.1%}) · {cut.removed:,} of "
            f"{sum(cut.ranks.values()):,} bases removed · **predicted loss rise {number_text(cut.predicted)}** "
            f"(the sum of the removed bases' importance) · {rule}, ranked by {RANK_LABELS[cut.rank_by]}, "
            f"selection {cut.selection}, from round {scores.round}'s scores.")
    for note in cut.notes:
        text += f"\n\n*Note:* {note}."
    return text


def plan_view(session: Session, round_index: int | None, rule: str, value: float, rank_by: str, selection: str):
    """(summary, kept-share figure) for the controls: instant, from the scores alone."""
    from bsi.analysis import figures

    try:
        cut = plan(session, round_index, rule, value, rank_by, selection)
    except BSIError as err:
        return f"**Error:** {err}", figures.whatif_ranks_figure(None)
    if cut is None:
        return source_text(session), figures.whatif_ranks_figure(None)
    return summary_text(cut, explorer(session).scores(int(round_index))), figures.whatif_ranks_figure(cut)


# ------------------------------------------------------------------ measured
def _short(text: str, limit: int = 140) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def answers_table(cut: Any, measurement: Any, round_index: int, dense: Any, uncut: Any = None) -> str:
    """The cut's loss, its rise (with its paired interval once the uncut model is measured), and the three
    answered problems beside the dense model's, marked (Markdown)."""
    from bsi.app.answers import final_number, mark

    columns = [("the cut", measurement)] + ([("dense, fine-tuned", dense)] if dense is not None else [])
    lines = ["| problem | task's answer | " + " | ".join(label for label, _ in columns) + " |",
             "|" + " --- |" * (2 + len(columns))]
    for i, answer in enumerate(measurement.answers):
        cells = [f"{mark(m.answers[i].correct)} {_short(m.answers[i].prediction, 90)}".replace("|", "/")
                 for _, m in columns]
        lines.append(f"| {_short(answer.question).replace('|', '/')} | {final_number(answer.reference)} | "
                     + " | ".join(cells) + " |")
    if uncut is not None:
        rise = measurement.loss_minus(uncut)
        rise_text = (f" · measured rise **{number_text(rise.estimate)}** [{number_text(rise.low)}, "
                     f"{number_text(rise.high)}] over round {round_index}'s model with every basis "
                     f"({number_text(uncut.loss)}; paired 95% interval over the problems"
                     + ("" if rise.excludes_zero else ": within noise") + f"), predicted {number_text(cut.predicted)}")
    else:
        rise_text = (f" · predicted rise {number_text(cut.predicted)} (the measured rise follows: round "
                     f"{round_index}'s model with every basis, once)")
    head = (f"Held-out loss on {measurement.problems} problems: **{number_text(measurement.loss)}** with the cut"
            + (f", {number_text(dense.loss)} for the dense model" if dense is not None else "") + rise_text
            + f" · {measurement.seconds:.1f} s.")
    return head + "\n\n" + "\n".join(lines)


def measure(session: Session, round_index: int | None, rule: str, value: float, rank_by: str,
            selection: str) -> Iterator[tuple[str, str | None, Any]]:
    """Measure the planned cut; yields (status, answers or None, curve figure or None) as results arrive.

    First the cut model's loss and answers (what the user waits for), then
    the round's model with every basis (once per round: the measured rise),
    then, the first time only, the dense model and the run's own model
    after each round (the references the curve draws).
    """
    from bsi.analysis import figures

    whatif = explorer(session)
    if whatif is None:
        yield "No run to measure: run a compression, or open the app on a saved run.", None, None
        return
    if not whatif.can_measure:
        yield "The round models are not in memory: press **Prepare** first (it says how long it takes).", None, None
        return
    try:
        cut = plan(session, round_index, rule, value, rank_by, selection)
    except BSIError as err:
        yield f"**Error:** {err}", None, None
        return
    assert round_index is not None
    r = int(round_index)
    start = time.perf_counter()
    yield f"Measuring: the cut on {len(whatif.examples)} held-out problems, three of them answered…", None, None
    measurement = whatif.measure_only(cut, r)
    dense = whatif._dense
    known = whatif.measured_uncut().get(r)
    yield f"Measured in {time.perf_counter() - start:.1f} s.", answers_table(cut, measurement, r, dense, known), None
    point = whatif.measure(cut, r, measurement)
    missing = [k for k in whatif.round_ids if k not in {p.round for p in whatif.path}]
    if dense is None and whatif.dense is not None:
        yield "Measured; now the dense model, once…", None, None
        dense = whatif.dense_measurement()
    text = answers_table(cut, measurement, r, dense, point.uncut)
    curve = figures.whatif_curve_figure(whatif.points, whatif.path, dense.loss if dense else None)
    yield f"Measured in {time.perf_counter() - start:.1f} s.", text, curve
    for done, k in enumerate(missing, start=1):
        yield f"Adding the run's own model after each round ({done} of {len(missing)}), once…", None, None
        whatif.path_point(k)
    if missing:
        curve = figures.whatif_curve_figure(whatif.points, whatif.path, dense.loss if dense else None)
        yield f"Measured in {time.perf_counter() - start:.1f} s (the run's own path included).", None, curve


# ------------------------------------------------------------------ prepare
def prepare(board: JobBoard, session: Session, saved: Any) -> Iterator[tuple[str, Any]]:
    """Rebuild the saved run's round models (its compression stage again); yields (progress HTML, rounds update).

    Runs the run's own configuration: load, the fine-tune (cached or trained
    once), the conversion (cached or made once) and its rounds, keeping
    every round's model before its cut (no evaluation, no recovery). Then
    measures the first round's uncut model, the dense model and the run's
    own model after each round. Takes the server's job board.
    """
    from bsi.analysis.ranking import RoundSnapshots
    from bsi.pipeline.runner import Pipeline
    from bsi.pipeline.whatif import WhatIf
    from bsi.reports import RoundReport, StageReport, StepReport

    if session.closed:
        yield progress_html(0, "This session has ended; reload the page."), None
        return
    whatif = explorer(session)
    if whatif is not None and whatif.can_measure:
        yield progress_html(1, "Prepared already: the round models are in memory."), None
        return
    if saved is None:
        yield progress_html(0, "Nothing to prepare: this tab shows no saved run."), None
        return
    try:
        config = saved_config(saved)
        pipeline = Pipeline(config)
    except BSIError as err:
        yield progress_html(0, f"Error: {err}"), None
        return
    if not board.try_acquire(f"preparing the what-if of {config.model}"):
        yield progress_html(0, board.busy_message()), None
        return
    session.running = True
    start = time.perf_counter()
    rounds_total = config.compress.rounds
    try:
        snapshots = RoundSnapshots()
        pipeline.before_cut = snapshots.capture
        yield progress_html(0.02, "Loading the model…"), None
        pipeline.load()
        for report in pipeline.finetune_stage():
            if isinstance(report, StepReport):
                yield progress_html(0.3 * report.step / max(report.total_steps, 1),
                                    f"Fine-tuning (once; cached afterwards): step {report.step} of "
                                    f"{report.total_steps}"), None
            if session.cancel_requested or session.closed:
                return
        dense = copy.deepcopy(pipeline.model).eval()
        done = 0
        for report in pipeline.compress():
            if session.cancel_requested or session.closed:
                return
            if isinstance(report, StepReport) and report.stage == "calibrate":
                yield progress_html(0.32, f"Converting (once; cached afterwards): calibration batch {report.step}"), None
            elif isinstance(report, StageReport) and report.stage == "convert" and report.cached:
                yield progress_html(0.35, "Converted from the cache."), None
            elif isinstance(report, StepReport):
                yield progress_html(0.35 + 0.45 * (report.step - 0.5) / max(report.total_steps, 1),
                                    f"Round {min(done + 1, rounds_total)} of {rounds_total}: step {report.step} of "
                                    f"{report.total_steps} ({report.stage})"), None
            elif isinstance(report, RoundReport):
                done = report.round
        examples = list(pipeline.task.test[:PROBLEMS]) if pipeline.task is not None else []
        whatif = WhatIf(pipeline.rounds, snapshots, examples, pipeline.tokenizer, dense, answered=ANSWERED)
        yield progress_html(0.82, "Measuring the dense model and round 1's model with every basis…"), None
        whatif.dense_measurement()
        for k, r in enumerate(whatif.round_ids, start=1):
            yield progress_html(0.85 + 0.15 * (k - 1) / len(whatif.round_ids),
                                f"Measuring the run's own model after round {r} ({k} of {len(whatif.round_ids)})…"), None
            whatif.path_point(r)
        session.whatif, session.tokenizer = whatif, pipeline.tokenizer
        ids = whatif.round_ids
        yield progress_html(1, f"Prepared in {time.perf_counter() - start:.0f} s: {len(ids)} round models in memory; "
                               "**Measure** now answers in seconds."), ids
    except BSIError as err:
        yield progress_html(0, f"Error: {err}"), None
    finally:
        session.running = False
        session.cancel_requested = False
        board.release()


def progress_html(fraction: float, text: str) -> str:
    """A progress bar and a line of text (HTML; ``fraction`` in [0, 1])."""
    fraction = min(max(float(fraction), 0.0), 1.0)
    import html

    body = html.escape(text).replace("**", "")
    return (f'<div id="whatif-progress-box"><progress value="{fraction:.3f}" max="1" style="width:100%"></progress>'
            f'<div>{body}</div></div>')


# ------------------------------------------------------------------ eps
def eps_study(session: Session, round_index: int, name: str, keep: int) -> Any:
    """The :class:`~bsi.analysis.whatif.EpsStudy` of one layer of one round (made once, kept in the session)."""
    import torch

    from bsi.data import BatchStream
    from bsi.pipeline.losses import answer_token_loss
    from bsi.pipeline.whatif import EpsStudy

    whatif = explorer(session)
    key = (round_index, name)
    if key not in session.eps_studies:
        model = whatif.model_at(round_index)
        stream = BatchStream(whatif.examples, whatif.tokenizer, batch_size=4, max_length=160, seed=0)
        batches = [next(stream) for _ in range(EPS_LAYER_BATCHES)]
        record = next(layer for layer in whatif.report(round_index).layers if layer.name == name)
        gradient = record.terms.get("gradient")
        gradient = gradient if gradient is not None else torch.zeros_like(record.sigma)
        session.eps_studies = {key: EpsStudy(model, name, batches, answer_token_loss, gradient, keep)}  # one at a time
    return session.eps_studies[key]


def eps_view(session: Session, round_index: int | None, name: str | None, log_eps: float, rule: str, value: float,
             rank_by: str, selection: str) -> Iterator[tuple[str, Any]]:
    """Hutchinson's curvature of one layer at ``10 ** log_eps``; yields (text, figure or None)."""
    from bsi.analysis import figures

    whatif = explorer(session)
    if whatif is None or not whatif.can_measure:
        yield "The round models are not in memory: press **Prepare** first.", None
        return
    if not name or round_index is None:
        yield "Choose a layer.", None
        return
    eps = float(10 ** float(log_eps))
    try:
        cut = plan(session, round_index, rule, value, rank_by, selection)
        keep = cut.kept[name] if cut is not None and name in cut.kept else 0
        fresh = (int(round_index), name) not in session.eps_studies
        if fresh:
            yield (f"Computing `{name}`'s Fisher and its exact diagonal at the 8 largest coefficients (once per layer "
                   "and round)…"), None
        study = eps_study(session, int(round_index), name, keep)
        study.keep = keep
        yield f"Estimating at eps {eps:.3g}…", None
        point = study.at(eps)
    except BSIError as err:
        yield f"**Error:** {err}", None
        return
    rule_eps = whatif.report(int(round_index)).eps
    text = (f"`{name}`, round {round_index}, eps **{eps:.3g}** ({point.seconds:.1f} s; the rule's eps for this "
            f"run: {rule_eps:.3g}): Hutchinson's error at the {study.top.numel()} largest coefficients "
            f"**{point.error:.2g}** against the exact diagonal (the Fisher's: {study.fisher_error:.2g}); "
            f"{int((point.curvature < 0).sum())} of {point.curvature.numel()} estimates negative. Ranked with it, "
            f"the layer's {keep} kept bases (this cut's count) differ from the Fisher's in **{point.kept_changed}**; "
            f"rank correlation of the two importances {point.spearman:+.3f}.")
    yield text, figures.eps_figure(study, eps, rule_eps if math.isfinite(rule_eps) else None)


# ------------------------------------------------------------------ layout
def render(session_state: Any, board: JobBoard, visitors: Visitors, saved: Any = None) -> dict[str, Any]:
    """Lay out the What-if tab; returns the components other tabs link to (``eps`` slider, ``round``)."""
    import gradio as gr

    from bsi.analysis import figures
    from bsi.app.state import Session as _Session

    opening = _Session()
    if saved is not None:
        saved.fill(opening)
    ids, first = round_choices(opening)
    target = opening.rounds[-1].compressible_ratio if opening.rounds else 0.7
    text, fig = plan_view(opening, first, "target", round(target, 2), "bsi", "auto")
    layers = [layer.name for layer in opening.rounds[0].layers] if opening.rounds else []
    rule_eps = opening.rounds[0].eps if opening.rounds else 1e-3
    gr.Markdown("**What if the whole model were cut at once?** One round's scores predict, for every basis, the loss "
                "rise its removal costs. Choose a size and a ranking: the kept share of every layer, the size and "
                "the predicted loss change at once. **Measure** then removes those bases from that round's model "
                "(no retraining) and answers held-out problems beside the dense model, and the run's own model at "
                "each round's size is drawn beside it: how far the prediction holds, and what the gradual rounds "
                "buy over a one-shot cut. (`docs/dashboard.md`, *What if*)")
    with gr.Row():
        source = gr.Markdown(source_text(opening, saved), elem_id="whatif-source")
        prepare_button = gr.Button("Prepare", elem_id="whatif-prepare", scale=0, min_width=120)
    progress = gr.HTML(elem_id="whatif-progress")
    with gr.Row():
        round_choice = gr.Dropdown(ids, value=first, label="Round (its model before its cut)",
                                   elem_id="whatif-round", interactive=True, scale=1)
        rule = gr.Radio(RULE_CHOICES, value="target", label="Size rule", elem_id="whatif-rule", scale=2)
        rank_by = gr.Radio(RANK_CHOICES, value="bsi", label="Rank by", elem_id="whatif-rank", scale=2)
        selection = gr.Radio(SELECTION_CHOICES, value="auto", label="Selection", elem_id="whatif-selection", scale=1,
                             info="auto: across layers for loss-unit rankings, per layer otherwise")
    value = gr.Slider(elem_id="whatif-value", **slider_settings("target", target))
    summary = gr.Markdown(text, elem_id="whatif-summary")
    ranks = gr.Plot(fig, label="Kept bases per layer", elem_id="whatif-ranks")
    measure_button = gr.Button("Measure", variant="primary", elem_id="whatif-measure")
    status = gr.Markdown(elem_id="whatif-status")
    answers = gr.Markdown(elem_id="whatif-answers")
    curve = gr.Plot(figures.whatif_curve_figure([], []), label="Predicted and measured", elem_id="whatif-curve")
    gr.Markdown("**eps, one layer.** The paper estimates the curvature by symmetric perturbations of size eps; bsi's "
                "default, the Fisher, needs none. Choose a layer and an eps (about ten seconds a value; the first "
                "value of a layer also computes its Fisher and exact diagonal): Hutchinson's estimate, its error "
                "against the exact diagonal at the largest coefficients, and how much the layer's kept set moves.")
    with gr.Row():
        layer = gr.Dropdown(layers, value=layers[-1] if layers else None, label="Layer", elem_id="whatif-layer",
                            interactive=True)
        eps = gr.Slider(-7, -0.1, value=round(math.log10(rule_eps), 1) if rule_eps > 0 else -3, step=0.1,
                        label="eps (log10)", elem_id="whatif-eps")
        eps_button = gr.Button("Estimate at this eps", elem_id="whatif-eps-button", scale=0, min_width=160)
    eps_text = gr.Markdown(elem_id="whatif-eps-text")
    eps_plot = gr.Plot(figures.eps_figure(None), label="Curvature of one layer", elem_id="whatif-eps-plot")

    controls = [round_choice, rule, value, rank_by, selection]

    def on_change(session, *values):
        return plan_view(session, *values)

    for control in controls:
        control.change(on_change, [session_state, *controls], [summary, ranks], concurrency_limit=None,
                       trigger_mode="always_last")

    def on_rule(choice):
        return gr.update(**slider_settings(choice, target))

    rule.change(on_rule, rule, value, concurrency_limit=None)

    @with_request
    def on_measure(request, session, *values):
        visitors.register(session_hash_of(request), session)
        for text, table, figure in measure(session, *values):
            yield text, gr.skip() if table is None else table, gr.skip() if figure is None else figure

    # show_progress "minimal": the handlers stream their own status (see bsi.app.compress)
    measure_button.click(on_measure, [session_state, *controls], [status, answers, curve], concurrency_limit=1,
                         show_progress="minimal")

    @with_request
    def on_prepare(request, session):
        visitors.register(session_hash_of(request), session)
        for html, ids in prepare(board, session, saved):
            if ids is None:
                yield html, gr.skip(), gr.skip()
            else:
                yield html, gr.update(choices=ids, value=ids[0]), source_text(session, saved)

    prepare_button.click(on_prepare, session_state, [progress, round_choice, source], concurrency_limit=None,
                         show_progress="minimal")

    def on_eps(session, round_index, name, log_eps, *values):
        yield from eps_view(session, round_index, name, log_eps, *values)

    eps_button.click(on_eps, [session_state, round_choice, layer, eps, rule, value, rank_by, selection],
                     [eps_text, eps_plot], concurrency_limit=1, show_progress="minimal")

    def on_open(session):  # a run made (or the saved run shown) since the page was drawn
        ids, first = round_choices(session)
        names = [layer.name for layer in session.rounds[0].layers] if session.rounds else []
        return (source_text(session, saved), gr.update(choices=ids, value=first),
                gr.update(choices=names, value=names[-1] if names else None))

    return {"eps": eps, "round": round_choice, "refresh": (on_open, [session_state], [source, round_choice, layer]),
            "summary": summary, "ranks": ranks, "controls": controls}


__all__ = ["explorer", "plan", "plan_view", "measure", "prepare", "prepare_text", "eps_view", "render",
           "source_text", "summary_text", "answers_table", "progress_html"]
