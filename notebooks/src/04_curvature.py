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
from bsi.method.theory import (hutchinson_variance, probes_needed, relative_error_by_probes, sample_complexity_psd,
                               variance_bound_frobenius, variance_bound_power_law)
from bsi.models import load_model_and_tokenizer
from bsi.pipeline.losses import answer_token_loss
from bsi.teaching import doc_markdown, notebook_settings

display(Markdown(doc_markdown(bsi.method.theory)))

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
# theory asks for
#
# $$s > 2\left(\frac{|\lambda_1|^2 H_{n,2a}}{\mathrm{Tr}(H)^2/n} - 1\right)\frac{\ln(2n/\delta)}{e^2},
# \qquad s > 2\,(n\,\zeta(2a) - 1)\frac{\ln(2n/\delta)}{e^2} \text{ if } H \succeq 0.$$
#
# `probes_needed` evaluates the first from a measured spectrum (with the measured
# energy `sum lambda_k^2` in place of the power-law sum when no `a` is given).
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
# `a` (for a PSD Hessian, so no spectrum scale is needed). Note how weakly it
# grows with `n` once `a > 1/2`: only through `n zeta(2a)` and `ln(2n/delta)`.
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
