# Source of notebooks/04_curvature.ipynb (build: python notebooks/build.py).

# %% [markdown]
# # 04 · Curvature: Hessian spectra in sigma-space and how many probes suffice
#
# Notebook 02 estimated the Hessian *diagonal* with random ±1 probes and saw the
# error fall like `1/sqrt(s)` with the number of probes `s`. How many probes are
# enough depends on the shape of the whole Hessian `H` over the probed sigmas:
# the method's theory assumes its eigenvalues decay like a power law,
#
# $$|\lambda_k| \le |\lambda_1|\, k^{-a}, \qquad a > \tfrac12,$$
#
# and then bounds the estimator's variance *independently of the number of bases*.
# Here we measure such spectra on real layers, fit the power law, and use the
# theory's calculators. The theory module says it best:

# %%
import math
import time

import ipywidgets as widgets
import plotly.graph_objects as go
import torch
from IPython.display import Markdown, display
from plotly.colors import qualitative
from transformers.utils import logging as hf_logging

import bsi.method.theory
from bsi.analysis.spectrum import SpectrumAnalysis, SpectrumProgress, select_layers, spectrum_figure
from bsi.data import BatchStream, load_task
from bsi.method.scores import rademacher
from bsi.method.theory import (
    generalized_harmonic,
    hutchinson_variance,
    probes_needed,
    relative_error_by_probes,
    sample_complexity_psd,
    variance_bound_frobenius,
    variance_bound_power_law,
    zeta,
)
from bsi.models import load_model_and_tokenizer
from bsi.pipeline.losses import answer_token_loss
from bsi.teaching import doc_markdown, notebook_settings

display(Markdown(doc_markdown(bsi.method.theory, paragraphs=2)))

# %% [markdown]
# ## The quantities, before we use them
#
# * `H`: the `n x n` Hessian of the task loss over the `n` probed coefficients
#   `sigma` (here a layer's `k` largest), `H_ij = d2l / dsigma_i dsigma_j`;
#   its eigenvalues `lambda_1, lambda_2, ...` sorted by magnitude, so
#   `|lambda_1|` is the largest.
# * `a`: the power-law exponent, `|lambda_k| <= |lambda_1| k^-a` for every `k`.
# * `s`: the number of Rademacher probes `z_t` (entries ±1) averaged by the
#   estimator `D_s = (1/s) sum_t z_t * (H z_t)`, whose expectation is `diag H`.
# * `e` and `delta`: the guarantee asked for, a relative error at most `e`
#   with probability at least `1 - delta`:
#   `P(||D_s - diag H|| <= e ||diag H||) >= 1 - delta`.
# * The **generalized harmonic number**
#   $H_{n,p} = \sum_{k=1}^{n} k^{-p}$. With `p = 2a` it bounds the spectrum's
#   energy: $\sum_k \lambda_k^2 \le |\lambda_1|^2 \sum_{k=1}^{n} k^{-2a} = |\lambda_1|^2 H_{n,2a}$.
# * **Riemann's zeta**, $\zeta(p) = \sum_{k \ge 1} k^{-p} = \lim_{n\to\infty} H_{n,p}$,
#   finite only for `p > 1`: that is why the theory needs `a > 1/2` (then
#   `2a > 1`, and `H_{n,2a} <= zeta(2a)` whatever `n`).
# * `Tr(H) = sum_i H_ii = sum_k lambda_k`. By Cauchy-Schwarz,
#   `||diag H||^2 >= Tr(H)^2 / n`: the smallest the diagonal's energy can be.
#
# The **sample complexity** (section 3) is the number of probes beyond which
# the guarantee holds:
#
# $$s > 2\left(\frac{|\lambda_1|^2 H_{n,2a}}{\mathrm{Tr}(H)^2/n} - 1\right)\frac{\ln(2n/\delta)}{e^2}.$$
#
# Read it factor by factor: the ratio compares the spectrum's energy (an upper
# bound on `||H||_F^2`) with the smallest possible energy of the diagonal, so a
# Hessian whose off-diagonal mass dwarfs its diagonal needs many probes;
# `ln(2n/delta)` pays for asking all `n` entries to be right at once; `1/e^2`
# is the usual Monte Carlo price of precision. For a positive semidefinite `H`,
# `Tr(H) >= |lambda_1|` and the ratio is at most `n H_{n,2a} <= n zeta(2a)`,
# which gives the scale-free form `s > 2 (n zeta(2a) - 1) ln(2n/delta) / e^2`.
# The library's functions, on a few values:

# %%
for a in (0.75, 1.0, 2.0):
    print(f"a = {a}: H_(n,2a) = " + ", ".join(f"{generalized_harmonic(n, 2 * a):.4f} (n={n})" for n in (8, 64, 512))
          + f"; zeta(2a) = {zeta(2 * a):.4f}")

# %% [markdown]
# ## 1. Measuring spectra
#
# For each chosen layer, `bsi.analysis.spectrum.SpectrumAnalysis` converts it to Basel form
# and builds the exact `k x k` Hessian of the task loss over its `k` largest
# sigmas, column by column with double backward (so eager attention), averaged
# over a few mini-batches; other layers' sigmas stay fixed (the model-wide
# Hessian is treated as block-diagonal). We take layers of the last block, where
# a double backward is cheapest; `bsi spectrum --layers ...` measures any other.
#
# Which model and which bases, so you know what these spectra are of: the
# embedded model as it is loaded, **before any task fine-tuning**, and each
# layer written as its **plain SVD** (`W = U diag(sigma) V^T`, no whitening,
# no auxiliary vectors). A compression run scores coefficients of whitened
# bases of the fine-tuned model; these Hessians are over other coordinates of
# another point, so read the exponents and probe counts below as what this
# kind of Hessian looks like, not as the curvature a run meets.

# %%
hf_logging.disable_progress_bar()  # no loading bars between the results
settings = notebook_settings()
start = time.perf_counter()
model, tokenizer = load_model_and_tokenizer(settings.model)
task = load_task("embedded-math", test_size=settings.test_size)
stream = BatchStream(task.train, tokenizer, batch_size=settings.batch_size, max_length=settings.max_length, seed=4)
batches = [next(stream) for _ in range(2)]
specs = ["mlp.down_proj@-1", "self_attn.o_proj@-1", "mlp.up_proj@-1"][: settings.spectrum_layers]
names = select_layers(model, specs)
print(f"{settings.model}: top-{settings.spectrum_k} sigmas of {names}, {len(batches)} batches")
for report in SpectrumAnalysis(model, names, batches, answer_token_loss, top_k=settings.spectrum_k).run():
    if isinstance(report, SpectrumProgress):
        print(f"  batch {report.batch}/{report.batches}, {report.layer}: loss {report.loss:.3f}, {report.seconds:.0f} s")
    else:
        result = report

# %% [markdown]
# Each layer's |eigenvalues| sorted in decreasing order, on log-log axes, where
# a power law `c k^-a` is a straight line of slope `-a` (filled markers are
# positive eigenvalues, open ones negative). The right panel divides
# by `|lambda_1|` and draws two power laws per layer, the only two this
# notebook uses:
#
# * the **envelope** (dashed): `|lambda_1| k^-a_env`, where `a_env` is the
#   largest exponent for which it lies above *every* eigenvalue,
#   `a_env = min over k > 1 of log(|lambda_1| / |lambda_k|) / log k`. Its
#   constant is `|lambda_1|`: at `k = 1` no smaller constant can bound
#   `lambda_1` itself. This is exactly the theory's assumption
#   `|lambda_k| <= |lambda_1| k^-a`, so `a_env` is the exponent the bounds
#   below may use, and only if `a_env > 1/2`;
# * the **least-squares fit** (dotted): `c k^-a_fit`, the straight line that
#   best follows `log |lambda_k|` against `log k`. It describes how fast the
#   bulk decays, runs through the points and so bounds nothing.
#
# What to see in the figure: each dashed line starts at 1 and touches the data
# where it is tightest (often where a run of eigenvalues stays flat); each
# dotted line cuts through the points, steeper than the dashed one wherever a
# few eigenvalues stick out above the bulk.

# %%
spectrum_figure(result).show()


def fit_constant_needed(layer) -> float:
    """The smallest C with |lambda_k| <= C k^-a_fit for every k: what the fitted slope needs to become a bound."""
    magnitudes = torch.tensor(layer.eigenvalues, dtype=torch.float64).abs()  # (k,) sorted decreasing
    k = torch.arange(1, magnitudes.numel() + 1, dtype=torch.float64)  # (k,)
    return float((magnitudes * k.pow(layer.fit.alpha)).max())


def short(name: str) -> str:
    """model.layers.29.mlp.up_proj -> 29.mlp.up_proj"""
    return name.removeprefix("model.layers.")


def markdown_table(rows: list[dict]) -> Markdown:
    """A list of dicts (values already formatted as text) as a Markdown table."""
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(r[h]) for h in head) + " |" for r in rows]
    return Markdown("\n".join(lines))


holds = {s.name: s.fit.alpha_envelope > 0.5 for s in result.layers}  # the theory's assumption, layer by layer
display(markdown_table([{
    "layer": short(s.name), "k": s.k, "abs(lambda_1)": f"{s.lambda_1:.3g}", "trace": f"{s.trace:.3g}",
    "negative eigenvalues": f"{round(s.negative_share * s.k)} of {s.k}",
    "envelope a_env": f"{s.fit.alpha_envelope:.2f}",
    "fit a_fit (R^2)": f"{s.fit.alpha:.2f} ({s.fit.r2:.2f})",
    "share of points under abs(lambda_1) k^-a_fit": f"{s.fit.envelope_share:.0%}",
    "constant a_fit needs, / abs(lambda_1)": f"{fit_constant_needed(s) / s.lambda_1:.3g}",
    "assumption a > 1/2": "holds" if holds[s.name] else "fails"} for s in result.layers]))

# %% [markdown]
# Reading the table: where `a_fit > a_env`, the fitted slope anchored at
# `|lambda_1|` lies *below* some eigenvalues (the share of points under it is
# below 100%), so the theory cannot use it as it stands. It becomes a bound only with a larger constant,
# `C = max_k |lambda_k| k^a_fit` (the "constant a_fit needs" column, in units of
# `|lambda_1|`), and every bound below grows with `C^2`. This notebook therefore
# feeds the theory's calculators the envelope exponent `a_env`, with its
# constant `|lambda_1|`, and says "no power-law bound" where `a_env <= 1/2`.

# %% [markdown]
# ## 2. Variance of the estimator on a measured Hessian
#
# The one-probe estimator `z * (H z)` has total variance
# `sum_i sum_{j != i} H_ij^2` (exact, `hutchinson_variance`). Two upper bounds:
# `||H||_F^2 / s` for any matrix, and `|lambda_1|^2 zeta(2a) / s` under the power
# law, which does not grow with the number of bases. We check them on each
# measured block and simulate the estimator on it (pure linear algebra, no model).

# %%
rows = []
for layer in result.layers:
    H = layer.hessian  # (k, k) float64, symmetric
    exact = hutchinson_variance(H)
    a_env = layer.fit.alpha_envelope
    rows.append({
        "layer": short(layer.name), "exact variance (s = 1)": f"{exact:.3g}",
        "Frobenius bound / exact": f"{variance_bound_frobenius(H) / exact:.3g}",
        "envelope bound abs(lambda_1)^2 zeta(2 a_env) / exact":
            f"{variance_bound_power_law(layer.lambda_1, a_env) / exact:.3g}" if holds[layer.name]
            else f"none (a_env = {a_env:.2f})",
        "fitted slope, its constant: C^2 zeta(2 a_fit) / exact":
            f"{variance_bound_power_law(fit_constant_needed(layer), layer.fit.alpha) / exact:.3g}"
            if layer.fit.alpha > 0.5 else "none"})
display(markdown_table(rows))

# %% [markdown]
# Every bound is at least the exact variance (ratios of 1 or more): the
# Frobenius bound because it adds the diagonal's energy back, the power-law
# bounds because they also replace the measured spectrum by a curve above it.
# The last column is the same bound built on the fitted slope, with the
# constant that slope needs to bound every eigenvalue.
#
# Below, the estimator itself on each layer's measured block: the mean
# relative error of `D_s` over many draws against the number of probes, and the
# prediction `sqrt(variance / s) / ||diag H||`.

# %%
generator = torch.Generator().manual_seed(0)
probe_counts = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
simulated, predicted = {}, {}
fig = go.Figure()
kinds = sorted({layer.kind for layer in result.layers})  # the spectrum figure's colours: one per kind of layer
palette = {kind: qualitative.Plotly[i % len(qualitative.Plotly)] for i, kind in enumerate(kinds)}
for layer in result.layers:
    H = layer.hessian  # (k, k)
    z = torch.stack([rademacher(layer.k, generator) for _ in range(probe_counts[-1])]).double()  # (P, k) probes
    estimates = z * (z @ H)  # (P, k): one-probe estimates z * (H z) (H is symmetric)
    simulated[layer.name] = relative_error_by_probes(estimates, H.diagonal(), probe_counts)  # {s: mean error}
    predicted[layer.name] = [math.sqrt(hutchinson_variance(H, s)) / float(H.diagonal().norm()) for s in probe_counts]
    color = palette[layer.kind]
    fig.add_trace(go.Scatter(x=probe_counts, y=list(simulated[layer.name].values()), mode="markers",
                             marker={"color": color, "size": 7}, name=f"{short(layer.name)}: simulated"))
    fig.add_trace(go.Scatter(x=probe_counts, y=predicted[layer.name], mode="lines", line={"color": color, "dash": "dash"},
                             name=f"{short(layer.name)}: sqrt(variance / s) / ||diag H||"))
fig.update_xaxes(type="log", title="probes s")
fig.update_yaxes(type="log", title="relative error of the diagonal")
fig.update_layout(height=480, title="Hutchinson's estimator on each measured Hessian block",
                  legend={"orientation": "h", "yanchor": "top", "y": -0.2, "x": 0}, margin={"b": 40})
fig.show()
errors = simulated[result.layers[0].name]  # the first layer's, for the summary below

# %% [markdown]
# What to see: on log-log axes each layer's error falls on a line of slope
# -1/2 (the `1/sqrt(s)` law), and the markers sit on their dashed prediction:
# the exact variance formula describes the measured matrix. The markers are
# means over groups of draws from 512 probes: at 256 and 512 probes a marker is
# the mean of 2 draws and a single draw, so those scatter most.

# %% [markdown]
# ## 3. How many probes do I need?
#
# For a relative guarantee `P(||D_s - diag H|| <= e ||diag H||) >= 1 - delta` the
# theory asks for (every symbol is defined at the top of this notebook)
#
# $$s > 2\left(\frac{|\lambda_1|^2 H_{n,2a}}{\mathrm{Tr}(H)^2/n} - 1\right)\frac{\ln(2n/\delta)}{e^2},
# \qquad s > 2\,(n\,\zeta(2a) - 1)\frac{\ln(2n/\delta)}{e^2} \text{ if } H \succeq 0.$$
#
# `probes_needed` evaluates the first from a measured spectrum in two ways:
# with the measured energy `sum lambda_k^2` in place of `|lambda_1|^2 H_{n,2a}`
# (no power-law assumption), or, given `a`, with the power law, which we feed
# the envelope's `a_env` where it exceeds 1/2. The PSD form applies only to a
# layer with no negative eigenvalue. Each bound is a worst case for a
# probability `1 - delta`; the last column is what the simulation above needed
# for a *mean* error of `e`, a weaker demand, so expect it far below the bounds.

# %%
def probes_at(error: float, delta: float) -> list[dict]:
    """Per layer: the probes each bound asks for, and where the simulated mean error first reaches `error`."""
    out = []
    for layer in result.layers:
        eig = torch.tensor(layer.eigenvalues, dtype=torch.float64)  # (k,) signed
        a_env, psd = layer.fit.alpha_envelope, layer.negative_share == 0
        reached = next((s for s, e in simulated[layer.name].items() if e <= error), None)
        out.append({
            "layer": short(layer.name),
            "measured energy": f"{probes_needed(eig, error, delta):,}",
            "power law at a_env": f"{probes_needed(eig, error, delta, alpha=a_env):,}" if holds[layer.name] else "none",
            "PSD form at a_env": f"{math.ceil(sample_complexity_psd(layer.k, a_env, error, delta)):,}"
                                 if holds[layer.name] and psd else "none",
            "simulated mean error <= e at s": f"{reached}" if reached else f"> {probe_counts[-1]}"})
    return out


display(markdown_table(probes_at(0.1, 0.1)))

# %% [markdown]
# An interactive calculator: the bound as a function of the target relative error
# `e`, the failure probability `delta`, the number of bases `n` and the exponent
# `a` (for a PSD Hessian, so no spectrum scale is needed; `a` starts at the
# first measured envelope exponent above 1/2). Once `a > 1/2` it
# grows with `n` only through `n zeta(2a)` (linearly) and `ln(2n/delta)`: no
# higher power of `n`, however slowly the eigenvalues decay.
# (Move the sliders in a live kernel.)

# %%
e_slider = widgets.FloatLogSlider(value=0.1, base=10, min=-2, max=0, step=0.1, description="error e")
d_slider = widgets.FloatLogSlider(value=0.1, base=10, min=-3, max=-0.3, step=0.1, description="delta")
n_slider = widgets.IntSlider(value=128, min=8, max=4096, step=8, description="bases n")
valid = [s.fit.alpha_envelope for s in result.layers if holds[s.name]]  # envelope exponents the theory may use
a_slider = widgets.FloatSlider(value=round(max(valid[0] if valid else 0.55, 0.55), 2), min=0.55, max=3.0, step=0.05,
                               description="exponent a")
answer = widgets.HTML()


def calculate(*_):
    s = sample_complexity_psd(n_slider.value, a_slider.value, e_slider.value, d_slider.value)
    answer.value = (f"<b>{math.ceil(s):,} probes</b> guarantee relative error {e_slider.value:.3g} with probability "
                    f"{1 - d_slider.value:.3g} for n = {n_slider.value} bases, a = {a_slider.value:.2f}")


for w in (e_slider, d_slider, n_slider, a_slider):
    w.observe(calculate, "value")
calculate()
display(widgets.VBox([widgets.HBox([e_slider, d_slider]), widgets.HBox([n_slider, a_slider]), answer]))

# %%
first = result.layers[0]
eig = torch.tensor(first.eigenvalues, dtype=torch.float64)
outcome = {"layers": [s.name for s in result.layers], "k": [s.k for s in result.layers],
           "symmetric": [s.asymmetry for s in result.layers], "alpha": [s.fit.alpha for s in result.layers],
           "alpha_envelope": [s.fit.alpha_envelope for s in result.layers],
           "simulated_error": {str(s): e for s, e in errors.items()},
           "predicted_error": dict(zip(probe_counts, predicted[first.name]))}
print(f"Result: top-{settings.spectrum_k} Hessian spectra of {len(result.layers)} layers; envelope a_env = "
      + ", ".join(f"{s.fit.alpha_envelope:.2f}" for s in result.layers) + ", fitted a_fit = "
      + ", ".join(f"{s.fit.alpha:.2f}" for s in result.layers)
      + f"; {first.name}: bound {probes_needed(eig, 0.1, 0.1):,} probes for e = delta = 0.1, simulated error "
      f"{errors[probe_counts[-1]]:.3f} at {probe_counts[-1]} probes; ran in {time.perf_counter() - start:.0f} s")

# %% [markdown]
# ## What the data say
#
# *The code that writes this reading from the run's numbers is folded in the
# notebook (open it there); the rendered pages show only what it wrote.*

# %% tags=["hide-input"]
failing = [s for s in result.layers if not holds[s.name]]
steeper = [s for s in result.layers if s.fit.alpha > s.fit.alpha_envelope]
negative = sum(round(s.negative_share * s.k) for s in result.layers)
eigenvalues = sum(s.k for s in result.layers)
bounds = {s.name: probes_needed(torch.tensor(s.eigenvalues, dtype=torch.float64), 0.1, 0.1) for s in result.layers}
needed = {s.name: next((p for p, e in simulated[s.name].items() if e <= 0.1), None) for s in result.layers}
ratios = [bounds[n] / needed[n] for n in bounds if needed[n]]
lines = []
if failing:
    lines.append(
        f"* **The theory's assumption fails for {len(failing)} of {len(result.layers)} layers**: "
        + ", ".join(f"{short(s.name)} (a_env = {s.fit.alpha_envelope:.2f})" for s in failing)
        + ". No power law anchored at |lambda_1| with a > 1/2 lies above these spectra, so the variance bound "
        "that does not grow with the number of bases says nothing about them; the Frobenius bound and the "
        "measured-energy probe count still hold.")
else:
    lines.append(f"* The theory's assumption (a_env > 1/2) holds for all {len(result.layers)} measured layers, "
                 "but only for these top-k blocks: it says nothing about the rest of each layer.")
lines.append(
    f"* **A fitted slope overstates the decay**: a_fit exceeds a_env in {len(steeper)} of {len(result.layers)} layers "
    f"(largest gap {max((s.fit.alpha - s.fit.alpha_envelope for s in result.layers), default=0):.2f}). A reader who "
    "plugs the fitted exponent into the theory gets a bound that is not one.")
if ratios:
    lines.append(
        "* **The bounds are loose**: for e = delta = 0.1 the measured-energy bound asks for "
        + ", ".join(f"{bounds[n]:,}" for n in bounds) + " probes, where the simulation reached a mean error of 0.1 at "
        + ", ".join(f"{needed[n] if needed[n] else '> ' + str(probe_counts[-1])}" for n in bounds)
        + f" probes, {min(ratios):.0f} to {max(ratios):.0f} times fewer. Part of the gap is the question (a mean "
        "error against a guarantee at probability 0.9), most of it is the worst case the bound must cover.")
lines.append(
    f"* {negative} of the {eigenvalues} eigenvalues are negative"
    + (": on these blocks and batches the loss is locally convex in the top sigmas. That is one corner of each "
       "layer: docs/curvature.md (section 1) measured up to 58% negative eigenvalues in other layers of this model."
       if negative == 0 else ": the loss is not convex in sigma here, so the PSD form of the bound does not apply to "
       "those layers."))
lines.append(
    "* The simulated error follows the exact-variance prediction for every layer (1 probe: "
    + ", ".join(f"{simulated[s.name][1]:.2f}" for s in result.layers) + f"; {probe_counts[-1]} probes: "
    + ", ".join(f"{simulated[s.name][probe_counts[-1]]:.3f}" for s in result.layers)
    + "): the variance formula is right, and one probe per batch gives a diagonal with a relative error of this size.")
lines.append(
    f"* How far this reaches: {len(result.layers)} layers of the last block, the top {settings.spectrum_k} sigmas of "
    f"each, {result.batches} batches of {settings.batch_size} problems, over plain-SVD coefficients of the model "
    f"before task fine-tuning (not the whitened bases of a fine-tuned model that a run scores; batch "
    f"losses {', '.join(f'{loss:.2f}' for loss in result.losses)}); one measurement, no interval. The method's default "
    "curvature is the Fisher, not Hutchinson's estimator (docs/curvature.md compares them).")
display(Markdown("\n".join(lines)))

# %% [markdown]
# ## Recap
#
# * The Hutchinson estimator's variance is set by the Hessian's off-diagonal
#   mass, `||H||_F^2 - ||diag H||^2`, divided by the number of probes `s`.
# * Under a power-law spectrum `|lambda_k| <= |lambda_1| k^-a` with `a > 1/2`,
#   `||H||_F^2 <= |lambda_1|^2 H_{n,2a} <= |lambda_1|^2 zeta(2a)`: a variance
#   bound that does not grow with the number of bases.
# * Two power laws describe a measured spectrum: the envelope
#   `|lambda_1| k^-a_env`, which lies above every eigenvalue and is the
#   theory's assumption, and the least-squares fit `c k^-a_fit`, which runs
#   through the points. The calculators take `a_env`; the fitted slope bounds
#   the spectrum only with a larger constant, and the bound grows with its square.
# * The sample-complexity bound is a worst case: compare it with the number of
#   probes the simulation on the measured Hessian needed for the same error.

# %% [markdown]
# ## What to try
#
# Each exercise runs after the notebook, in the same kernel (it uses the
# variables above). Predict the outcome first, then open the solution.
#
# **1. The bounds on a Hessian whose spectrum you choose.** Build a symmetric
# `H` with eigenvalues exactly `k^-a` (so `lambda_1 = 1`) for a few `a`, and
# compare its exact variance with the Frobenius and the power-law bounds.
#
# <details><summary>Solution</summary>
#
# ```python
# n = 64
# q, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))
# for a in (0.6, 1.0, 2.0):
#     lam = torch.arange(1, n + 1, dtype=torch.float64) ** -a  # (n,) |lambda_k| = k^-a
#     h_syn = q @ torch.diag(lam) @ q.T  # (n, n) symmetric, positive definite
#     print(f"a = {a}: exact {hutchinson_variance(h_syn):.3f} <= Frobenius {variance_bound_frobenius(h_syn):.3f} "
#           f"(= H_(n,2a) {generalized_harmonic(n, 2 * a):.3f}) <= power law {variance_bound_power_law(1.0, a):.3f}")
# ```
#
# What you should see: the three numbers in increasing order for every `a`.
# The Frobenius bound equals `H_{n,2a}` here (the energy of this spectrum);
# the power-law bound `zeta(2a)` is close to it for `a = 2` and far above it
# for `a = 0.6`, where `zeta(2a)` blows up as `a` nears 1/2 while `n` stays 64.
#
# </details>
#
# **2. The price of precision and of confidence.** With the first layer's
# measured eigenvalues, evaluate `probes_needed` for `e` = 0.2, 0.1, 0.05 and
# `delta` = 0.1, 0.01. Predict the ratios from the formula first.
#
# <details><summary>Solution</summary>
#
# ```python
# eig = torch.tensor(result.layers[0].eigenvalues, dtype=torch.float64)
# for e in (0.2, 0.1, 0.05):
#     print(f"e = {e}: " + ", ".join(f"{probes_needed(eig, e, d):,} probes for delta = {d}" for d in (0.1, 0.01)))
# n = eig.numel()
# print(f"predicted: x4 per halving of e; x{math.log(2 * n / 0.01) / math.log(2 * n / 0.1):.2f} from delta 0.1 to 0.01")
# ```
#
# What you should see: halving `e` multiplies the bound by 4 (the `1/e^2`),
# up to the rounding to a whole probe; a ten times smaller `delta` costs only
# the ratio of the logarithms printed last. (A layer whose measured trace is 0
# gives `inf`: the relative guarantee is then void.)
#
# </details>
#
# **3. How the bound grows with the number of bases.** With the scale-free
# form for a PSD Hessian, `sample_complexity_psd(n, a, e, delta)`, compute the
# bound for `n` = 128, 1024 and 8192 at `a = 1`. Is the growth linear in `n`,
# and where does the rest come from?
#
# <details><summary>Solution</summary>
#
# ```python
# bounds = {n: sample_complexity_psd(n, 1.0, 0.1, 0.1) for n in (128, 1024, 8192)}
# for n, s in bounds.items():
#     print(f"n = {n:>5}: {math.ceil(s):,} probes; per basis {s / n:.0f}")
# print(f"8x more bases -> x{bounds[1024] / bounds[128]:.2f}, then x{bounds[8192] / bounds[1024]:.2f}")
# ```
#
# What you should see: each eightfold increase of `n` multiplies the bound by
# somewhat more than 8 (about 10): the `n zeta(2a)` factor is linear, and
# `ln(2n/delta)` adds the rest (the probes per basis creep up slowly). This is a worst case
# for a PSD Hessian; a measured spectrum (`probes_needed`) can ask for far
# fewer.
#
# </details>
#
# ## Further reading
#
# * BSI: Daniel Agyei Asante, Ernie Chang, Yang Li. *Importance-Guided Basis
#   Selection for Low-Rank Decomposition of Large Language Models*.
#   [arXiv:2605.01627](https://arxiv.org/abs/2605.01627), 2026. The variance
#   and sample-complexity results computed here are its theory.
# * Basel: Yang Li, Daniel Agyei Asante, Changsheng Zhao, Ernie Chang, Yangyang
#   Shi, Vikas Chandra. *Basis Selection: Low-Rank Decomposition of Pretrained
#   Large Language Models for Target Applications*.
#   [arXiv:2405.15877](https://arxiv.org/abs/2405.15877).
# * [docs/method.md](../docs/method.md), section 12 (the theory calculators);
#   [docs/curvature.md](../docs/curvature.md), the measured spectra of the
#   embedded model.
# * Next: [05 · Comparison](05_comparison.ipynb), BSI against the other methods.
