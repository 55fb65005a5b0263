"""Spectra tab: the exact Hessian spectrum of one layer's top-k coefficients.

METHOD.md sec. 7 assumes the Hessian over the probed sigmas has a power-law
spectrum, ``|lambda_k| <= |lambda_1| k^-a`` with ``a > 1/2``; then the number
of Hutchinson probes needed for a relative-error guarantee does not grow with
the number of bases the way a general matrix would demand.

This module checks the assumption on a real layer, exactly and cheaply:

1. the chosen ``nn.Linear`` is swapped for its :class:`~bsi.method.layers.BasisLinear`
   (same outputs) for the duration of the computation, and put back after;
2. the ``k x k`` Hessian over its ``k`` largest sigmas is built column by
   column from exact Hessian-vector products ``H e_j`` (double backward,
   :func:`bsi.method.curvature.hessian_vector_product`, eager attention) on one
   mini-batch of task data;
3. its eigenvalues are sorted by magnitude and fitted by least squares on
   log-log axes (:func:`power_law_fit`).

The "probes needed" calculator is :func:`probes_needed` (the sample-complexity
bound of sec. 7). These are small pure functions so they can later be
replaced by the library's own theory module without touching the tab.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import contextmanager

import torch
from torch import nn

from bsi.errors import BSIError
from bsi.method.curvature import hessian_vector_product
from bsi.method.layers import BasisLinear


# --------------------------------------------------------------- pure math
def harmonic(n: int, p: float) -> float:
    """Generalised harmonic number ``H_{n,p} = sum_{k=1..n} k^-p``."""
    if n < 1:
        raise BSIError(f"n must be >= 1, got {n}")
    k = torch.arange(1, n + 1, dtype=torch.float64)
    return float((k ** -p).sum())


def zeta(p: float, terms: int = 100_000) -> float:
    """Riemann zeta ``sum_k k^-p`` for ``p > 1``: a partial sum plus the integral of the tail."""
    if p <= 1:
        raise BSIError(f"zeta(p) diverges for p <= 1 (here p = 2a = {p}); the bound needs a > 1/2")
    return harmonic(terms, p) + terms ** (1 - p) / (p - 1) - 0.5 * terms ** -p


def power_law_fit(eigenvalues: Sequence[float] | torch.Tensor) -> tuple[float, float]:
    """Least-squares fit ``|lambda_k| ~ c * k^-a`` on log-log axes; returns ``(c, a)``.

    The magnitudes are sorted descending; zeros are dropped (their log is
    undefined). Needs at least two non-zero values.
    """
    values = torch.as_tensor(eigenvalues, dtype=torch.float64).abs().sort(descending=True).values
    values = values[values > 0]
    if values.numel() < 2:
        raise BSIError("a power-law fit needs at least two non-zero eigenvalues")
    log_k = torch.log(torch.arange(1, values.numel() + 1, dtype=torch.float64))  # (n,)
    log_v = torch.log(values)  # (n,)
    design = torch.stack([torch.ones_like(log_k), log_k], dim=1)  # (n, 2)
    coef = torch.linalg.lstsq(design, log_v.unsqueeze(1)).solution.squeeze(1)  # (2,)
    return float(torch.exp(coef[0])), float(-coef[1])


def probes_needed(n: int, a: float, lambda1: float, trace: float, e: float, delta: float) -> float:
    """Probes ``s`` sufficient for ``P(||D_s - diag H|| <= e ||diag H||) >= 1 - delta`` (METHOD.md sec. 7)::

        s > 2 * ( |lambda_1|^2 * H_{n,2a} / (Tr(H)^2 / n) - 1 ) * ln(2n / delta) / e^2

    Args:
        n: size of the Hessian (bases probed).
        a: power-law exponent of the spectrum (``|lambda_k| <= |lambda_1| k^-a``).
        lambda1: largest eigenvalue magnitude.
        trace: ``Tr(H)`` (must not be 0).
        e: relative error in (0, 1); delta: failure probability in (0, 1).
    """
    _check_calculator(n, e, delta)
    if trace == 0:
        raise BSIError("Tr(H) is 0: the relative bound is undefined")
    ratio = lambda1 ** 2 * harmonic(n, 2 * a) / (trace ** 2 / n)
    return max(0.0, 2 * (ratio - 1) * math.log(2 * n / delta) / e ** 2)


def probes_needed_psd(n: int, a: float, e: float, delta: float) -> float:
    """The same bound for a positive semi-definite H: ``s > 2 (n zeta(2a) - 1) ln(2n/delta) / e^2``."""
    _check_calculator(n, e, delta)
    return 2 * (n * zeta(2 * a) - 1) * math.log(2 * n / delta) / e ** 2


def _check_calculator(n: int, e: float, delta: float) -> None:
    if n < 1:
        raise BSIError(f"n must be >= 1, got {n}")
    if not 0 < e < 1:
        raise BSIError(f"relative error e must be in (0, 1), got {e}")
    if not 0 < delta < 1:
        raise BSIError(f"delta must be in (0, 1), got {delta}")


# ------------------------------------------------------------ exact Hessian
@contextmanager
def basis_form_of(model: nn.Module, name: str):
    """Temporarily replace linear layer ``name`` by its exact BasisLinear (no auxiliary vectors).

    Yields the BasisLinear; the original ``nn.Linear`` is put back afterwards,
    and the model's attention implementation is switched to ``eager`` (double
    backward does not pass through fused attention kernels) and restored.
    """
    modules = dict(model.named_modules())
    linear = modules.get(name)
    if not isinstance(linear, nn.Linear):
        raise BSIError(f"'{name}' is not a linear layer of this model")
    parent_name, _, attr = name.rpartition(".")
    parent = modules[parent_name] if parent_name else model
    basis = BasisLinear.from_linear(linear, aux_rank=0)
    previous = getattr(model.config, "_attn_implementation", None)
    setattr(parent, attr, basis)
    try:
        if previous not in (None, "eager") and hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation("eager")
        yield basis
    finally:
        setattr(parent, attr, linear)
        if previous not in (None, "eager") and hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(previous)


def layer_hessian(model: nn.Module, name: str, batch: dict, loss_fn, k: int) -> torch.Tensor:
    """The exact (k, k) Hessian of the loss over the k largest sigmas of layer ``name``.

    Column ``j`` is ``H e_j`` from one double backward; the result is
    symmetrised (``(H + H^T) / 2``) to remove round-off asymmetry.
    """
    was_training = model.training
    model.eval()
    try:
        with basis_form_of(model, name) as layer:
            if not 2 <= k <= layer.rank:
                raise BSIError(f"k must be between 2 and the layer's rank {layer.rank}, got {k}")
            layer.sigma.requires_grad_(True)
            columns = []
            for j in range(k):
                e_j = torch.zeros(layer.rank, device=layer.sigma.device)
                e_j[j] = 1.0
                _, _, hv = hessian_vector_product(model, [layer], batch, loss_fn, [e_j])
                columns.append(hv[0][:k].double().cpu())  # (k,)
            hessian = torch.stack(columns, dim=1)  # (k, k)
    finally:
        model.train(was_training)
    return 0.5 * (hessian + hessian.T)


def spectrum_summary(eigenvalues: torch.Tensor, fit: tuple[float, float]) -> dict:
    """Numbers the calculator needs, from a spectrum and its fit."""
    magnitudes = eigenvalues.abs().sort(descending=True).values
    return {"n": int(eigenvalues.numel()), "lambda1": float(magnitudes[0]), "trace": float(eigenvalues.sum()),
            "a": fit[1], "c": fit[0], "negative": int((eigenvalues < 0).sum())}


# ------------------------------------------------------------------ the tab
def source_model(session, form):
    """The model to study: the last run's dense model, else the Compress tab's model (loaded once)."""
    from bsi.models import load_model_and_tokenizer
    from bsi.method.surgery import model_parameters
    from bsi.app.compress import build_config
    from bsi.app.state import LoadedModel

    if session.closed:
        raise BSIError("this session has ended; reload the page")
    if session.original is not None:
        return session.original
    config = build_config(form)
    if session.spectrum_model is None or session.spectrum_model.label != config.model:
        model, tokenizer = load_model_and_tokenizer(config.model, trust_remote_code=config.trust_remote_code)
        session.spectrum_model = LoadedModel(model, tokenizer, config.model, model_parameters(model))
    return session.spectrum_model


def layer_names(session, form) -> list[str]:
    """The compressible linear layers of :func:`source_model` (in module order)."""
    from bsi.method.surgery import compressible_linear_names

    return compressible_linear_names(source_model(session, form).model)


def compute(session, form, name: str, k: int, examples: int = 4, seed: int = 0):
    """Exact spectrum of layer ``name``'s top-k sigmas on ``examples`` task examples.

    Returns ``(eigenvalues (k,), fit (c, a), summary dict)``.
    """
    from bsi.data import BatchStream, load_task
    from bsi.pipeline.losses import answer_token_loss
    from bsi.app.compress import build_config

    loaded = source_model(session, form)
    config = build_config(form)
    if not name:
        raise BSIError("choose a layer first (press *List layers*)")
    task = load_task(config.data, question_field=config.question_field, answer_field=config.answer_field,
                     test_size=1, train_size=max(int(examples), 1), seed=seed)
    batch = next(iter(BatchStream(task.train, loaded.tokenizer, batch_size=int(examples),
                                  max_length=config.max_length, seed=seed)))
    device = next(loaded.model.parameters()).device
    batch = {key: value.to(device) for key, value in batch.items()}
    hessian = layer_hessian(loaded.model, name, batch, answer_token_loss, int(k))
    eigenvalues = torch.linalg.eigvalsh(hessian)  # (k,) ascending
    fit = power_law_fit(eigenvalues)
    return eigenvalues, fit, spectrum_summary(eigenvalues, fit)


def calculator_text(n: int, a: float, lambda1: float, trace: float, e: float, delta: float) -> str:
    """The calculator's answer as a sentence (or the reason it has none)."""
    try:
        general = probes_needed(int(n), float(a), float(lambda1), float(trace), float(e), float(delta))
    except BSIError as err:
        return f"Error: {err}"
    if general < 1:
        text = (f"**any s >= 1 probe**: |lambda_1|^2 H_(n,2a) <= Tr(H)^2/n, so the bound is met at once "
                f"(n = {int(n)}, a = {a:.3g}, |lambda_1| = {lambda1:.4g}, Tr(H) = {trace:.4g}).")
        return text + (f" If H were PSD: s > {probes_needed_psd(int(n), float(a), float(e), float(delta)):,.0f}."
                       if a > 0.5 else "")
    text = (f"**s > {general:,.0f} probes** for relative error {e} with probability {1 - delta:.3g} "
            f"(n = {int(n)}, a = {a:.3g}, |lambda_1| = {lambda1:.4g}, Tr(H) = {trace:.4g}).")
    if a > 0.5:
        text += f" If H were PSD: s > {probes_needed_psd(int(n), float(a), float(e), float(delta)):,.0f}."
    return text


def render(session_state, form_components, visitors=None):
    """Lay out the Spectra tab; ``form_components`` are the Compress tab's inputs (model and data)."""
    import gradio as gr

    from bsi.app import plots
    from bsi.app.compress import Form
    from bsi.app.state import Visitors, session_hash_of, with_request

    visitors = Visitors() if visitors is None else visitors

    gr.Markdown("The exact Hessian of the task loss over one layer's k largest coefficients sigma (double "
                "backward, one mini-batch), its |eigenvalues| on log-log axes with a least-squares power law, "
                "and the number of Hutchinson probes the sample-complexity bound asks for. The model is the last "
                "run's dense model, else the one chosen in the Compress tab.")
    with gr.Row():
        list_button = gr.Button("List layers", size="sm")
        layer = gr.Dropdown([], label="Layer", interactive=True)
        k = gr.Slider(2, 128, value=16, step=1, label="k (top sigmas)")
        examples = gr.Slider(1, 16, value=4, step=1, label="examples in the batch")
        compute_button = gr.Button("Compute spectrum", variant="primary")
    status = gr.Markdown()
    figure = gr.Plot(plots.spectrum_figure([]), label="Spectrum")
    gr.Markdown("#### Probes needed (METHOD.md sec. 7): "
                "s > 2 (|l1|^2 H_{n,2a} / (Tr(H)^2/n) - 1) ln(2n/delta) / e^2")
    with gr.Row():
        n = gr.Number(value=128, label="n (bases probed)", precision=0)
        a = gr.Number(value=1.0, label="a (power-law exponent)")
        lambda1 = gr.Number(value=1.0, label="|lambda_1|")
        trace = gr.Number(value=10.0, label="Tr(H)")
        e = gr.Number(value=0.1, label="relative error e")
        delta = gr.Number(value=0.05, label="delta")
    answer = gr.Markdown(calculator_text(128, 1.0, 1.0, 10.0, 0.1, 0.05))
    calc_inputs = [n, a, lambda1, trace, e, delta]
    for component in calc_inputs:
        component.change(calculator_text, calc_inputs, answer)

    @with_request
    def on_list(request, session, *values):
        visitors.register(session_hash_of(request), session)
        try:
            names = layer_names(session, Form(*values))
        except BSIError as err:
            return gr.update(), f"Error: {err}"
        return gr.update(choices=names, value=names[0] if names else None), f"{len(names)} layers"

    list_button.click(on_list, [session_state, *form_components], [layer, status], concurrency_limit=1)

    @with_request
    def on_compute(request, session, name, k_value, n_examples, *values):
        visitors.register(session_hash_of(request), session)
        try:
            eigenvalues, fit, info = compute(session, Form(*values), name, int(k_value), int(n_examples))
        except BSIError as err:
            return (f"Error: {err}", gr.skip(), *[gr.skip()] * 4)
        text = (f"`{name}`: top-{info['n']} sigmas, |lambda_1| = {info['lambda1']:.4g}, Tr(H) = {info['trace']:.4g}, "
                f"{info['negative']} negative eigenvalue(s); fit |lambda_k| ~ {info['c']:.3g} k^-{info['a']:.2f}")
        fig = plots.spectrum_figure(eigenvalues.tolist(), fit, title=f"Hessian spectrum of {name}")
        return text, fig, info["n"], round(info["a"], 4), info["lambda1"], info["trace"]

    compute_button.click(on_compute, [session_state, layer, k, examples, *form_components],
                         [status, figure, n, a, lambda1, trace], concurrency_limit=1)
