"""Compress tab: the form's layout, its reactions, and Start, Resume and Cancel.

The form itself (its inputs, their checks, the configuration they make) is
:mod:`bsi.app.form`; the job that Start runs is :mod:`bsi.app.job`. This
module only lays the inputs out (one per :class:`~bsi.app.form.Knob`, radio
buttons where the field has choices) and wires the buttons to the job.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from bsi.app import job
from bsi.app.form import (
    DATA_SOURCES,
    HUTCHINSON_ONLY,
    KNOB,
    KNOBS,
    LABELS,
    MAX_UPLOAD_BYTES,
    MODEL_SOURCES,
    QUICK_PRESET,
    RATIOS,
    SIZE_MODES,
    TEXT_INPUTS,
    Form,
    Knob,
    compute_eps_rule,
    eps_note,
    preset_label,
    preset_line,
    preset_order,
    rule_text,
    size_mode_line,
    upload_message,
)
from bsi.app.format import in_app_words
from bsi.app.state import JobBoard, Visitors
from bsi.config import PRESETS
from bsi.errors import BSIError


# ------------------------------------------------------------------ the tab
@dataclass
class CompressTab:
    """The components other tabs read or update."""

    form: list  # components in Form field order
    connect: Any = None  # connect(round_dropdown, layer_dropdown): wire Start once the Inspect tab exists
    eps_input: Any = None  # the eps field
    eps_link: Any = None  # "what eps does to one layer": the What-if tab's eps study (wired by build_app)


def _knob_input(knob: Knob, value: Any, interactive: bool | None = None, elem_id: str | None = None):
    """The input for one knob: radio buttons for a field with choices, else a number box (help as its info).

    Number boxes get no minimum or maximum: :func:`bsi.app.form.build_config` checks the
    value and answers with one message, instead of Gradio's error badges.
    """
    import gradio as gr

    if knob.choices is not None:
        return gr.Radio(list(knob.choices), value=value, label=knob.label, info=knob.help, interactive=interactive,
                        elem_id=elem_id)
    return gr.Number(value=value, label=knob.label, info=knob.help, precision=0 if knob.integer else None,
                     interactive=interactive, elem_id=elem_id)


def _model_inputs(defaults: Form) -> dict[str, Any]:
    import gradio as gr

    gr.Markdown("### Model and data")
    own = defaults.model_source in ("hub", "path")
    return dict(
        model_source=gr.Radio(MODEL_SOURCES, value=defaults.model_source, label="Model"),
        model_name=gr.Textbox(value=defaults.model_name, label="Hub id or local folder", visible=own,
                              placeholder="HuggingFaceTB/SmolLM2-360M-Instruct or /path/to/model"),
        trust_remote_code=gr.Checkbox(value=False, visible=own,
                                      label="Trust remote code (runs code from the model's repository)"),
        data_source=gr.Radio(DATA_SOURCES, value=defaults.data_source, label="Task data"),
        data_file=gr.File(label=f"Upload: question/answer JSONL, or a text (.txt, or JSONL with a 'text' field), "
                                f"<= {MAX_UPLOAD_BYTES // 2**20} MB",
                          file_types=[".jsonl", ".txt"], type="filepath", visible=defaults.data_source == "upload"),
        **_text_inputs(defaults),
    )


def _text_inputs(defaults: Form) -> dict[str, Any]:
    """The text task's settings (shown when the data may be text): the window and how many windows are scored."""
    import gradio as gr

    from bsi.config import PipelineConfig, field_help

    shown = defaults.data_source != "embedded"
    with gr.Row():
        return {attr: gr.Number(value=getattr(defaults, attr), label=label, precision=0, visible=shown,
                                info=field_help(PipelineConfig, name) + (" (0 here: all of them)"
                                                                         if attr == "eval_windows" else ""))
                for attr, (name, label) in TEXT_INPUTS.items()}


def _method_inputs(defaults: Form) -> dict[str, Any]:
    """The preset, the size inputs and every knob; plus the lines that explain the size mode and eps.

    The hutchinson-only inputs (eps, the probe scope) stay in view, greyed out
    with a line saying why while another curvature is chosen; the eps rule's
    calculator (``eps_button``/``eps_text``) works for any choice.
    """
    import gradio as gr

    gr.Markdown("### Method")
    hutchinson = defaults.curvature == "hutchinson"
    with gr.Row():
        inputs = {"preset": gr.Dropdown([(preset_label(name), name) for name in preset_order()], value=defaults.preset,
                                        label="Preset (measured time on 2 cores)", scale=3, elem_id="preset-menu",
                                        info="the starting point: schedule, fine-tune and recovery steps, batch sizes")}
        inputs["tour_button"] = gr.Button(f"Quick look: the {QUICK_PRESET} preset", size="sm", scale=1,
                                          elem_id="tour-button")
    inputs["preset_line"] = gr.Markdown(preset_line(defaults.preset), elem_id="preset-line")
    ratio = RATIOS[defaults.size_mode]
    with gr.Row():
        inputs["size_mode"] = gr.Radio(list(SIZE_MODES), value=defaults.size_mode, label=KNOB["size_mode"].label,
                                       elem_id="size-mode")
        inputs["size_value"] = gr.Number(value=defaults.size_value, label=ratio.label, info=ratio.help)
    inputs["size_line"] = gr.Markdown(size_mode_line(defaults.size_mode), elem_id="size-line")
    for row in (("rounds", "gamma"), ("score", "bases"), ("curvature", "probe_scope"), ("eps",)):
        with gr.Row():
            for attr in row:
                only = attr in HUTCHINSON_ONLY
                inputs[attr] = _knob_input(KNOB[attr], getattr(defaults, attr), interactive=hutchinson if only else None,
                                           elem_id=f"{attr.replace('_', '-')}-field")
    inputs["eps_note"] = gr.Markdown(eps_note(defaults.curvature), elem_id="eps-note")
    with gr.Row():
        inputs["eps_button"] = gr.Button("Compute the rule", size="sm", elem_id="eps-button")
        inputs["eps_link"] = gr.Button("What eps does to one layer (What if tab)", size="sm", elem_id="eps-link")
    inputs["eps_text"] = gr.Markdown(rule_text(defaults), elem_id="eps-rule")
    with gr.Row():
        for attr in ("recover_train", "recover_distill"):
            inputs[attr] = _knob_input(KNOB[attr], getattr(defaults, attr))
    return inputs


def _outputs(opening: job.JobView) -> dict[str, Any]:
    """The status line, the plots and the log, showing ``opening`` (a saved run, or empty plots) until Start."""
    import gradio as gr

    out = {"status": gr.Markdown(opening.status, elem_id="job-status"),
           "loss": gr.Plot(opening.loss, label="Loss", elem_id="loss-plot")}
    with gr.Row():
        out["params"] = gr.Plot(opening.params, label="Parameters", elem_id="params-plot")
        out["log"] = gr.Textbox(opening.log, label="Log (newest first)", lines=14, max_lines=14, elem_id="job-log")
    out["ranks"] = gr.Plot(opening.ranks, label="Ranks", elem_id="ranks-plot")
    return out


def _wire_form(inputs: dict[str, Any], upload_status, lines: dict[str, Any], form: list) -> None:
    """The form's own reactions: show what applies, say what the size mode and eps do, refill from a preset,
    check an upload. ``lines`` holds the explaining Markdown (``size_line``, ``eps_note``, ``eps_text``)."""
    import gradio as gr

    def on_model_source(source):
        own = source in ("hub", "path")
        return gr.update(visible=own), gr.update(visible=own, value=False if not own else gr.skip())

    inputs["model_source"].change(on_model_source, inputs["model_source"],
                                  [inputs["model_name"], inputs["trust_remote_code"]])
    text = [inputs[attr] for attr in TEXT_INPUTS]
    def on_data_source(source):
        return [gr.update(visible=source == "upload")] + [gr.update(visible=source != "embedded")] * len(text)

    inputs["data_source"].change(on_data_source, inputs["data_source"], [inputs["data_file"], *text])
    inputs["data_file"].change(upload_message, inputs["data_file"], upload_status)

    def on_size_mode(mode):
        ratio = RATIOS.get(mode, RATIOS["target"])
        return gr.update(label=ratio.label, info=ratio.help), size_mode_line(mode)

    inputs["size_mode"].change(on_size_mode, inputs["size_mode"], [inputs["size_value"], lines["size_line"]])
    only = [inputs[attr] for attr in HUTCHINSON_ONLY]
    inputs["curvature"].change(lambda c: [gr.update(interactive=c == "hutchinson")] * len(only) + [eps_note(c)],
                               inputs["curvature"], [*only, lines["eps_note"]])
    for attr in ("bases", "preset"):  # what the rule's formula depends on (the floor comes with the preset)
        inputs[attr].change(lambda *values: rule_text(Form(*values)), form, lines["eps_text"])
    refilled = ["model_source", "data_source", *TEXT_INPUTS, "size_mode", "size_value",
                *(knob.attr for knob in KNOBS if knob.attr != "size_mode")]

    def on_preset(name):
        if name not in PRESETS:
            return [gr.skip()] * len(refilled)
        form = Form.for_preset(name)
        return [getattr(form, attr) for attr in refilled]

    inputs["preset"].input(on_preset, inputs["preset"], [inputs[attr] for attr in refilled])
    inputs["preset"].change(preset_line, inputs["preset"], lines["preset_line"])
    lines["tour_button"].click(lambda: [QUICK_PRESET, *on_preset(QUICK_PRESET)], None,
                               [inputs["preset"], *(inputs[attr] for attr in refilled)])


def render(board: JobBoard, session_state: Any, defaults: Form, visitors: Visitors | None = None,
           opening: job.JobView | None = None) -> CompressTab:
    """Lay out the Compress tab inside the current Blocks and wire its events.

    ``opening`` is what the plots show before Start (a saved run's,
    :func:`bsi.app.saved.opening_view`; empty plots by default).

    Start and Resume are wired by the returned tab's ``connect(round, layer)``,
    given the Inspect tab's dropdowns, which the job fills as rounds finish.
    """
    import gradio as gr

    with gr.Row():
        with gr.Column(scale=2, min_width=340):
            inputs = _model_inputs(defaults)
            upload_status = gr.Markdown()
            inputs.update(_method_inputs(defaults))
            eps_button = inputs.pop("eps_button")
            eps_link = inputs.pop("eps_link")
            lines = {key: inputs.pop(key) for key in ("size_line", "eps_note", "eps_text", "preset_line", "tour_button")}
            eps_text = lines["eps_text"]
            inputs["out_dir"] = gr.Textbox(value=defaults.out_dir, label="Save to folder",
                                           info="optional; empty keeps the result in memory. A run saved to a "
                                                "folder can be resumed there after a Cancel.")
            with gr.Row():
                start = gr.Button("Start", variant="primary", elem_id="start-button")
                resume = gr.Button("Resume", elem_id="resume-button")
                cancel = gr.Button("Cancel", variant="stop", elem_id="cancel-button")
        with gr.Column(scale=3):
            if opening is None:
                from bsi.app.saved import opening_view

                opening = opening_view(None)
            outputs = _outputs(opening)
    form = [inputs[f.name] for f in dataclasses.fields(Form)]
    _wire_form(inputs, upload_status, lines, form)

    def on_eps(*values):
        try:
            yield from compute_eps_rule(Form(*values))
        except BSIError as err:
            yield f"**Error:** {in_app_words(str(err), LABELS)}"

    eps_button.click(on_eps, form, eps_text, concurrency_limit=1)
    visitors = Visitors() if visitors is None else visitors
    shown = [outputs[key] for key in ("status", "loss", "params", "ranks", "log")]

    def connect(round_choice, layer_choice):
        targets = [*shown, round_choice, layer_choice, eps_text]
        # show_progress "minimal": the job streams its own status; Gradio's full overlay (a timer redrawn on every
        # output while the job runs) would keep the browser busy on the two cores the run needs
        start.click(job.handler(board, visitors, resume=False), [session_state, *form], targets,
                    concurrency_limit=None, api_name="start", show_progress="minimal")
        resume.click(job.handler(board, visitors, resume=True), [session_state, *form], targets,
                     concurrency_limit=None, api_name="resume", show_progress="minimal")

    cancel.click(job.cancel_job, session_state, outputs["status"], concurrency_limit=None, api_name="cancel")
    return CompressTab(form=form, connect=connect, eps_input=inputs["eps"], eps_link=eps_link)


__all__ = ["CompressTab", "render"]
