"""The Compress tab's streaming job: the pipeline's reports turned into views.

:func:`run_job` drives :meth:`bsi.pipeline.runner.Pipeline.run` (or, for
Resume, :meth:`~bsi.pipeline.runner.Pipeline.resume` of the run checkpointed
in the form's folder) and yields :class:`JobView` snapshots: status line,
loss curve, parameters per round, rank heatmap, log. It

* validates the whole form *before* taking the server's job board, so a typo
  never blocks anybody, and answers a bad field with one message in the
  status line (the figures stay as they were);
* takes the :class:`~bsi.app.state.JobBoard` without waiting; when another
  visitor's job holds it, yields a single "busy" view and stops;
* checks the session's cancel flag after every report (every optimisation
  step), so Cancel stops the run within one step; the pipeline generator is
  closed and its model dropped, and the board freed, whatever happens
  (including ``GeneratorExit``: Gradio closes the generator when its client
  cancels the event or drops the stream, and the visitor leaving raises the
  cancel flag, see :class:`~bsi.app.state.Visitors`);
* after a Cancel, says where the last round's checkpoint is (when the run
  saves to a folder) so that Resume continues from it;
* throttles views to one per ``min_interval`` seconds between steps (round,
  stage and evaluation reports always produce one).
"""

from __future__ import annotations

import copy
import gc
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bsi.analysis import figures
from bsi.app.form import LABELS, Form, build_config, checkpoint_progress, output_folder
from bsi.app.format import in_app_words, number_text
from bsi.app.state import JobBoard, LoadedModel, Session, Visitors, session_hash_of, with_request
from bsi.config import PipelineConfig
from bsi.errors import BSIError
from bsi.method.scores import fraction_bits
from bsi.method.surgery import compressible_parameters, model_parameters
from bsi.pipeline.runner import Pipeline
from bsi.reports import DoneReport, EvalReport, RoundReport, StageReport, StepReport
from bsi.results import RunSummary

LOG_LINES = 300
"""Log lines kept in view (newest first)."""


@dataclass
class JobView:
    """One snapshot of the job, as the tab shows it; figures None: leave them as they are."""

    status: str
    loss: Any = None
    params: Any = None
    ranks: Any = None
    log: str | None = None
    rounds: list[int] | None = None
    layers: list[str] | None = None
    eps_text: str | None = None


def snapshot(session: Session, status: str, eps_text: str | None = None, rounds_changed: bool = True) -> JobView:
    """Build the figures and the log from the session's records.

    ``rounds_changed`` False (a step inside a round): only the status, the
    loss curve and the log are new; the parameter plot and the rank heatmap
    (210 layers on the embedded model) are left as they are, which spares
    the server and the browser drawing them again every second on the same
    two cores as the run.
    """
    layers = [layer.name for layer in session.rounds[0].layers] if session.rounds else []
    return JobView(
        status=status,
        loss=figures.loss_figure(session.steps),
        params=figures.params_figure(session.rounds, session.params_before, session.compressible_before)
        if rounds_changed else None,
        ranks=figures.rank_heatmap(session.rounds) if rounds_changed else None,
        log="\n".join(reversed(session.log[-LOG_LINES:])),
        rounds=[r.round for r in session.rounds],
        layers=layers,
        eps_text=eps_text,
    )


def message(session: Session, status: str) -> JobView:
    """A view that changes only the status line (and the log, if the session has one)."""
    return JobView(status=status, log="\n".join(reversed(session.log[-LOG_LINES:])) if session.log else None)


def _status(phase: str, session: Session, config: PipelineConfig, extra: str = "") -> str:
    done = session.rounds[-1].round if session.rounds else 0
    parts = [f"**{phase}**", f"model `{config.model}`", f"round {done}/{config.compress.rounds}"]
    if session.steps:
        stage, _, loss = session.steps[-1]
        parts.append(f"last step: {stage}, loss {number_text(loss)}")
    return " · ".join(parts) + (f" · {extra}" if extra else "")


def describe(report: Any) -> str | None:
    """A log line for a report (None for the steps that are not logged)."""
    if isinstance(report, StageReport):
        cached = " (cached)" if report.cached else ""
        return f"{report.stage} {report.event}{cached}" + (f": {report.detail}" if report.detail else "")
    if isinstance(report, RoundReport):
        return (f"round {report.round}/{report.total_rounds}: pruned {report.removed} bases, "
                f"{report.params_total:,} params ({report.compressible_ratio:.1%} of the compressible layers), "
                f"mean loss {number_text(report.mean_loss)}, eps {number_text(report.eps)}, {report.elapsed:.1f} s")
    if isinstance(report, EvalReport) and report.perplexity is not None:
        return (f"evaluate {report.when}: perplexity {number_text(report.perplexity)}, mean next-token loss "
                f"{number_text(report.loss)} on {report.examples} held-out windows, {report.params_total:,} params "
                f"({report.seconds:.1f} s)")
    if isinstance(report, EvalReport):
        return (f"evaluate {report.when}: accuracy {report.accuracy:.1%}, loss {number_text(report.loss)} on "
                f"{report.examples} examples, {report.params_total:,} params ({report.seconds:.1f} s)")
    if isinstance(report, StepReport) and (report.step == 1 or report.step == report.total_steps or report.step % 10 == 0):
        return (f"{report.stage} step {report.step}/{report.total_steps}: loss {number_text(report.loss)} "
                f"({report.elapsed:.1f} s)")
    return None


def _done_status(summary: dict) -> str:
    result = RunSummary.from_dict(summary)
    before, after = result.metrics_before, result.metrics_after
    if result.perplexity and before and after:
        protocol = result.perplexity.get("protocol") or {}
        acc = (f" · perplexity {number_text(before.perplexity)} → {number_text(after.perplexity)} on "
               f"{protocol.get('source', result.data)} ({protocol.get('description', '')})")
    else:
        acc = f" · accuracy {before.accuracy:.1%} → {after.accuracy:.1%}" if before and after else ""
    return (f"**Done** in {result.seconds:.0f} s · params {result.params_before:,} → "
            f"{result.params_after:,} ({number_text(result.compression_ratio)}x; compressible layers at "
            f"{result.compressible_ratio:.1%}){acc} · chat with it in the Chat tab")


def _cancelled_status(pipeline: Pipeline) -> str:
    progress = checkpoint_progress(pipeline.out_dir) if pipeline.out_dir is not None else None
    if progress is not None and progress[0]:
        return (f"**Cancelled** after round {progress[0]} of {progress[1]}. The checkpoint in "
                f"`{pipeline.out_dir}` keeps the finished rounds: press **Resume** to continue from it.")
    return "**Cancelled.** The run stopped and its memory was freed; press Start to run again."


def prepare(form: Form, resume: bool = False) -> Pipeline:
    """The pipeline for ``form`` (a new run, or the interrupted one in its folder), checked before any work."""
    if resume:
        folder = output_folder(form.out_dir, resume=True)
        return Pipeline.resume(folder)
    config = build_config(form)
    return Pipeline(config, out_dir=output_folder(form.out_dir))


def run_job(board: JobBoard, session: Session, form: Form, min_interval: float = 1.0,
            resume: bool = False) -> Iterator[JobView]:
    """Run (or resume) the pipeline for ``form``, yielding views; see the module docstring for the guarantees."""
    if session.closed:
        yield message(session, "**Closed:** this session has ended; reload the page to start again.")
        return
    if session.running:
        yield message(session, "**Already running** in this tab: press Cancel first.")
        return
    try:
        pipeline = prepare(form, resume)
    except BSIError as err:
        yield message(session, f"**Error:** {in_app_words(str(err), LABELS)}")
        return
    config = pipeline.config
    if not board.try_acquire(f"{config.model}, preset {config.preset}"):
        yield message(session, f"**{board.busy_message()}**")
        return
    session.reset_run()
    session.running, session.config = True, config
    try:
        yield from _drive(pipeline, session, config, min_interval)
    except BSIError as err:
        session.add_log(f"error: {err}")
        yield snapshot(session, f"**Error:** {in_app_words(str(err), LABELS)}")
    except Exception as err:  # a bug or the machine (out of memory): say so here, details in the server log
        logging.getLogger(__name__).exception("the compression job failed")
        session.add_log(f"failed: {type(err).__name__}: {err}")
        yield snapshot(session, f"**Failed:** {type(err).__name__}: {err} (the details are in the server's log)")
    finally:
        session.running = False
        session.cancel_requested = False
        del pipeline
        gc.collect()
        board.release()


def _record(pipeline: Pipeline, session: Session, report: Any) -> Any:
    """Keep what the views need from ``report``; returns the dense copy made at the start of compression."""
    if isinstance(report, StepReport):
        session.steps.append((report.stage, len(session.steps) + 1, report.loss))
    elif isinstance(report, RoundReport):
        session.rounds.append(report)
    elif isinstance(report, EvalReport):
        session.evals.append(report)
    elif isinstance(report, StageReport) and report.stage == "compress" and report.event == "start":
        session.params_before = model_parameters(pipeline.model)
        _, session.compressible_before = compressible_parameters(pipeline.model)
        return copy.deepcopy(pipeline.model)  # the chat tab's "original": what was compressed
    elif isinstance(report, DoneReport):
        session.summary = report.summary
    line = describe(report)
    if line:
        session.add_log(line)
    return None


def eps_used(report: RoundReport, pipeline: Pipeline) -> str:
    """The eps the run used, and where it came from."""
    if pipeline.config.compress.curvature != "hutchinson":
        return f"eps: not used ({pipeline.config.compress.curvature} curvature)"
    rule = "" if pipeline.config.compress.hutchinson.eps is not None else \
        f" (the rule, {str(pipeline.dtype).removeprefix('torch.')}, f = {fraction_bits(pipeline.dtype)})"
    return f"eps used: **{number_text(report.eps)}**{rule}"


SNAPSHOT_LIMIT = 500_000_000
"""Models up to this many parameters keep every round's model for Inspect's measurements (one copy plus a
little per round, :class:`bsi.analysis.ranking.RoundSnapshots`); larger ones skip it to spare memory."""

MEASURE_PROBLEMS = 24
"""Held-out test problems Inspect's measurements compute the loss on."""


def _keep_rounds(pipeline: Pipeline, session: Session) -> None:
    """Let the engine record each round's model before its cut, for Inspect (small models only)."""
    from bsi.analysis.ranking import RoundSnapshots

    snapshots = RoundSnapshots()

    def capture(compressor, scores, pruned) -> None:
        if model_parameters(compressor.model) <= SNAPSHOT_LIMIT:
            snapshots.capture(compressor)
            session.snapshots = snapshots

    pipeline.before_cut = capture


def _drive(pipeline: Pipeline, session: Session, config: PipelineConfig, min_interval: float) -> Iterator[JobView]:
    _keep_rounds(pipeline, session)
    reports = pipeline.run()
    session.add_log(f"start: model {config.model}, data {config.data}, preset {config.preset}")
    yield snapshot(session, _status("Starting", session, config, "loading the model"))
    last, eps_text, dense_copy = 0.0, None, None
    try:
        for report in reports:
            if session.cancel_requested:
                if session.closed:
                    session.add_log("stopped: the visitor left")
                    return
                session.add_log("cancelled by the user")
                yield snapshot(session, _cancelled_status(pipeline))
                return
            dense_copy = _record(pipeline, session, report) or dense_copy
            if isinstance(report, RoundReport) and eps_text is None:
                eps_text = eps_used(report, pipeline)
            now = time.perf_counter()
            if not isinstance(report, StepReport) or now - last >= min_interval:
                last = now
                if isinstance(report, DoneReport):
                    break
                yield snapshot(session, _status("Running", session, config), eps_text,
                               rounds_changed=not isinstance(report, StepReport))
    finally:
        reports.close()
    if session.summary is None or session.closed:
        return
    tokenizer = pipeline.tokenizer
    session.tokenizer = tokenizer
    session.held_out = list(pipeline.task.test[:MEASURE_PROBLEMS]) if pipeline.task is not None else []
    session.compressed = LoadedModel(pipeline.model.eval(), tokenizer, "compressed", model_parameters(pipeline.model),
                                     source=config.model)
    if dense_copy is not None:
        session.original = LoadedModel(dense_copy.eval(), tokenizer, "reference: **the run's fine-tuned dense model** (the model it compressed)",
                                       model_parameters(dense_copy), source=config.model)
    saved = f" · saved to `{pipeline.out_dir}`" if pipeline.out_dir is not None else ""
    yield snapshot(session, _done_status(session.summary) + saved, eps_text)


def cancel_job(session: Session) -> str:
    """Ask this tab's running job to stop (it does at its next step)."""
    if not session.running:
        return "Nothing to cancel: no job is running in this tab."
    session.cancel_requested = True
    return "**Cancelling…** the job stops after the current step."


def handler(board: JobBoard, visitors: Visitors, resume: bool = False):
    """The Gradio handler of Start (or Resume): the job's views as component updates."""
    import gradio as gr

    def keep(value):
        return gr.skip() if value is None else value

    @with_request
    def on_start(request, session, *values):
        visitors.register(session_hash_of(request), session)
        shown_rounds: list[int] = []
        views = run_job(board, session, Form(*values), resume=resume)
        try:
            for view in views:
                round_update = layer_update = gr.skip()
                if view.rounds is not None and view.rounds != shown_rounds:
                    shown_rounds = list(view.rounds)
                    round_update = gr.update(choices=view.rounds, value=view.rounds[-1] if view.rounds else None)
                    layer_update = gr.update(choices=view.layers, value=view.layers[0] if view.layers else None)
                yield (view.status, keep(view.loss), keep(view.params), keep(view.ranks), keep(view.log),
                       round_update, layer_update, keep(view.eps_text))
        finally:  # Gradio closed us (client cancelled or gone): stop the job and free the board now
            views.close()

    return on_start


__all__ = ["JobView", "run_job", "cancel_job", "snapshot", "describe", "prepare", "handler"]
