# Source of notebooks/01_reparameterization.ipynb (build: python notebooks/build.py).

# %% [markdown]
# # 01 · Re-parameterization: a linear layer as a sum of bases
#
# BSI never edits a weight matrix directly. It first rewrites every linear layer
# as a weighted sum of rank-one *bases*, and from then on it only learns, scores
# and removes the *weights* of that sum. This notebook takes one real layer of the
# embedded model (SmolLM2-135M-Instruct) apart:
#
# 1. its SVD and singular-value spectrum;
# 2. the **Basel form** and why it computes exactly what the layer did;
# 3. two choices of bases, the plain SVD and the SVD on *whitened* task inputs:
#    both exact, but very different once bases are dropped;
# 4. what keeping `r` bases costs, and the rank below which it pays off;
# 5. the whole model converted, with a table of layers and ranks.
#
# Set `BSI_NOTEBOOK_MODEL=tiny-random-llama` before starting Jupyter to run
# everything on a tiny random model in seconds (CI does).

# %%
import time

import pandas as pd
import plotly.graph_objects as go
import torch
from IPython.display import Markdown, display
from plotly.subplots import make_subplots
from transformers.utils import logging as hf_logging

import bsi.method.bases
import bsi.method.layers
from bsi.analysis.spectrum import layer_kind
from bsi.data import BatchStream, load_task
from bsi.method.bases import svd_bases, whitened_bases
from bsi.method.layers import BasisLinear, break_even_rank, factor_cost
from bsi.method.surgery import (compressible_linear_names, compressible_parameters, model_parameters, sigma_max,
                                to_basis_form)
from bsi.models import load_model_and_tokenizer
from bsi.pipeline.baselines import input_statistics
from bsi.teaching import doc_markdown, notebook_settings, rank_table, result_of, truncation_errors

hf_logging.disable_progress_bar()  # no loading bars between the results
settings = notebook_settings()
start = time.perf_counter()
model, tokenizer = load_model_and_tokenizer(settings.model)
task = load_task("embedded-math", test_size=settings.test_size)
stream = BatchStream(task.train, tokenizer, batch_size=settings.batch_size, max_length=settings.max_length)
calibration = [next(stream) for _ in range(settings.calibration_batches)]  # sets the whitened bases
held_out = [next(stream) for _ in range(settings.calibration_batches)]  # other task batches: where errors are measured
print(f"model {settings.model}: {model_parameters(model):,} parameters, "
      f"{len(compressible_linear_names(model))} compressible linear layers; "
      f"{len(calibration)} + {len(held_out)} batches of {tuple(calibration[0]['input_ids'].shape)} tokens")

# %% [markdown]
# ## 1. One layer and its singular values
#
# Take the MLP's output projection `down_proj` of a block in the middle of the
# network. Its weight `W` has shape `(out, in)`; the layer computes `y = x W^T`.
# The thin SVD writes it as
#
# $$W = \sum_{i=1}^{r} \sigma_i\, u_i v_i^\top, \qquad r = \min(\text{in}, \text{out}),$$
#
# with orthonormal `u_i` (columns of `U`), orthonormal `v_i` (columns of `V`) and
# `sigma_1 >= sigma_2 >= ... >= 0`. Each rank-one matrix `u_i v_i^T` is a
# **basis**; `sigma_i` is how much of it the layer uses.

# %%
names = compressible_linear_names(model)
down = [n for n in names if n.endswith("mlp.down_proj")]
name = down[len(down) // 2]
linear = model.get_submodule(name)
U, sigma, V = plain = svd_bases(linear.weight)  # (out, r), (r,), (in, r)
print(f"{name}: W {tuple(linear.weight.shape)} -> U {tuple(U.shape)}, sigma {tuple(sigma.shape)}, V {tuple(V.shape)}")
print(f"largest sigma {sigma[0]:.2f}, smallest {sigma[-1]:.4f}, "
      f"reconstruction error max|U diag(sigma) V^T - W| = {((U * sigma) @ V.T - linear.weight).abs().max():.2e}")

# %% [markdown]
# The spectrum is the list of `sigma_i`. Plain SVD compression keeps the largest
# ones; the right-hand panel shows how much of the layer's *sigma mass*
# (`sum sigma_i`, the quantity the candidate pool of notebook 02 uses) and of its
# energy (`sum sigma_i^2`, the Frobenius norm squared) the top `k` bases hold. A
# slowly decaying spectrum means no small set of bases is obviously enough: which
# ones the *task* needs is the question BSI answers.

# %%
k = torch.arange(1, sigma.numel() + 1)
mass = (sigma.cumsum(0) / sigma.sum()).numpy()
energy = (sigma.square().cumsum(0) / sigma.square().sum()).numpy()
fig = make_subplots(rows=1, cols=2, subplot_titles=("singular values", "share held by the top-k bases"))
fig.add_trace(go.Scatter(x=k, y=sigma.numpy(), mode="lines", name="sigma_i"), row=1, col=1)
fig.add_trace(go.Scatter(x=k, y=mass, name="sigma mass"), row=1, col=2)
fig.add_trace(go.Scatter(x=k, y=energy, name="energy (sigma^2)"), row=1, col=2)
fig.update_yaxes(type="log", title="sigma_i", row=1, col=1)
fig.update_xaxes(title="index i (sorted)")
fig.update_layout(height=380, title=f"Spectrum of {name}")
fig.show()
for share in (0.5, 0.9):
    print(f"{share:.0%} of the sigma mass: top {int((mass < share).sum()) + 1} of {sigma.numel()} bases; "
          f"{share:.0%} of the energy: top {int((energy < share).sum()) + 1}")

# %% [markdown]
# ## 2. The Basel form, exact at start
#
# BSI (like Basel before it) replaces the layer by `BasisLinear`. Here is its
# module's docstring, the code's own explanation:

# %%
display(Markdown(doc_markdown(bsi.method.layers)))

# %% [markdown]
# Two reasons make it exact at start: `sigma` starts at the singular values, so
# `U diag(sigma) V^T` *is* `W` up to float32 round-off; and the auxiliary term
# `U_aux V_aux^T` starts at zero because `U_aux` is zero (only `V_aux` is random,
# so that gradients can flow into `U_aux` from the first step, as in LoRA). Only
# the `TRAINABLE_PARAMETERS` learn while pruning; the bases are frozen.

# %%
layer = BasisLinear.from_linear(linear, aux_rank=8)
print(layer)
print(f"max |W~ - W| = {(layer.dense_weight() - linear.weight).abs().max():.2e}")
print(f"aux_u is all zeros: {bool((layer.aux_u == 0).all())}; aux_v has norm {layer.aux_v.norm():.2f}")
print(f"trained while pruning: {BasisLinear.TRAINABLE_PARAMETERS}; frozen: {BasisLinear.FROZEN_PARAMETERS}")

# %% [markdown]
# ## 3. Which bases? Plain SVD against whitened inputs
#
# Any factorisation `W = U diag(sigma) V^T` gives an exact Basel form. What the
# choice decides is what *dropping* bases costs, and the plain SVD optimises the
# wrong thing: the weight, not the layer's output on the task's inputs.

# %%
display(Markdown(doc_markdown(bsi.method.bases)))

# %% [markdown]
# The covariance of the layer's inputs comes from forward passes over a few task
# batches (`bsi.pipeline.baselines.input_statistics`, the calibration the engine
# and SVD-LLM run). We measure it twice: on the calibration batches, which set the
# whitened bases, and on *other* task batches, where the errors below are measured.
#
# The error of keeping the first `k` bases is computed exactly from the bases and
# a covariance (`bsi.teaching.truncation_errors`): with the identity as covariance
# it is the weight error `||W - W_k||_F / ||W||_F`; with the held-out inputs' it is
# the relative output error on task text.

# %%
display(Markdown(doc_markdown(truncation_errors)))

# %%
covariance = result_of(input_statistics(model, {name: linear}, iter(calibration), len(calibration),
                                        covariance=True)).covariance()[name]  # (in, in)
test_covariance = result_of(input_statistics(model, {name: linear}, iter(held_out), len(held_out),
                                             covariance=True)).covariance()[name]  # (in, in)
whitened = whitened_bases(linear.weight, covariance)  # (U, sigma, V) in which truncation minds the outputs
identity = torch.eye(linear.in_features)
errors = {label: {"weight": truncation_errors(linear.weight, bases, identity),
                  "output": truncation_errors(linear.weight, bases, test_covariance)}
          for label, bases in (("plain SVD", plain), ("whitened", whitened))}
for label, e in errors.items():
    print(f"{label:>9}: all {sigma.numel()} bases kept -> weight error {e['weight'][-1]:.1e}, "
          f"output error on held-out inputs {e['output'][-1]:.1e}  (exact)")

# %%
share = torch.arange(sigma.numel() + 1) / sigma.numel()
fig = make_subplots(rows=1, cols=2, subplot_titles=("weight error ||W - W_k|| / ||W||",
                                                    "output error on held-out task inputs"))
for label, color in (("plain SVD", "#1f77b4"), ("whitened", "#d62728")):
    for col, kind in ((1, "weight"), (2, "output")):
        fig.add_trace(go.Scatter(x=share, y=errors[label][kind], name=label, line={"color": color},
                                 showlegend=col == 1), row=1, col=col)
fig.update_xaxes(title="share of bases kept, k / r")
fig.update_yaxes(range=[0, 1.05])
fig.update_layout(height=380, title=f"Truncating {name}: the first k bases of each factorisation")
fig.show()
half = sigma.numel() // 2
output_at_half = {label: float(e["output"][half]) for label, e in errors.items()}
print(f"keeping half the bases: weight error {errors['plain SVD']['weight'][half]:.2f} (plain) vs "
      f"{errors['whitened']['weight'][half]:.2f} (whitened); output error {output_at_half['plain SVD']:.3f} "
      f"(plain) vs {output_at_half['whitened']:.3f} (whitened)")

# %% [markdown]
# The plain SVD wins on the left by construction (Eckart-Young), and loses on the
# right, which is what the model feels: the task's activations are far from
# isotropic, so directions of `W` they rarely excite are cheap to drop even when
# their singular value is large. In the whitened bases, `sigma_i^2` is exactly the
# mean squared change of the output when basis `i` alone is dropped, so even the
# plain magnitude `|sigma_i|` (Basel's score) means something for the task there.
# This is why `compress.bases` defaults to `whitened`.

# %% [markdown]
# ## 4. What keeping `r` bases costs
#
# A layer that keeps `r` bases and `a` auxiliary vectors is exported as two
# factors, `A = [U diag(sigma), U_aux]` of shape `(out, r+a)` and
# `B = [V, V_aux]^T` of shape `(r+a, in)`: sigma folds into `A`, so it costs
# nothing extra.

# %%
display(Markdown(doc_markdown(factor_cost)))
display(Markdown(doc_markdown(break_even_rank)))

# %% [markdown]
# At full rank the factors cost *more* than the matrix, so a layer saves nothing
# until it has lost `full rank - r*` bases; above `r*` the exporter simply
# stores it dense.

# %%
aux = 8
fin, fout = linear.in_features, linear.out_features
ranks = torch.arange(0, min(fin, fout) + 1)
fig = go.Figure()
fig.add_trace(go.Scatter(x=ranks, y=[factor_cost(fin, fout, int(r), aux) for r in ranks], name="factors (r+a)(in+out)"))
fig.add_trace(go.Scatter(x=ranks, y=[fin * fout] * len(ranks), name="dense in*out", line={"dash": "dash"}))
r_star = break_even_rank(fin, fout, aux)
fig.add_vline(x=r_star, line_dash="dot", annotation_text=f"break-even r* = {r_star:.0f}")
fig.update_layout(height=350, title=f"Parameters of {name} ({fout}x{fin}) by rank, a = {aux}",
                  xaxis_title="bases kept r", yaxis_title="parameters")
fig.show()

# %% [markdown]
# Every kind of layer in the model, with its break-even rank (the share of the
# full rank a layer must fall below before it saves a single parameter):

# %%
shapes = {}
for n in names:
    m = model.get_submodule(n)
    shapes.setdefault(layer_kind(n), (m.in_features, m.out_features))
kinds = pd.DataFrame([
    {"kind": kind, "in": i, "out": o, "dense params": i * o, "full rank": min(i, o),
     f"break-even rank (a={aux})": round(break_even_rank(i, o, aux)),
     "share of full rank": break_even_rank(i, o, aux) / min(i, o)}
    for kind, (i, o) in shapes.items()
])
kinds.style.format({"share of full rank": "{:.0%}", "dense params": "{:,}"})

# %% [markdown]
# ## 5. The whole model in Basel form
#
# `bsi.method.surgery.to_basis_form` does the same for every linear layer except the
# embeddings (and an output layer tied to them, which *is* the embedding). We give
# it the whitened bases of every layer, from one calibration pass over all of them,
# as the engine does before its first round:

# %%
display(Markdown(doc_markdown(to_basis_form)))

# %%
model.eval()
with torch.no_grad():
    logits_before = model(input_ids=held_out[0]["input_ids"], attention_mask=held_out[0]["attention_mask"]).logits
t0 = time.perf_counter()
stats = result_of(input_statistics(model, {n: model.get_submodule(n) for n in names}, iter(calibration),
                                   len(calibration), covariance=True))
covariances = stats.covariance()
layers = to_basis_form(model, aux_rank=aux, bases=lambda n, lin: whitened_bases(lin.weight, covariances[n]))
seconds = time.perf_counter() - t0
with torch.no_grad():
    logits_after = model(input_ids=held_out[0]["input_ids"], attention_mask=held_out[0]["attention_mask"]).logits
logit_change = float((logits_after - logits_before).abs().max())
now, dense = compressible_parameters(model)
print(f"{len(layers)} layers calibrated and converted in {seconds:.1f} s; {sum(l.rank for l in layers.values()):,} bases in all")
print(f"max |logit change| on a held-out batch: {logit_change:.2e} (logits reach {logits_before.abs().max():.3g})")
print(f"compressible parameters: stored {now:,} / dense {dense:,} (full rank: every layer is still stored dense)")
trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
print(f"trainable now: {trainable:,} numbers (sigma and auxiliary vectors), of {model_parameters(model):,} parameters")

# %% [markdown]
# The table of layers and ranks (what notebook 03 watches shrink round by round):

# %%
table = pd.DataFrame(rank_table(model)).astype({"block": "Int64"})
print(table.groupby("kind")[["rank", "params", "dense_params"]].agg(["count", "sum"]).to_string())
table.head(14)

# %% [markdown]
# The largest coefficient of each layer, block by block. In whitened bases it is
# the layer's largest output contribution on task inputs, so it follows the scale
# of the activations, not only of the weights. The largest over the whole model,
# `sigma_max` (`bsi.method.surgery.sigma_max`), sets the perturbation intensity
# `eps` of the Hutchinson estimator (notebook 02).

# %%
table["sigma_1"] = [float(layers[n].sigma.detach().max()) for n in table["layer"]]
grid = table.dropna(subset=["block"]).pivot(index="kind", columns="block", values="sigma_1")
fig = go.Figure(go.Heatmap(z=grid.values, x=grid.columns, y=grid.index, colorscale="Viridis",
                           colorbar={"title": "sigma_1"}))
fig.update_layout(height=320, title="Largest coefficient per layer (whitened bases)", xaxis_title="block")
fig.show()
print(f"sigma_max = {sigma_max(model):.1f} in {table.loc[table['sigma_1'].idxmax(), 'layer']}")

# %%
outcome = {"logit_change": logit_change, "logit_scale": float(logits_before.abs().max()),
           "exact_error": {label: float(e["output"][-1]) for label, e in errors.items()},
           "output_error_at_half": output_at_half, "layers": len(layers)}
print(f"Result: {len(layers)} layers ({sum(l.rank for l in layers.values()):,} bases) in Basel form, "
      f"max |logit change| {logit_change:.1e}; keeping half of {name.rsplit('.', 1)[-1]}'s bases loses "
      f"{output_at_half['whitened']:.1%} of its output on held-out task inputs with whitened bases against "
      f"{output_at_half['plain SVD']:.1%} with plain ones; ran in {time.perf_counter() - start:.0f} s")

# %% [markdown]
# ## Recap
#
# * A linear layer is a sum of rank-one bases, `W = sum_i sigma_i u_i v_i^T`;
#   dropping basis `i` means `sigma_i := 0`, and keeping `r` of them costs
#   `r (in + out)` parameters (plus `a (in + out)` for `a` auxiliary vectors).
# * The **Basel form** (`BasisLinear`) is exact at start: the whole model
#   computed the same logits after the conversion (the largest change printed
#   in section 5 is float32 round-off).
# * *Which* factorisation matters once bases go: the plain SVD keeps the weight
#   (Eckart-Young), the whitened SVD keeps the layer's output on the task's
#   inputs. At half the bases, the whitened ones lost less of the output on
#   held-out task batches (the `Result:` line has both figures).
# * A layer saves parameters only below its break-even rank
#   `r* = in*out/(in+out) - a`, about half its full rank: compression only
#   starts paying once a layer has lost half its bases.
#
# In numbers, this run:

# %%
display(Markdown(
    f"* conversion: max logit change {logit_change:.1e} (logits up to {outcome['logit_scale']:.3g})\n"
    f"* {name}, half the bases kept: output error {output_at_half['whitened']:.1%} (whitened) against "
    f"{output_at_half['plain SVD']:.1%} (plain SVD) on held-out inputs\n"
    f"* break-even rank of {name} with a = {aux}: {break_even_rank(fin, fout, aux):.0f} of {min(fin, fout)}"))

# %% [markdown]
# ## What to try
#
# Each exercise runs after the notebook, in the same kernel (it uses the
# variables above). Predict the outcome first, then open the solution.
#
# **1. Damping: far too small and far too large.** `whitened_bases` adds
# `damping * mean(diag C) * I` to the covariance before factorising it. What
# happens to the output error at half the bases when the damping is huge? And
# when it is tiny?
#
# <details><summary>Solution</summary>
#
# ```python
# half = sigma.numel() // 2
# for damping in (1e-6, 1e-3, 1e-1, 10.0, 1e3):
#     damped = whitened_bases(linear.weight, covariance, damping)  # (U, sigma, V)
#     error = float(truncation_errors(linear.weight, damped, test_covariance)[half])
#     print(f"damping {damping:>6g}: output error at half the bases {error:.3f}")
# print(f"plain SVD:       output error at half the bases {output_at_half['plain SVD']:.3f}")
# ```
#
# What you should see: as the damping grows the added identity swamps the
# covariance, `S` becomes a multiple of the identity and the whitened bases
# turn into the plain SVD: the error climbs towards the plain SVD's figure.
# A tiny damping trusts the calibration covariance completely: when the
# calibration batches hold fewer tokens than the layer has inputs, the
# directions they never excited look free to drop, and the held-out error can
# rise again. The default, 1e-3, sits between the two.
#
# </details>
#
# **2. Is one layer typical?** Repeat section 3's comparison at half the bases
# for every compressible layer of the model (the model is now in Basel form;
# `dense_weight()` gives each layer's `W` back). In how many layers do the
# whitened bases lose less output on the held-out batches?
#
# <details><summary>Solution</summary>
#
# ```python
# held = result_of(input_statistics(model, {n: model.get_submodule(n) for n in names}, iter(held_out),
#                                   len(held_out), covariance=True)).covariance()  # name -> (in, in)
# wins = []
# for n in names:
#     w = model.get_submodule(n).dense_weight().detach()  # (out, in), exact: the auxiliary term is zero
#     k = min(w.shape) // 2
#     e_plain = float(truncation_errors(w, svd_bases(w), held[n])[k])
#     e_white = float(truncation_errors(w, whitened_bases(w, covariances[n]), held[n])[k])
#     wins.append(e_white < e_plain)
# print(f"whitened bases lose less output in {sum(wins)} of {len(wins)} layers")
# ```
#
# What you should see: on the embedded model the whitened bases win in most
# layers, often by a wide margin (real activations are far from isotropic). On
# the tiny random model the inputs are close to noise and the two are close,
# so the count there says little.
#
# </details>
#
# **3. Auxiliary vectors: `aux_rank` 0 against 8 and 32.** Predict how the
# break-even rank of `name` moves with the number of auxiliary vectors `a`,
# then check it with `break_even_rank` and `factor_cost`.
#
# <details><summary>Solution</summary>
#
# ```python
# for a in (0, 8, 32):
#     r_star = break_even_rank(fin, fout, a)
#     print(f"a = {a:>2}: break-even rank {r_star:.1f}; 100 bases cost {factor_cost(fin, fout, 100, a):,} "
#           f"parameters (dense {fin * fout:,})")
# ```
#
# What you should see: the break-even rank falls by exactly `a` (each
# auxiliary vector pair costs `in + out`, as much as one basis), and the cost
# of 100 bases grows by `a (in + out)`. Auxiliary vectors are bought with
# bases: at a fixed size, `aux_rank 8` keeps 8 fewer bases per layer.
#
# </details>
#
# ## Further reading
#
# * BSI: Daniel Agyei Asante, Ernie Chang, Yang Li. *Importance-Guided Basis
#   Selection for Low-Rank Decomposition of Large Language Models*.
#   [arXiv:2605.01627](https://arxiv.org/abs/2605.01627), 2026.
# * Basel: Yang Li, Daniel Agyei Asante, Changsheng Zhao, Ernie Chang, Yangyang
#   Shi, Vikas Chandra. *Basis Selection: Low-Rank Decomposition of Pretrained
#   Large Language Models for Target Applications*.
#   [arXiv:2405.15877](https://arxiv.org/abs/2405.15877).
# * [docs/method.md](../docs/method.md), sections 1 (the Basel form) and 2
#   (plain or whitened bases).
# * Next: [02 · Importance scoring](02_importance_scoring.ipynb), which bases
#   can go.
