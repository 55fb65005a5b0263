"""Compress tab: the form, its validation, and the streaming job.

The job is :meth:`bsi.pipeline.runner.Pipeline.run` consumed by a generator,
:func:`run_job`, which turns reports into :class:`JobView` snapshots (status
line, loss curve, parameters per round, rank heatmap, log). It

* validates the whole form *before* taking the server's job board, so a typo
  never blocks anybody;
* takes the :class:`~bsi.app.state.JobBoard` without waiting; when another
  visitor's job holds it, yields a single "busy" view and stops;
* checks the session's cancel flag after every report (every optimisation
  step), so Cancel stops the run within one step; the pipeline generator is
  closed and its model dropped, and the board freed, whatever happens
  (including ``GeneratorExit``: Gradio closes the generator when its client
  cancels the event or drops the stream, and the visitor leaving raises the
  cancel flag, see :class:`~bsi.app.state.Visitors`);
* throttles views to one per ``min_interval`` seconds between steps (round,
  stage and evaluation reports always produce one).
"""

from __future__ import annotations

import copy
import gc
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bsi.config import PRESETS, PipelineConfig, make_config
from bsi.data import EMBEDDED_TASK, read_jsonl
from bsi.errors import BSIError
from bsi.method.scores import SCORES, eps_rule, fraction_bits
from bsi.models import EMBEDDED_MODEL, TINY_MODEL
from bsi.models import resolve_device, resolve_dtype
from bsi.pipeline.runner import Pipeline
from bsi.method.surgery import compressible_linear_names, compressible_parameters, model_parameters
from bsi.reports import DoneReport, EvalReport, RoundReport, StageReport, StepReport
from bsi.app import plots
from bsi.app.state import JobBoard, LoadedModel, Session, Visitors, session_hash_of, with_request

MAX_UPLOAD_BYTES = 20 * 1024 * 1024
"""Largest JSONL upload accepted (20 MB); the server also refuses bigger files."""

MODEL_SOURCES = [
    ("Embedded default: SmolLM2-135M-Instruct", "embedded"),
    ("Tiny random Llama (seconds; for trying the app)", "tiny"),
    ("Hugging Face hub id", "hub"),
    ("Local folder", "path"),
]
DATA_SOURCES = [("Embedded task: generated math word problems", "embedded"), ("Upload a JSONL file", "upload")]
SIZE_MODES = [("KeepRatio (importance-mass rule)", "keep"), ("Target size (compressible layers after / before)", "target")]


@dataclass
class Form:
    """The Compress tab's inputs, in the order the UI lists them."""

    model_source: str = "embedded"
    model_name: str = ""
    trust_remote_code: bool = False
    data_source: str = "embedded"
    data_file: str | None = None
    size_mode: str = "keep"
    size_value: float = 0.6
    eps: float = 0.0  # 0: the rule
    rounds: int = 4
    gamma: float = 1.0
    probe_scope: str = "model"
    score: str = "bsi"
    preset: str = "default"
    out_dir: str = ""

    @classmethod
    def for_preset(cls, preset: str) -> "Form":
        """The form as a preset fills it (the tiny model for ``smoke``, else the embedded one)."""
        if preset not in PRESETS:
            raise BSIError(f"unknown preset '{preset}': use one of {', '.join(PRESETS)}")
        comp = make_config(preset).compress
        model = "tiny" if PRESETS[preset].get("model") == TINY_MODEL else "embedded"
        mode, value = comp.size_mode, comp.ratio
        return cls(model_source=model, size_mode=mode, size_value=float(value), rounds=comp.rounds,
                   gamma=comp.gamma, probe_scope=comp.probe_scope, score=comp.score, preset=preset)


# ------------------------------------------------------------------ validation
def model_spec(form: Form) -> str:
    """The model spec :func:`bsi.models.load_model_and_tokenizer` understands."""
    if form.model_source == "embedded":
        return EMBEDDED_MODEL
    if form.model_source == "tiny":
        return TINY_MODEL
    name = (form.model_name or "").strip()
    if form.model_source == "hub":
        if not name:
            raise BSIError("model: type a Hugging Face hub id such as HuggingFaceTB/SmolLM2-360M-Instruct")
        return name
    if form.model_source == "path":
        if not name:
            raise BSIError("model: type the path of a local model folder")
        path = Path(name).expanduser()
        if not path.is_dir():
            raise BSIError(f"model: local folder '{name}' does not exist")
        return str(path)
    raise BSIError(f"model source must be one of {', '.join(v for _, v in MODEL_SOURCES)}, got '{form.model_source}'")


def validate_upload(path: str | None) -> int:
    """Check an uploaded JSONL file; returns its number of examples.

    Refuses files over :data:`MAX_UPLOAD_BYTES` and reports malformed content
    through :func:`bsi.data.read_jsonl`, whose message names the line; the
    server's temporary path in that message is replaced by the file's name.
    """
    if not path:
        raise BSIError("data: upload a .jsonl file (one JSON object with 'question' and 'answer' per line)")
    file = Path(path)
    if file.suffix.lower() != ".jsonl":
        raise BSIError(f"data: '{file.name}' is not a .jsonl file")
    size = file.stat().st_size
    if size > MAX_UPLOAD_BYTES:
        raise BSIError(f"data: '{file.name}' is {size / 2**20:.1f} MB; the limit is {MAX_UPLOAD_BYTES // 2**20} MB")
    try:
        return len(read_jsonl(file))
    except BSIError as err:
        raise BSIError(str(err).replace(str(file), file.name)) from None


def upload_message(path: str | None) -> str:
    """The status line shown under the upload widget."""
    if not path:
        return ""
    try:
        return f"OK: {validate_upload(path)} examples in {Path(path).name}"
    except BSIError as err:
        return f"Error: {err}"


def build_config(form: Form) -> PipelineConfig:
    """A validated :class:`PipelineConfig` from the form (raises BSIError naming the field)."""
    data = EMBEDDED_TASK
    if form.data_source == "upload":
        validate_upload(form.data_file)
        data = str(form.data_file)
    try:
        rounds = int(form.rounds)
    except (TypeError, ValueError):
        raise BSIError(f"rounds must be an integer >= 1, got {form.rounds!r}") from None
    if rounds != form.rounds:
        raise BSIError(f"rounds must be an integer >= 1, got {form.rounds}")
    if form.size_mode not in ("keep", "target"):
        raise BSIError(f"size mode must be keep or target, got '{form.size_mode}'")
    compress: dict[str, Any] = {
        "rounds": rounds, "gamma": float(form.gamma), "probe_scope": form.probe_scope, "score": form.score,
        "eps": float(form.eps) if form.eps else None,
        ("keep_ratio" if form.size_mode == "keep" else "target_ratio"): float(form.size_value),
        "size_mode": form.size_mode,
    }
    overrides = {"model": model_spec(form), "data": data, "trust_remote_code": bool(form.trust_remote_code),
                 "compress": compress}
    return make_config(form.preset, overrides)


def check_out_dir(out_dir: str) -> str | None:
    """The optional output folder: None when empty."""
    out_dir = (out_dir or "").strip()
    return out_dir or None


# ------------------------------------------------------------------ eps rule
def sigma_max_of(model: torch.nn.Module) -> float:
    """Largest singular value over the compressible linear layers (the eps rule's scale)."""
    modules = dict(model.named_modules())
    best = 0.0
    with torch.no_grad():
        for name in compressible_linear_names(model):
            weight = modules[name].weight.detach().float()  # (out, in)
            best = max(best, float(torch.linalg.matrix_norm(weight, ord=2)))
    return best


def eps_rule_text(sigma_max: float | None, dtype: torch.dtype = torch.float32, alpha: float = 0.01,
                  eps_max: float = 0.1) -> str:
    """The rule of METHOD.md sec. 4 with its value, for the label next to the eps field."""
    f = fraction_bits(dtype)
    name = str(dtype).removeprefix("torch.")
    if sigma_max is None:
        return (f"eps rule: min(2^-(f+1) * sigma_max / alpha, {eps_max}) with f = {f} ({name}), alpha = {alpha}; "
                "press *Compute* (or start a run) to evaluate it for this model.")
    value = eps_rule(sigma_max, dtype, alpha, eps_max)
    return (f"eps rule: min(2^-{f + 1} * {sigma_max:.4g} / {alpha}, {eps_max}) = **{value:.3g}** "
            f"({name}, sigma_max = {sigma_max:.4g})")


def compute_eps_rule(session: Session, form: Form) -> str:
    """Load the chosen model (on CPU, in the run's dtype) and show the rule's value for it."""
    config = build_config(form)
    from bsi.models import load_model_and_tokenizer

    dtype = resolve_dtype(config.dtype, resolve_device(config.device))
    model, _ = load_model_and_tokenizer(config.model, dtype=torch.float32,
                                        trust_remote_code=config.trust_remote_code)
    value = sigma_max_of(model)
    del model
    gc.collect()
    return eps_rule_text(value, dtype, config.compress.eps_alpha, config.compress.eps_max)


# ------------------------------------------------------------------ the job
@dataclass
class JobView:
    """One snapshot of the running job, as the tab shows it."""

    status: str
    loss: Any
    params: Any
    ranks: Any
    log: str
    rounds: list[int]
    layers: list[str]
    eps_text: str | None = None


def snapshot(session: Session, status: str, eps_text: str | None = None) -> JobView:
    """Build the figures and the log from the session's records."""
    layers = [layer.name for layer in session.rounds[0].layers] if session.rounds else []
    return JobView(
        status=status,
        loss=plots.loss_figure(session.steps),
        params=plots.params_figure(session.rounds, session.params_before, session.compressible_before),
        ranks=plots.rank_heatmap(session.rounds),
        log="\n".join(session.log[-300:]),
        rounds=[r.round for r in session.rounds],
        layers=layers,
        eps_text=eps_text,
    )


def _status(phase: str, session: Session, config: PipelineConfig, extra: str = "") -> str:
    done = len(session.rounds)
    parts = [f"**{phase}**", f"model `{config.model}`", f"round {done}/{config.compress.rounds}"]
    if session.steps:
        stage, _, loss = session.steps[-1]
        parts.append(f"last step: {stage}, loss {loss:.4f}")
    return " · ".join(parts) + (f" · {extra}" if extra else "")


def _describe(report: Any) -> str | None:
    """A log line for a report (None for the steps that are not logged)."""
    if isinstance(report, StageReport):
        cached = " (cached)" if report.cached else ""
        return f"{report.stage} {report.event}{cached}" + (f": {report.detail}" if report.detail else "")
    if isinstance(report, RoundReport):
        pruned = sum(layer.rank_before - layer.rank_after for layer in report.layers)
        return (f"round {report.round}/{report.total_rounds}: pruned {pruned} bases, "
                f"{report.params_total:,} params ({report.compressible_ratio:.1%} of the compressible layers), "
                f"mean loss {report.mean_loss:.4f}, eps {report.eps:.3g}, {report.elapsed:.1f} s")
    if isinstance(report, EvalReport):
        return (f"evaluate {report.when}: accuracy {report.accuracy:.1%}, loss {report.loss:.4f} on "
                f"{report.examples} examples, {report.params_total:,} params ({report.seconds:.1f} s)")
    if isinstance(report, StepReport) and (report.step == 1 or report.step == report.total_steps or report.step % 10 == 0):
        return f"{report.stage} step {report.step}/{report.total_steps}: loss {report.loss:.4f} ({report.elapsed:.1f} s)"
    return None


def _done_status(summary: dict) -> str:
    before, after = summary.get("metrics_before"), summary.get("metrics_after")
    acc = ""
    if before and after:
        acc = f" · accuracy {before['accuracy']:.1%} → {after['accuracy']:.1%}"
    return (f"**Done** in {summary['seconds']:.0f} s · params {summary['params_before']:,} → "
            f"{summary['params_after']:,} ({summary['compression_ratio']:.2f}x; compressible layers at "
            f"{summary['compressible_ratio']:.1%}){acc} · chat with it in the Chat tab")


def run_job(board: JobBoard, session: Session, form: Form, min_interval: float = 1.0) -> Iterator[JobView]:
    """Run the pipeline for ``form``, yielding views; see the module docstring for the guarantees."""
    if session.closed:
        yield snapshot(session, "**Closed:** this session has ended; reload the page to start again.")
        return
    if session.running:
        yield snapshot(session, "**Already running** in this tab: press Cancel first.")
        return
    try:
        config = build_config(form)
        out_dir = check_out_dir(form.out_dir)
        pipeline = Pipeline(config, out_dir=out_dir)
    except BSIError as err:
        yield snapshot(session, f"**Error:** {err}")
        return
    if not board.try_acquire(f"{config.model}, preset {config.preset}"):
        yield snapshot(session, f"**{board.busy_message()}**")
        return
    session.reset_run()
    session.running, session.config = True, config
    try:
        yield from _drive(pipeline, session, config, min_interval)
    except BSIError as err:
        session.add_log(f"error: {err}")
        yield snapshot(session, f"**Error:** {err}")
    finally:
        session.running = False
        session.cancel_requested = False
        del pipeline
        gc.collect()
        board.release()


def _drive(pipeline: Pipeline, session: Session, config: PipelineConfig, min_interval: float) -> Iterator[JobView]:
    reports = pipeline.run()
    session.add_log(f"start: model {config.model}, data {config.data}, preset {config.preset}")
    yield snapshot(session, _status("Starting", session, config, "loading the model"))
    last = 0.0
    eps_text = None
    dense_copy = None
    try:
        for report in reports:
            if session.cancel_requested:
                if session.closed:
                    session.add_log("stopped: the visitor left")
                    return
                session.add_log("cancelled by the user")
                yield snapshot(session, "**Cancelled.** The run stopped and its memory was freed; press Start to run again.")
                return
            if isinstance(report, StepReport):
                session.steps.append((report.stage, len(session.steps) + 1, report.loss))
            elif isinstance(report, RoundReport):
                if not session.rounds:
                    session.initial_ranks = {layer.name: layer.rank_before for layer in report.layers}
                    dtype = pipeline.dtype
                    f = fraction_bits(dtype)
                    eps_text = (f"eps used: **{report.eps:.3g}**" + ("" if config.compress.eps is not None else
                                f" (the rule, {str(dtype).removeprefix('torch.')}, f = {f})"))
                session.rounds.append(report)
            elif isinstance(report, EvalReport):
                session.evals.append(report)
            elif isinstance(report, StageReport) and report.stage == "compress" and report.event == "start":
                session.params_before = model_parameters(pipeline.model)
                _, session.compressible_before = compressible_parameters(pipeline.model)
                dense_copy = copy.deepcopy(pipeline.model)  # the chat tab's "original": what was compressed
            elif isinstance(report, DoneReport):
                session.summary = report.summary
            line = _describe(report)
            if line:
                session.add_log(line)
            now = time.perf_counter()
            if not isinstance(report, StepReport) or now - last >= min_interval:
                last = now
                if isinstance(report, DoneReport):
                    break
                yield snapshot(session, _status("Running", session, config), eps_text)
    finally:
        reports.close()
    if session.summary is None or session.closed:
        return
    tokenizer = pipeline.tokenizer
    session.compressed = LoadedModel(pipeline.model.eval(), tokenizer, "compressed", model_parameters(pipeline.model))
    if dense_copy is not None:
        session.original = LoadedModel(dense_copy.eval(), tokenizer, "original (dense, before compression)",
                                       model_parameters(dense_copy))
    saved = f" · saved to `{pipeline.out_dir}`" if pipeline.out_dir is not None else ""
    yield snapshot(session, _done_status(session.summary) + saved, eps_text)


def cancel_job(session: Session) -> str:
    """Ask this tab's running job to stop (it does at its next step)."""
    if not session.running:
        return "Nothing to cancel: no job is running in this tab."
    session.cancel_requested = True
    return "**Cancelling…** the job stops after the current step."


PRESET_NAMES = list(PRESETS)
__all__ = ["Form", "JobView", "run_job", "cancel_job", "build_config", "validate_upload", "eps_rule_text",
           "compute_eps_rule", "MODEL_SOURCES", "DATA_SOURCES", "SIZE_MODES", "SCORES", "PRESET_NAMES"]


# ------------------------------------------------------------------ the tab
@dataclass
class CompressTab:
    """The components other tabs read or update."""

    form: list  # components in Form field order
    connect: Any = None  # connect(round_dropdown, layer_dropdown): wire Start once the Inspect tab exists


def render(board: JobBoard, session_state: Any, defaults: Form, visitors: Visitors | None = None) -> CompressTab:
    """Lay out the Compress tab inside the current Blocks and wire its events.

    Start is wired by the returned tab's ``connect(round, layer)``, given the
    Inspect tab's dropdowns, which the job fills as rounds finish.
    """
    import gradio as gr

    with gr.Row():
        with gr.Column(scale=2, min_width=320):
            gr.Markdown("### Model and data")
            model_source = gr.Radio(MODEL_SOURCES, value=defaults.model_source, label="Model")
            model_name = gr.Textbox(value=defaults.model_name, label="Hub id or local folder",
                                    placeholder="HuggingFaceTB/SmolLM2-360M-Instruct or /path/to/model",
                                    visible=defaults.model_source in ("hub", "path"))
            trust = gr.Checkbox(value=False, label="Trust remote code (runs code from the model's repository)",
                                visible=defaults.model_source in ("hub", "path"))
            data_source = gr.Radio(DATA_SOURCES, value=defaults.data_source, label="Task data")
            data_file = gr.File(label=f"JSONL upload (question/answer per line, <= {MAX_UPLOAD_BYTES // 2**20} MB)",
                                file_types=[".jsonl"], type="filepath", visible=defaults.data_source == "upload")
            upload_status = gr.Markdown()
            gr.Markdown("### Method")
            preset = gr.Dropdown(PRESET_NAMES, value=defaults.preset, label="Preset (schedule, fine-tune and recovery steps)")
            with gr.Row():
                size_mode = gr.Radio(SIZE_MODES, value=defaults.size_mode, label="How much to prune")
                size_value = gr.Number(value=defaults.size_value, label="KeepRatio / target ratio", minimum=0.01, maximum=1)
            with gr.Row():
                rounds = gr.Number(value=defaults.rounds, label="Rounds T", precision=0, minimum=1)
                gamma = gr.Number(value=defaults.gamma, label="gamma (pool exponent)", minimum=0.01)
            with gr.Row():
                probe_scope = gr.Radio(["model", "layer"], value=defaults.probe_scope, label="Probe scope")
                score = gr.Radio(list(SCORES), value=defaults.score, label="Score")
            with gr.Row():
                eps = gr.Number(value=defaults.eps, label="eps (0 = the rule)", minimum=0, maximum=0.999)
                eps_button = gr.Button("Compute the rule", size="sm")
            eps_text = gr.Markdown(eps_rule_text(None))
            out_dir = gr.Textbox(value=defaults.out_dir, label="Save to folder (optional; empty keeps it in memory)")
            with gr.Row():
                start = gr.Button("Start", variant="primary", elem_id="start-button")
                cancel = gr.Button("Cancel", variant="stop", elem_id="cancel-button")
        with gr.Column(scale=3):
            status = gr.Markdown("Ready: press **Start**.", elem_id="job-status")
            loss_plot = gr.Plot(plots.loss_figure([]), label="Loss")
            with gr.Row():
                params_plot = gr.Plot(plots.params_figure([]), label="Parameters")
                rank_plot = gr.Plot(plots.rank_heatmap([]), label="Ranks")
            log = gr.Textbox(label="Log", lines=10, max_lines=10, autoscroll=True, elem_id="job-log")

    form = [model_source, model_name, trust, data_source, data_file, size_mode, size_value, eps, rounds, gamma,
            probe_scope, score, preset, out_dir]

    def on_model_source(source):
        show = source in ("hub", "path")
        return gr.update(visible=show), gr.update(visible=show, value=False if not show else gr.skip())

    model_source.change(on_model_source, model_source, [model_name, trust])
    data_source.change(lambda s: gr.update(visible=s == "upload"), data_source, data_file)
    data_file.change(upload_message, data_file, upload_status)

    def on_preset(name):
        f = Form.for_preset(name)
        return f.model_source, f.size_mode, f.size_value, f.rounds, f.gamma, f.probe_scope, f.score

    preset.input(on_preset, preset, [model_source, size_mode, size_value, rounds, gamma, probe_scope, score])

    def on_eps(session, *values):
        try:
            return compute_eps_rule(session, Form(*values))
        except BSIError as err:
            return f"Error: {err}"

    eps_button.click(on_eps, [session_state, *form], eps_text, concurrency_limit=1)

    visitors = Visitors() if visitors is None else visitors

    @with_request
    def on_start(request, session, *values):
        visitors.register(session_hash_of(request), session)
        shown_rounds: list[int] = []
        views = run_job(board, session, Form(*values))
        try:
            for view in views:
                round_update = layer_update = gr.skip()
                if view.rounds != shown_rounds:
                    shown_rounds = list(view.rounds)
                    round_update = gr.update(choices=view.rounds, value=view.rounds[-1] if view.rounds else None)
                    layer_update = gr.update(choices=view.layers, value=view.layers[0] if view.layers else None)
                yield (view.status, view.loss, view.params, view.ranks, view.log, round_update, layer_update,
                       view.eps_text if view.eps_text else gr.skip())
        finally:  # Gradio closed us (client cancelled or gone): stop the job and free the board now
            views.close()

    def connect(round_choice, layer_choice):
        start.click(on_start, [session_state, *form],
                    [status, loss_plot, params_plot, rank_plot, log, round_choice, layer_choice, eps_text],
                    concurrency_limit=None, api_name="start")

    cancel.click(cancel_job, session_state, status, concurrency_limit=None, api_name="cancel")
    return CompressTab(form=form, connect=connect)
