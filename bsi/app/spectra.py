"""Spectra tab: the exact Hessian spectrum of one layer's top-k coefficients, and the probes it asks for.

The method's variance bound for the Hutchinson estimator assumes the Hessian
over the probed sigmas has a power-law spectrum, ``|lambda_k| <= |lambda_1|
k^-a`` with ``a > 1/2``; then the number of probes needed for a
relative-error guarantee does not grow with the number of bases the way a
general matrix would demand. This tab checks the assumption on a real layer
and evaluates the bound. It is a view: the work is the library's.

* the spectrum is :func:`bsi.analysis.spectrum.compute_spectra` on one
  mini-batch of task data (the layer in Basel form only while it is measured,
  :func:`bsi.method.curvature.exact_hessian` for the matrix, the power-law fit
  :func:`bsi.analysis.spectrum.fit_power_law`);
* the figure is :func:`bsi.analysis.figures.spectrum_figure`;
* the calculator is :func:`bsi.method.theory.sample_complexity` (and
  :func:`~bsi.method.theory.sample_complexity_psd` for a positive semidefinite H).
"""

from __future__ import annotations

import math
from pathlib import Path

from bsi.app.format import in_app_words, number_text, significant
from bsi.errors import BSIError


def source_model(session, form):
    """The model to study: the last run's dense model, else the Compress tab's model (loaded once)."""
    from bsi.app.form import build_config
    from bsi.app.state import LoadedModel
    from bsi.method.surgery import model_parameters
    from bsi.models import load_model_and_tokenizer

    if session.closed:
        raise BSIError("this session has ended; reload the page")
    if session.original is not None:
        return session.original
    config = build_config(form)
    if session.spectrum_model is None or session.spectrum_model.source != config.model:
        model, tokenizer = load_model_and_tokenizer(config.model, trust_remote_code=config.trust_remote_code)
        session.spectrum_model = LoadedModel(model, tokenizer, config.model, model_parameters(model), source=config.model)
    return session.spectrum_model


def layer_names(session, form) -> list[str]:
    """The layers of :func:`source_model` whose spectrum can be measured (in module order)."""
    from bsi.analysis.spectrum import candidate_layers

    return candidate_layers(source_model(session, form).model)


def compute(session, form, name: str, k: int, examples: int = 4, seed: int = 0):
    """The :class:`~bsi.analysis.spectrum.SpectrumResult` of layer ``name``'s top-k sigmas on ``examples`` examples."""
    from bsi.analysis.spectrum import compute_spectra
    from bsi.app.form import build_config
    from bsi.data import BatchStream, TextBatchStream, is_text_run, load_task, load_text_task
    from bsi.pipeline.losses import answer_token_loss
    from bsi.pipeline.perplexity import model_context

    if not name:
        raise BSIError("choose a layer first (press *List layers*)")
    loaded = source_model(session, form)
    config = build_config(form)
    if is_text_run(config):  # a batch of training windows
        text = load_text_task(config.data, loaded.tokenizer, window=config.window, seed=seed,
                              held_out_fraction=config.held_out_fraction, text_field=config.text_field,
                              max_context=model_context(loaded.model))
        batch = next(TextBatchStream(text.train_windows, batch_size=int(examples), seed=seed))
    else:
        task = load_task(config.data, question_field=config.question_field, answer_field=config.answer_field,
                         test_size=1, train_size=max(int(examples), 1), seed=seed)
        batch = next(iter(BatchStream(task.train, loaded.tokenizer, batch_size=int(examples),
                                      max_length=config.max_length, seed=seed)))
    device = next(loaded.model.parameters()).device
    batch = {key: value.to(device) for key, value in batch.items()}
    return compute_spectra(loaded.model, [name], [batch], answer_token_loss, top_k=int(k), meta={"model": loaded.source})


SPECTRUM_FILE = "spectrum.json"
"""What ``bsi spectrum --out DIR`` writes (:meth:`bsi.analysis.spectrum.SpectrumResult.save`), the tab's opening view."""


def load_spectrum(path: str | Path):
    """A :class:`~bsi.analysis.spectrum.SpectrumResult` read back from a ``spectrum.json`` (the matrices left out).

    Raises:
        BSIError: the file is missing or is not a spectrum.
    """
    import dataclasses
    import json

    from bsi.analysis.spectrum import LayerSpectrum, PowerLawFit, SpectrumResult

    file = Path(path)
    if file.is_dir():
        file = file / SPECTRUM_FILE
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        fields = {f.name for f in dataclasses.fields(LayerSpectrum)} - {"hessian"}
        layers = [LayerSpectrum(**{k: v for k, v in layer.items() if k in fields} | {"fit": PowerLawFit(**layer["fit"])})
                  for layer in data["layers"]]
        meta = {k: v for k, v in data.items() if k not in ("top_k", "batches", "losses", "seconds", "layers")}
        return SpectrumResult(layers, data["top_k"], data["batches"], data["losses"], data["seconds"], meta)
    except OSError as err:
        raise BSIError(f"cannot read the spectrum '{file}' ({err.strerror or err}): give a `bsi spectrum --out` "
                       "folder") from None
    except (ValueError, KeyError, TypeError) as err:
        raise BSIError(f"'{file}' is not a spectrum written by `bsi spectrum` ({err})") from None


def spectrum_text(result, layer=None) -> str:
    """One measured layer in one line (the first of ``result`` unless given): size, |lambda_1|, trace, negative
    eigenvalues, the fit."""
    layer = result.layers[0] if layer is None else layer
    negative = round(layer.negative_share * layer.k)
    return (f"`{layer.name}`: top-{layer.k} sigmas, |lambda_1| = {number_text(layer.lambda_1)}, "
            f"Tr(H) = {number_text(layer.trace)}, {negative} negative eigenvalue(s); fit |lambda_k| ~ "
            f"{number_text(math.exp(layer.fit.log_c))} k^-{layer.fit.alpha:.2f} (R^2 {layer.fit.r2:.2f}); "
            f"the envelope |lambda_1| k^-a holds up to a = {layer.fit.alpha_envelope:.2f}")


def calculator_text(n: float, a: float, lambda1: float, trace: float, e: float, delta: float) -> str:
    """The calculator's answer as a sentence (or the reason it has none)."""
    from bsi.method.theory import sample_complexity, sample_complexity_psd

    values = {"n": n, "a": a, "|lambda_1|": lambda1, "Tr(H)": trace, "e": e, "delta": delta}
    missing = [name for name, value in values.items() if value is None]
    if missing:
        return f"Type a number for {', '.join(missing)}."
    if int(n) != n or n < 1:
        return "n must be a whole number >= 1."
    n = int(n)
    try:
        general = sample_complexity(float(lambda1), float(a), float(trace), n, float(e), float(delta))
        psd = sample_complexity_psd(n, float(a), float(e), float(delta)) if a > 0.5 else None
    except BSIError as err:
        return f"Error: {in_app_words(str(err))}"
    given = (f"n = {n}, a = {number_text(a)}, |lambda_1| = {number_text(lambda1)}, Tr(H) = {number_text(trace)}")
    if math.isinf(general):
        text = f"**No bound:** Tr(H) = 0, so a relative error is undefined ({given})."
    elif general < 1:
        text = f"**Any s >= 1 probe**: |lambda_1|^2 H_(n,2a) <= Tr(H)^2/n, so the bound is met at once ({given})."
    else:
        text = (f"**s > {math.ceil(general):,} probes** for relative error {number_text(e)} with probability "
                f"{number_text(1 - delta)} ({given}).")
    return text + (f" If H were positive semidefinite: s > {math.ceil(psd):,}." if psd is not None else "")


def render(session_state, form_components, visitors=None, opening=None):
    """Lay out the Spectra tab; ``form_components`` are the Compress tab's inputs (model and data).

    ``opening``: a saved :class:`~bsi.analysis.spectrum.SpectrumResult` shown before any click (the
    shipped run's, :func:`load_spectrum`), its last layer's values in the calculator.
    """
    import gradio as gr

    from bsi.analysis.figures import spectrum_figure
    from bsi.app.form import Form
    from bsi.app.state import Visitors, session_hash_of, with_request

    visitors = Visitors() if visitors is None else visitors

    gr.Markdown("The exact Hessian of the task loss over one layer's k largest coefficients sigma (double "
                "backward, one mini-batch), its |eigenvalues| on log-log axes with a least-squares power law, "
                "and the number of Hutchinson probes the sample-complexity bound asks for. The model is the last "
                "run's dense model, else the one chosen in the Compress tab. Each of the k columns is one second "
                "backward pass: layers of the last blocks are the quickest. `docs/curvature.md` explains the "
                "quantities.")
    with gr.Row():
        list_button = gr.Button("List layers", size="sm")
        layer = gr.Dropdown([], label="Layer", interactive=True, elem_id="spectra-layer")
        k = gr.Slider(2, 128, value=16, step=1, label="k (top sigmas)")
        examples = gr.Slider(1, 16, value=4, step=1, label="examples in the batch")
        compute_button = gr.Button("Compute spectrum", variant="primary")
    shown = opening.layers[-1] if opening is not None and opening.layers else None
    said = ""
    if shown is not None:
        source = opening.meta.get("model", "")
        said = (f"Saved spectra{f' of {source}' if source else ''}, {len(opening.layers)} layers: "
                f"{spectrum_text(opening, shown)}. List the layers and compute one to measure "
                "your own.")
    status = gr.Markdown(said, elem_id="spectra-status")
    figure = gr.Plot(spectrum_figure(opening), label="Spectrum", elem_id="spectra-figure")
    gr.Markdown("#### Probes needed: s > 2 (|l1|^2 H_{n,2a} / (Tr(H)^2/n) - 1) ln(2n/delta) / e^2 "
                "(computing a spectrum fills in its values)")
    start = (shown.k, significant(shown.fit.alpha), significant(shown.lambda_1), significant(shown.trace)) if shown \
        else (128, 1.0, 1.0, 10.0)
    with gr.Row():
        n = gr.Number(value=start[0], label="n (bases probed)", precision=0)
        a = gr.Number(value=start[1], label="a (power-law exponent)")
        lambda1 = gr.Number(value=start[2], label="|lambda_1|")
        trace = gr.Number(value=start[3], label="Tr(H)")
        e = gr.Number(value=0.1, label="relative error e")
        delta = gr.Number(value=0.05, label="delta")
    answer = gr.Markdown(calculator_text(*start, 0.1, 0.05), elem_id="spectra-answer")
    calc_inputs = [n, a, lambda1, trace, e, delta]
    for component in calc_inputs:
        component.change(calculator_text, calc_inputs, answer)

    @with_request
    def on_list(request, session, *values):
        visitors.register(session_hash_of(request), session)
        try:
            names = layer_names(session, Form(*values))
        except BSIError as err:
            return gr.update(), f"**Error:** {in_app_words(str(err))}"
        return gr.update(choices=names, value=names[-1] if names else None), f"{len(names)} layers"

    list_button.click(on_list, [session_state, *form_components], [layer, status], concurrency_limit=1)

    @with_request
    def on_compute(request, session, name, k_value, n_examples, *values):
        visitors.register(session_hash_of(request), session)
        try:
            result = compute(session, Form(*values), name, int(k_value), int(n_examples))
        except BSIError as err:
            return (f"**Error:** {in_app_words(str(err))}", gr.skip(), *[gr.skip()] * 4)
        spectrum = result.layers[0]
        return (spectrum_text(result), spectrum_figure(result), spectrum.k, significant(spectrum.fit.alpha),
                significant(spectrum.lambda_1), significant(spectrum.trace))

    compute_button.click(on_compute, [session_state, layer, k, examples, *form_components],
                         [status, figure, n, a, lambda1, trace], concurrency_limit=1)
