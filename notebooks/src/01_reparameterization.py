# Source of notebooks/01_reparameterization.ipynb (build: python notebooks/build.py).

# %% [markdown]
# # 01 · Re-parameterization: a linear layer as a sum of bases
#
# BSI never edits a weight matrix directly. It first rewrites every linear layer
# as a weighted sum of *bases* taken from the layer's singular value decomposition,
# and from then on it only learns, scores and removes the *weights* of that sum.
# This notebook takes one real layer of the embedded model (SmolLM2-135M-Instruct)
# apart:
#
# 1. its SVD and singular-value spectrum;
# 2. the **Basel form** and why it computes exactly what the layer did;
# 3. what keeping `r` bases costs, and the rank below which it pays off;
# 4. the whole model converted, with a table of layers and ranks.
#
# Set `BSI_NOTEBOOK_MODEL=tiny-random-llama` before starting Jupyter to run
# everything on a tiny random model in seconds (CI does).

# %%
import time

import pandas as pd
import plotly.graph_objects as go
import torch
from IPython.display import Markdown, display
from transformers.utils import logging as hf_logging
from plotly.subplots import make_subplots

import bsi.method.layers
from bsi.data import BatchStream, load_task
from bsi.method.layers import BasisLinear, svd_bases
from bsi.models import load_model_and_tokenizer
from bsi.method.surgery import compressible_linear_names, compressible_parameters, model_parameters, to_basis_form
from bsi.teaching import (basel_form_error, break_even_rank, capture_inputs, doc_markdown, factor_cost,
                          notebook_settings, rank_table)

hf_logging.disable_progress_bar()  # no loading bars between the results
settings = notebook_settings()
start = time.perf_counter()
model, tokenizer = load_model_and_tokenizer(settings.model)
task = load_task("embedded-math", test_size=settings.test_size)
batch = next(BatchStream(task.train, tokenizer, batch_size=settings.batch_size, max_length=settings.max_length))
print(f"model {settings.model}: {model_parameters(model):,} parameters, "
      f"{len(compressible_linear_names(model))} compressible linear layers; "
      f"a batch of {tuple(batch['input_ids'].shape)} tokens")

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
U, sigma, V = svd_bases(linear.weight)  # (out, r), (r,), (in, r)
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
# docstring, the code's own explanation:

# %%
display(Markdown(doc_markdown(bsi.method.layers)))

# %% [markdown]
# Two reasons make it exact at start: `sigma` starts at the singular values, so
# `U diag(sigma) V^T` *is* `W` up to float32 round-off; and the auxiliary term
# `U_aux V_aux^T` starts at zero because `U_aux` is zero (only `V_aux` is random,
# so that gradients can flow into `U_aux` from the first step, as in LoRA).
# We check both on the activations that really enter this layer when the model
# reads a batch of task text.

# %%
inputs = capture_inputs(model, name, batch)  # (B, T, in)
check = basel_form_error(linear, inputs, aux_rank=8)
layer = BasisLinear.from_linear(linear, aux_rank=8)
print(layer)
print(f"max |W~ - W|            = {check['weight']:.2e}")
print(f"max |y~ - y| on a batch = {check['output']:.2e}   (outputs reach {check['scale']:.3g})")
print(f"aux_u is all zeros: {bool((layer.aux_u == 0).all())}; aux_v has norm {layer.aux_v.norm():.2f}")

# %% [markdown]
# ## 3. What keeping `r` bases costs
#
# A layer that keeps `r` bases and `a` auxiliary vectors is exported as two
# factors, `A = [U diag(sigma), U_aux]` of shape `(out, r+a)` and
# `B = [V, V_aux]^T` of shape `(r+a, in)`: sigma folds into `A`, so it costs
# nothing extra. The price is
#
# $$\text{params}(r) = (r + a)(\text{in} + \text{out}) \quad\text{versus}\quad \text{in}\cdot\text{out} \text{ dense.}$$
#
# Factors are cheaper only below the **break-even rank**
# `r* = in*out/(in+out) - a`. At full rank the factors cost *more* than the
# matrix, so a layer saves nothing until it has lost `full rank - r*` bases;
# above `r*` the exporter simply stores it dense.

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
    shapes.setdefault(n.rsplit(".", 1)[-1], (m.in_features, m.out_features))
kinds = pd.DataFrame([
    {"kind": kind, "in": i, "out": o, "dense params": i * o, "full rank": min(i, o),
     "break-even rank (a=8)": round(break_even_rank(i, o, aux)),
     "share of full rank": break_even_rank(i, o, aux) / min(i, o)}
    for kind, (i, o) in shapes.items()
])
kinds.style.format({"share of full rank": "{:.0%}", "dense params": "{:,}"})

# %% [markdown]
# ## 4. The whole model in Basel form
#
# `bsi.method.surgery.to_basis_form` does the same for every linear layer except the
# embeddings (and an output layer tied to them, which *is* the embedding):

# %%
display(Markdown(doc_markdown(to_basis_form)))

# %%
model.eval()
with torch.no_grad():
    logits_before = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
t0 = time.perf_counter()
layers = to_basis_form(model, aux_rank=aux)
seconds = time.perf_counter() - t0
with torch.no_grad():
    logits_after = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
logit_change = float((logits_after - logits_before).abs().max())
now, dense = compressible_parameters(model)
print(f"{len(layers)} layers converted in {seconds:.1f} s; {sum(l.rank for l in layers.values()):,} bases in all")
print(f"max |logit change| on the batch: {logit_change:.2e} (logits reach {logits_before.abs().max():.3g})")
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
# The largest singular value of each layer, block by block. The largest over the
# whole model, `sigma_max`, sets the perturbation intensity `eps` of the Hessian
# estimator (notebook 02).

# %%
table["sigma_max"] = [float(layers[n].sigma.detach().max()) for n in table["layer"]]
grid = table.dropna(subset=["block"]).pivot(index="kind", columns="block", values="sigma_max")
fig = go.Figure(go.Heatmap(z=grid.values, x=grid.columns, y=grid.index, colorscale="Viridis",
                           colorbar={"title": "sigma_1"}))
fig.update_layout(height=320, title="Largest singular value per layer", xaxis_title="block")
fig.show()
sigma_max = table["sigma_max"].max()
print(f"sigma_max = {sigma_max:.1f} in {table.loc[table['sigma_max'].idxmax(), 'layer']}")

# %%
print(f"Result: {len(layers)} layers ({sum(l.rank for l in layers.values()):,} bases) in Basel form, "
      f"max |logit change| {logit_change:.1e}; {name.rsplit('.', 1)[-1]} pays off below rank {r_star:.0f} "
      f"of {min(fin, fout)}; ran in {time.perf_counter() - start:.0f} s")
