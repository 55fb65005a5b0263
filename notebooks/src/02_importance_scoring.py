# Source of notebooks/02_importance_scoring.ipynb (build: python notebooks/build.py).

# %% [markdown]
# # 02 · Importance scoring: which bases can go?
#
# Notebook 01 rewrote each layer as `W~ = sum_i sigma_i u_i v_i^T (+ aux)`. Dropping
# basis `i` means setting `sigma_i` to zero, a step of `-sigma_i` along one
# coordinate. A second-order Taylor expansion of the task loss `l` predicts what
# that step costs:
#
# $$I_i \;=\; -\sigma_i\,\mathbb{E}\!\left[\frac{\partial l}{\partial \sigma_i}\right] \;+\; \tfrac12\,\sigma_i^2\,\mathbb{E}\!\left[\frac{\partial^2 l}{\partial \sigma_i^2}\right].$$
#
# BSI prunes the bases with the smallest `I_i`. This notebook computes every
# ingredient on one real layer:
#
# 1. the gradient `g_i = E[dl/dsigma_i]`;
# 2. the curvature `h_i = E[d2l/dsigma_i^2]`, exactly (double backward) and with
#    the method's symmetric-perturbation estimator, side by side;
# 3. how the estimate depends on the perturbation size `eps` and on the number of probes;
# 4. the candidate pool (the only bases that get probed and may be pruned);
# 5. the importance score against `|sigma_i|` (what Basel uses): where they
#    disagree, and a check against the loss change actually measured.

# %%
import math
import time

import plotly.graph_objects as go
import torch
from IPython.display import Markdown, display
from transformers.utils import logging as hf_logging
from plotly.subplots import make_subplots

from bsi.config import CompressConfig
from bsi.data import BatchStream, load_task
from bsi.method.curvature import profile_batch
from bsi.pipeline.losses import answer_token_loss
from bsi.method.scores import (candidate_pool, eps_rule, importance_scores, pool_rho, probe_vector, select_pruned,
                            symmetric_difference_hessian)
from bsi.models import load_model_and_tokenizer
from bsi.method.surgery import compressible_linear_names
from bsi.teaching import (convert_layer, doc_markdown, exact_hessian, loss_change_when_dropped, mean_gradient,
                          model_sigma_max, notebook_settings, single_probe_estimates)

hf_logging.disable_progress_bar()  # no loading bars between the results
settings = notebook_settings()
start = time.perf_counter()
# eager attention: the exact Hessian below needs double backward, which fused attention kernels lack
model, tokenizer = load_model_and_tokenizer(settings.model, attn_implementation="eager")
task = load_task("embedded-math", test_size=settings.test_size)
stream = BatchStream(task.train, tokenizer, batch_size=settings.profile_batch_size, max_length=settings.max_length,
                     seed=2)
batches = [next(stream) for _ in range(settings.profile_batches)]
loss_fn = answer_token_loss  # mean cross-entropy of the answer tokens: the loss everything here refers to
print(f"{settings.model}; {len(batches)} mini-batches of {tuple(batches[0]['input_ids'].shape)} tokens")

# %% [markdown]
# ## 1. One layer in Basel form, and its gradient
#
# We study the `down_proj` of the **last** block: a backward pass from the loss
# to its sigma crosses only one block, so every gradient below is cheap. Only
# this layer is converted (`bsi.teaching.convert_layer`); the rest of the model
# stays dense and frozen.
#
# The gradient with respect to the coefficients is a plain backward pass:
# `dl/dsigma_i = sum over tokens of (x v_i)(u_i . dl/dy)`. Averaged over the
# mini-batches it gives `g`, and `-sigma_i g_i` is the first-order part of
# `I_i` (the "BSI w/o Hessian" score).

# %%
name = [n for n in compressible_linear_names(model) if n.endswith("mlp.down_proj")][-1]
layer = convert_layer(model, name)
sigma = layer.sigma.detach().clone()  # (r,)
loss, grad = mean_gradient(model, layer, batches, loss_fn)  # float, (r,)
print(f"{name}: rank {layer.rank}; mean loss {loss:.4f}; |g| max {grad.abs().max():.2e}")
fig = make_subplots(rows=1, cols=2, subplot_titles=("gradient g_i", "first-order term -sigma_i g_i"))
fig.add_trace(go.Scatter(y=grad.numpy(), mode="markers", marker={"size": 4}, name="g_i"), row=1, col=1)
fig.add_trace(go.Scatter(y=(-sigma * grad).numpy(), mode="markers", marker={"size": 4}, name="-sigma g"), row=1, col=2)
fig.update_xaxes(title="basis i (0 = largest sigma)")
fig.update_layout(height=340, showlegend=False)
fig.show()

# %% [markdown]
# ## 2. Curvature: the exact diagonal and the symmetric-perturbation estimate
#
# The exact Hessian diagonal needs one double backward per basis, far too
# expensive for 100k bases. The method estimates it from gradients only:

# %%
display(Markdown(doc_markdown(symmetric_difference_hessian)))

# %% [markdown]
# To compare, we take a probe set of a few bases spread over this layer's
# candidate pool (section 4 explains the pool), compute the exact Hessian over
# them (`k` double backwards, `bsi.teaching.exact_hessian`), and draw many
# one-probe estimates on the same mini-batch, each with a fresh Rademacher `z`
# that is zero outside the probe set. The perturbation intensity follows the
# method's rule for float32,
# `eps = min(2^-(f+1) sigma_max / alpha, eps_max)` with `f = 23` fraction bits:

# %%
cfg = CompressConfig(keep_ratio=0.6, rounds=4)  # the default preset's schedule
pool = candidate_pool(sigma, cfg.pool_rho)  # (p,)
pick = torch.linspace(0, pool.numel() - 1, min(settings.exact_positions, pool.numel())).round().long().unique()
positions = pool[pick]  # (k,) the probe set
sigma_max = model_sigma_max(model)
eps = eps_rule(sigma_max, torch.float32)
print(f"sigma_max = {sigma_max:.2f}  ->  eps = {eps:.2e}; probe set: {positions.numel()} of the pool's {pool.numel()} bases")

t0 = time.perf_counter()
H = exact_hessian(model, layer, batches[0], loss_fn, positions)  # (k, k) float64
t_exact = time.perf_counter() - t0
t0 = time.perf_counter()
rows = single_probe_estimates(model, layer, batches[0], loss_fn, positions, eps, settings.probes,
                              torch.Generator().manual_seed(0))[:, positions].double()  # (P, k)
t_probe = (time.perf_counter() - t0) / settings.probes
exact_diag = H.diagonal()
estimate = rows.mean(0)
print(f"exact: {t_exact / positions.numel():.2f} s per basis (double backward); "
      f"estimator: {t_probe:.2f} s per probe (two gradients) for all {positions.numel()} bases at once")

fig = go.Figure()
fig.add_trace(go.Scatter(x=positions.numpy(), y=exact_diag.numpy(), mode="markers", name="exact diag H",
                         marker={"size": 10, "symbol": "circle-open"}))
fig.add_trace(go.Scatter(x=positions.numpy(), y=estimate.numpy(), mode="markers",
                         name=f"estimate, {settings.probes} probes", marker={"size": 6}))
fig.add_trace(go.Scatter(x=positions.numpy(), y=rows[0].numpy(), mode="markers", name="estimate, 1 probe",
                         marker={"size": 5, "symbol": "x"}))
fig.update_layout(height=360, title=f"Hessian diagonal of {name} on the probe set",
                  xaxis_title="basis i", yaxis_title="d2l/dsigma_i^2")
fig.show()
rel = float((estimate - exact_diag).norm() / exact_diag.norm())
print(f"relative error of the {settings.probes}-probe estimate: {rel:.3f}")

# %% [markdown]
# Why one probe is noisy: `z_i (H z)_i = H_ii + sum_{j != i} H_ij z_i z_j`. The
# cross terms average to zero over random signs, but each probe carries them, so
# the variance of one probe is `sum_{j != i} H_ij^2`: the **off-diagonal** mass of
# the Hessian. Here is `H` on the probe set:

# %%
fig = go.Figure(go.Heatmap(z=H.numpy(), x=[str(int(p)) for p in positions], y=[str(int(p)) for p in positions],
                           colorscale="RdBu", zmid=0))
fig.update_layout(height=420, width=480, title="exact Hessian over the probe set", yaxis_autorange="reversed")
fig.show()
off = H - torch.diag(exact_diag)
print(f"||diag H|| = {exact_diag.norm():.3e}, ||off-diagonal|| = {off.norm():.3e}")

# %% [markdown]
# ## 3. How many probes, and which eps?
#
# **Probes.** Averaging `s` independent probes divides the variance by `s`, so the
# expected relative error falls like
# `sqrt(||H - diag H||_F^2 / s) / ||diag H||`. The measured curve (mean over
# disjoint groups of probes) follows that line, computed from the exact `H`.
# Notebook 04 turns this into the method's sample-complexity bound.

# %%
sizes = [s for s in (1, 2, 4, 8, 16, 32, 64, 128) if s <= rows.shape[0]]
measured = []
for s in sizes:
    groups = rows[: (rows.shape[0] // s) * s].reshape(-1, s, rows.shape[1]).mean(1)  # (G, k)
    measured.append(float(((groups - exact_diag).norm(dim=1) / exact_diag.norm()).mean()))
predicted = [float(off.norm() / s**0.5 / exact_diag.norm()) for s in sizes]
fig = go.Figure([go.Scatter(x=sizes, y=measured, mode="lines+markers", name="measured"),
                 go.Scatter(x=sizes, y=predicted, mode="lines", name="theory sqrt(||off||^2/s)/||diag||",
                            line={"dash": "dash"})])
fig.update_xaxes(type="log", title="probes s")
fig.update_yaxes(type="log", title="relative error of the diagonal")
fig.update_layout(height=340, title="Error against the number of probes")
fig.show()

# %% [markdown]
# **eps.** Fix one probe `z` and vary `eps`. The exact target is `z * (H z)`. Too
# small an `eps` and the two gradients differ by less than float32 can resolve
# (round-off error grows like `1/eps`); too large and the third-order Taylor
# terms show up (error grows like `eps^2`). The rule only guards the first side,
# and conservatively: it asks that rounding stay within `alpha = 1%` of `eps` for
# the *largest* sigma in the model, whatever the layer; `eps_max = 0.1` caps the
# other side. The curve shows where this layer's valley actually lies.

# %%
zk = probe_vector(layer.rank, positions, torch.Generator().manual_seed(7))[positions].double()  # (k,) one fixed z
target = zk * (H @ zk)  # what a one-probe estimate with this z should return
rel_by_eps = []
for e in settings.eps_values:  # the same seed draws the same z inside the estimator
    row = single_probe_estimates(model, layer, batches[0], loss_fn, positions, e, 1,
                                 torch.Generator().manual_seed(7))[0, positions].double()  # (k,)
    rel_by_eps.append(float((row - target).norm() / target.norm()))
fig = go.Figure(go.Scatter(x=list(settings.eps_values), y=rel_by_eps, mode="lines+markers"))
fig.add_vline(x=eps, line_dash="dot", annotation_text=f"rule: {eps:.1e}")
fig.update_xaxes(type="log", title="eps")
fig.update_yaxes(type="log", title="relative error vs exact z*(Hz)")
fig.update_layout(height=340, title="One probe, varying the perturbation intensity")
fig.show()
nearest = min(range(len(rel_by_eps)), key=lambda n: abs(math.log(settings.eps_values[n] / eps)))
best = min(range(len(rel_by_eps)), key=rel_by_eps.__getitem__)
print(f"error near the rule's eps ({settings.eps_values[nearest]:.0e}): {rel_by_eps[nearest]:.1e}; "
      f"smallest error {rel_by_eps[best]:.1e} at eps = {settings.eps_values[best]:.0e}")

# %% [markdown]
# ## 4. The candidate pool
#
# Probing every basis of every layer would waste probes (and variance) on bases
# that will never be pruned: the large ones. Each round, only a *pool* of the
# smaller bases is probed and may be pruned:

# %%
display(Markdown(doc_markdown(candidate_pool)))

# %%
fig = go.Figure()
in_pool = torch.zeros(layer.rank, dtype=torch.bool)
in_pool[pool] = True
fig.add_trace(go.Bar(x=torch.nonzero(~in_pool).flatten().numpy(), y=sigma[~in_pool].numpy(), name="protected (K)"))
fig.add_trace(go.Bar(x=pool.numpy(), y=sigma[pool].numpy(), name="candidate pool C"))
fig.update_layout(height=320, bargap=0, title=f"rho = KeepRatio^(gamma/T) = {cfg.pool_rho:.3f}: pool of {pool.numel()} / {layer.rank}",
                  xaxis_title="basis i", yaxis_title="sigma_i")
fig.show()
for gamma in (0.5, 1.0, 2.0, 4.0):
    rho = pool_rho(0.6, gamma, 4)
    print(f"gamma {gamma:>3}: rho = {rho:.3f}, pool = {candidate_pool(sigma, rho).numel():>4} of {layer.rank} bases")

# %% [markdown]
# ## 5. Importance against |sigma|
#
# Now the real thing on the whole pool: over the profiling mini-batches,
# `bsi.method.curvature.profile_batch` returns the gradient and a Hessian-diagonal
# estimate (here two probes per batch, this layer only). From them, three scores:
#
# * **BSI**: `I_i = -sigma_i g_i + 1/2 sigma_i^2 h_i` (the predicted loss increase);
# * **BSI w/o Hessian**: `-sigma_i g_i`;
# * **Basel**: `|sigma_i|` (magnitude after re-learning).
#
# Each prunes from the pool by the same importance-mass rule (keep the most
# important bases holding `KeepRatio^(1/T)` of the pool's positive importance).

# %%
grads, hessians = torch.zeros(layer.rank), torch.zeros(layer.rank)
generator = torch.Generator().manual_seed(1)
for b in batches:
    result = profile_batch(model, [layer], [pool], b, loss_fn, eps=eps, scope="layer", probes=2, generator=generator)
    grads += result.grads[0] / len(batches)
    hessians += result.hessians[0] / len(batches)
scores = {s: importance_scores(sigma, grads, hessians, s) for s in ("bsi", "bsi-grad", "basel")}
pruned = {s: set(select_pruned(scores[s], pool, cfg.keep_per_round).tolist()) for s in scores}
for s in scores:
    print(f"{s:>8}: prunes {len(pruned[s]):>4} of the pool's {pool.numel()} bases")
both = pruned["bsi"] & pruned["basel"]
print(f"BSI and Basel agree on {len(both)} bases; only BSI prunes {len(pruned['bsi'] - pruned['basel'])}, "
      f"only Basel prunes {len(pruned['basel'] - pruned['bsi'])}")

# %%
def category(i):
    a, b = i in pruned["bsi"], i in pruned["basel"]
    return "both prune" if a and b else "only BSI prunes" if a else "only Basel prunes" if b else "both keep"

cats = [category(int(i)) for i in pool]
fig = go.Figure()
for c, color in (("both keep", "#999"), ("both prune", "#333"), ("only BSI prunes", "#d62728"),
                 ("only Basel prunes", "#1f77b4")):
    idx = [n for n, x in enumerate(cats) if x == c]
    if idx:
        fig.add_trace(go.Scatter(x=sigma[pool[idx]].abs().numpy(), y=scores["bsi"][pool[idx]].numpy(),
                                 mode="markers", name=c, marker={"color": color, "size": 6},
                                 text=[f"basis {int(pool[n])}" for n in idx]))
fig.add_hline(y=0, line_width=1)
fig.update_layout(height=420, title="BSI importance against |sigma| over the candidate pool",
                  xaxis_title="|sigma_i| (Basel's score)", yaxis_title="I_i (predicted loss increase)")
fig.show()
rank = lambda t: torch.argsort(torch.argsort(t)).float()  # noqa: E731
spearman = float(torch.corrcoef(torch.stack([rank(scores["bsi"][pool]), rank(sigma[pool].abs())]))[0, 1])
print(f"rank correlation of I and |sigma| over the pool: {spearman:.2f}")

# %% [markdown]
# **Why the disagreement matters.** `|sigma_i|` says how much of a basis the layer
# uses, not how much the *task* needs it: a small basis can carry exactly the
# direction the answers depend on (large curvature, `I_i` high), and a large one
# can be one the task does not care about, or even one whose removal lowers the
# loss (`I_i < 0`, removed first by BSI, kept by Basel as long as it is large).
#
# Is the prediction right? Drop some of the disputed bases one at a time and
# measure the loss change on the same mini-batches (`bsi.teaching.loss_change_when_dropped`):

# %%
only_bsi = sorted(pruned["bsi"] - pruned["basel"], key=lambda i: float(scores["bsi"][i]))[:4]
only_basel = sorted(pruned["basel"] - pruned["bsi"], key=lambda i: -float(scores["bsi"][i]))[:4]
extremes = [int(pool[torch.argmax(scores["bsi"][pool])]), int(pool[torch.argmin(scores["bsi"][pool])])]
check = list(dict.fromkeys(only_bsi + only_basel + extremes))
measured_change = loss_change_when_dropped(model, layer, batches, loss_fn, check)
fig = go.Figure()
fig.add_trace(go.Scatter(x=scores["bsi"][check].numpy(), y=measured_change.numpy(), mode="markers+text",
                         name="BSI (with Hessian)", text=[str(i) for i in check], textposition="top center"))
fig.add_trace(go.Scatter(x=scores["bsi-grad"][check].numpy(), y=measured_change.numpy(), mode="markers",
                         name="gradient term only", marker={"symbol": "x"}))
lo, hi = float(measured_change.min()), float(measured_change.max())
fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="prediction = measurement", line={"dash": "dot"}))
fig.update_layout(height=400, title="Predicted against measured loss change of dropping one basis",
                  xaxis_title="predicted", yaxis_title="measured")
fig.show()
for i, m in zip(check, measured_change.tolist()):
    print(f"basis {i:>4}: sigma {sigma[i]:8.4f}  predicted {scores['bsi'][i]: .2e}  "
          f"(gradient only {scores['bsi-grad'][i]: .2e})  measured {m: .2e}  [{category(i)}]")

# %%
err_bsi = float((scores["bsi"][check] - measured_change).abs().mean())
err_grad = float((scores["bsi-grad"][check] - measured_change).abs().mean())
print(f"Result: on {name}, {settings.probes}-probe Hessian diagonal within {rel:.0%} of exact; BSI and Basel "
      f"disagree on {len((pruned['bsi'] ^ pruned['basel']))} of {pool.numel()} pool bases; mean |prediction error| "
      f"{err_bsi:.1e} with Hessian vs {err_grad:.1e} without; ran in {time.perf_counter() - start:.0f} s")
