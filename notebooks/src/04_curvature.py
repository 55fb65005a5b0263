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
import pandas as pd
import plotly.graph_objects as go
import torch
from IPython.display import Markdown, display
from transformers.utils import logging as hf_logging

import bsi.method.theory
from bsi.analysis.spectrum import SpectrumAnalysis, SpectrumProgress, select_layers, spectrum_figure
from bsi.data import BatchStream, load_task
from bsi.method.scores import rademacher
from bsi.method.theory import (generalized_harmonic, hutchinson_variance, probes_needed, relative_error_by_probes,
                               sample_complexity_psd, variance_bound_frobenius, variance_bound_power_law, zeta)
from bsi.models import load_model_and_tokenizer
from bsi.pipeline.losses import answer_token_loss
from bsi.teaching import doc_markdown, notebook_settings

display(Markdown(doc_markdown(bsi.method.theory)))

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
# Each layer's |eigenvalues| sorted in decreasing order, on log-log axes (open
# markers are negative eigenvalues: the loss is not convex in sigma). A power law
# is a straight line there; the right panel divides by `|lambda_1|` and draws the
# fitted envelope `k^-a`.

# %%
spectrum_figure(result).show()
display(Markdown(result.summary_table()))

# %% [markdown]
# Reading the table: `alpha (fit)` is the least-squares slope; `alpha (envelope)`
# is the largest exponent whose envelope `|lambda_1| k^-a` lies above *every*
# eigenvalue. The theory needs an envelope exponent above `1/2`; where the bulk
# decays fast and a few late eigenvalues stick out, the fitted slope is larger
# than the envelope exponent.

# %%
rows = pd.DataFrame(result.summary_rows())
verdicts = ["holds (a > 1/2)" if r > 0.5 else "fails (a <= 1/2)" for r in rows["alpha_envelope"]]
for name, fit, env, verdict in zip(rows["layer"], rows["alpha"], rows["alpha_envelope"], verdicts):
    print(f"{name}: fitted a = {fit:.2f}, envelope a = {env:.2f} -> power-law assumption {verdict}")

# %% [markdown]
# ## 2. Variance of the estimator on a measured Hessian
#
# The one-probe estimator `z * (H z)` has total variance
# `sum_i sum_{j != i} H_ij^2` (exact, `hutchinson_variance`). Two upper bounds:
# `||H||_F^2 / s` for any matrix, and `|lambda_1|^2 zeta(2a) / s` under the power
# law, which does not grow with the number of bases. We check them on each
# measured block and simulate the estimator on it (pure linear algebra, no model).

# %%
table = []
for layer in result.layers:
    H = layer.hessian  # (k, k) float64, symmetric
    a = max(layer.fit.alpha_envelope, 0.51)
    table.append({
        "layer": layer.name, "k": layer.k,
        "exact variance (s=1)": hutchinson_variance(H),
        "Frobenius bound": variance_bound_frobenius(H),
        "power-law bound": variance_bound_power_law(layer.lambda_1, a) if layer.fit.alpha_envelope > 0.5 else math.nan,
    })
pd.DataFrame(table).style.format({c: "{:.3e}" for c in ("exact variance (s=1)", "Frobenius bound", "power-law bound")})

# %%
layer = result.layers[0]
H = layer.hessian
generator = torch.Generator().manual_seed(0)
z = torch.stack([rademacher(layer.k, generator) for _ in range(512)]).double()  # (P, k) the estimator's probes
estimates = z * (z @ H)  # (P, k): one-probe estimates z * (H z) (H is symmetric)
probe_counts = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
errors = relative_error_by_probes(estimates, H.diagonal(), probe_counts)
predicted = [math.sqrt(hutchinson_variance(H, s)) / float(H.diagonal().norm()) for s in probe_counts]
fig = go.Figure([go.Scatter(x=probe_counts, y=list(errors.values()), mode="lines+markers", name="simulated"),
                 go.Scatter(x=probe_counts, y=predicted, mode="lines", name="sqrt(variance)/||diag H||",
                            line={"dash": "dash"})])
fig.update_xaxes(type="log", title="probes s")
fig.update_yaxes(type="log", title="relative error of diag estimate")
fig.update_layout(height=360, title=f"Hutchinson on the measured Hessian of {layer.name}")
fig.show()

# %% [markdown]
# ## 3. How many probes do I need?
#
# For a relative guarantee `P(||D_s - diag H|| <= e ||diag H||) >= 1 - delta` the
# theory asks for (every symbol is defined at the top of this notebook)
#
# $$s > 2\left(\frac{|\lambda_1|^2 H_{n,2a}}{\mathrm{Tr}(H)^2/n} - 1\right)\frac{\ln(2n/\delta)}{e^2},
# \qquad s > 2\,(n\,\zeta(2a) - 1)\frac{\ln(2n/\delta)}{e^2} \text{ if } H \succeq 0.$$
#
# `probes_needed` evaluates the first from a measured spectrum (with the measured
# energy `sum lambda_k^2` in place of the power-law bound `|lambda_1|^2 H_{n,2a}`
# when no `a` is given).
# The bound is a worst case: the simulation shows what the measured matrix
# actually needs.

# %%
def probes_at(error, delta):
    out = []
    for layer in result.layers:
        eig = torch.tensor(layer.eigenvalues, dtype=torch.float64)
        bound = probes_needed(eig, error, delta)
        reached = next((s for s, e in errors.items() if e <= error), None) if layer is result.layers[0] else None
        out.append({"layer": layer.name, "bound (measured energy)": bound,
                    "bound (power law, PSD form)": sample_complexity_psd(layer.k, max(layer.fit.alpha, 0.51), error, delta),
                    "simulated mean error <= e at s": reached})
    return pd.DataFrame(out)


probes_at(0.1, 0.1)

# %% [markdown]
# An interactive calculator: the bound as a function of the target relative error
# `e`, the failure probability `delta`, the number of bases `n` and the exponent
# `a` (for a PSD Hessian, so no spectrum scale is needed). Once `a > 1/2` it
# grows with `n` only through `n zeta(2a)` (linearly) and `ln(2n/delta)`: no
# higher power of `n`, however slowly the eigenvalues decay.
# (Move the sliders in a live kernel.)

# %%
e_slider = widgets.FloatLogSlider(value=0.1, base=10, min=-2, max=0, step=0.1, description="error e")
d_slider = widgets.FloatLogSlider(value=0.1, base=10, min=-3, max=-0.3, step=0.1, description="delta")
n_slider = widgets.IntSlider(value=128, min=8, max=4096, step=8, description="bases n")
a_slider = widgets.FloatSlider(value=max(result.layers[0].fit.alpha, 0.55), min=0.55, max=3.0, step=0.05,
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
           "simulated_error": {str(s): e for s, e in errors.items()}, "predicted_error": dict(zip(probe_counts, predicted))}
alphas = ", ".join(f"{s.fit.alpha:.2f}" for s in result.layers)
print(f"Result: top-{settings.spectrum_k} Hessian spectra of {len(result.layers)} layers, fitted a = {alphas} "
      f"(envelope a > 1/2 in {sum(s.fit.alpha_envelope > 0.5 for s in result.layers)}/{len(result.layers)}); "
      f"{first.name}: bound {probes_needed(eig, 0.1, 0.1):,} probes for e = delta = 0.1, simulated error "
      f"{errors[probe_counts[-1]]:.3f} at {probe_counts[-1]} probes; ran in {time.perf_counter() - start:.0f} s")

# %% [markdown]
# ## Recap
#
# * The Hutchinson estimator's variance is set by the Hessian's off-diagonal
#   mass, `||H||_F^2 - ||diag H||^2`, divided by the number of probes `s`.
# * Under a power-law spectrum `|lambda_k| <= |lambda_1| k^-a` with `a > 1/2`,
#   `||H||_F^2 <= |lambda_1|^2 H_{n,2a} <= |lambda_1|^2 zeta(2a)`: a variance
#   bound that does not grow with the number of bases.
# * The measured spectra were fitted with a power law; the envelope exponent,
#   not the fitted slope, is what the theory's assumption needs.
# * The sample-complexity bound is a worst case: compare it with the number of
#   probes the simulation on the measured Hessian needed for the same error.
#
# In numbers, this run:

# %%
display(Markdown(
    "\n".join(f"* {s.name}: fitted a = {s.fit.alpha:.2f}, envelope a = {s.fit.alpha_envelope:.2f}"
              for s in result.layers)
    + f"\n* {first.name}: bound {probes_needed(eig, 0.1, 0.1):,} probes for e = delta = 0.1; simulated error "
      f"{errors[1]:.2f} with 1 probe, {errors[probe_counts[-1]]:.3f} with {probe_counts[-1]}"))

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
