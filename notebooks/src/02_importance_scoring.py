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
# **Where the score comes from, in three lines.** Write `l(sigma)` for the loss
# of one batch as a function of the layer's coefficients and `e_i` for the
# `i`-th unit vector. Removing basis `i` is the step `-sigma_i e_i`:
#
# 1. Expand the loss to second order along that step; only coordinate `i`
#    moves, so only `dl/dsigma_i` and the Hessian's diagonal entry appear:
#    $l(\sigma - \sigma_i e_i) = l(\sigma) - \sigma_i\,\frac{\partial l}{\partial \sigma_i} + \tfrac12\,\sigma_i^2\,\frac{\partial^2 l}{\partial \sigma_i^2} + O(\sigma_i^3)$.
# 2. Take the expectation over the task's batches (the coefficients fixed):
#    $\mathbb{E}[l(\sigma - \sigma_i e_i) - l(\sigma)] \approx -\sigma_i\,\mathbb{E}[\partial l/\partial \sigma_i] + \tfrac12\,\sigma_i^2\,\mathbb{E}[\partial^2 l/\partial \sigma_i^2]$.
# 3. The score `I_i` is this predicted increase of the loss: the basis whose
#    removal is predicted to cost least goes first (a negative `I_i` predicts
#    that removing it *lowers* the loss).
#
# The first term needs the gradient, which a backward pass gives. The second
# needs the Hessian's diagonal `h_i`, which no pass gives directly: it is
# *estimated*, and bsi and the paper estimate it differently. **bsi's default
# curvature is the empirical Fisher** (`compress.curvature = "fisher"`, free
# from the per-example gradients); **the paper's is Hutchinson's estimate with
# symmetric perturbations** of size `eps` (`"hutchinson"`, two extra gradient
# passes per probe). Section 2 compares them, with the table of every default
# where bsi departs from the paper.
#
# BSI prunes the bases with the smallest `I_i`. This notebook computes every
# ingredient on one real layer, then on the whole model:
#
# 1. the scores as the library has them, and the gradient `g_i = E[dl/dsigma_i]`;
# 2. the curvature `h_i ~ E[d2l/dsigma_i^2]`: exactly (double backward), and from the
#    three curvature sources the engine can use (Fisher, sampled Fisher, Hutchinson);
# 3. how the Hutchinson estimate depends on the number of probes and on `eps`;
# 4. the candidate pool (the only bases that get scored and may be pruned);
# 5. the scores' terms and their choices against `|sigma_i|` (what Basel uses),
#    checked against the loss change actually measured;
# 6. the whole model during a real run: each ranking's whole cut, measured on
#    held-out problems.

# %%
import math
import time

import pandas as pd
import plotly.graph_objects as go
import torch
from IPython.display import Markdown, display
from plotly.subplots import make_subplots
from transformers.utils import logging as hf_logging

import bsi.analysis.ranking
import bsi.method.curvature
from bsi.analysis.figures import ranking_figure
from bsi.analysis.ranking import measure_round
from bsi.data import BatchStream, load_task
from bsi.method.bases import whitened_bases
from bsi.method.curvature import Fisher, GradientOnly, Hutchinson, curvature_source, exact_hessian
from bsi.method.schedule import LayerShape, gradual_budgets, select_to_budget
from bsi.method.scores import SCORES, Score, candidate_pool, eps_rule, pool_rho, probe_vector
from bsi.method.surgery import compressible_linear_names, sigma_max, to_basis_form
from bsi.models import load_model_and_tokenizer
from bsi.pipeline.baselines import input_statistics
from bsi.pipeline.evaluate import dataset_loss
from bsi.pipeline.losses import answer_token_loss
from bsi.pipeline.runner import Pipeline
from bsi.teaching import (defaults_table_markdown, doc_markdown, loss_change_when_dropped, notebook_settings,
                          profile_rows, result_of)

hf_logging.disable_progress_bar()  # no loading bars between the results
settings = notebook_settings()
config = settings.pipeline_config().compress  # the pruning settings notebook 03 runs with
start = time.perf_counter()
model, tokenizer = load_model_and_tokenizer(settings.model)
task = load_task("embedded-math", test_size=settings.test_size)
stream = BatchStream(task.train, tokenizer, batch_size=settings.profile_batch_size, max_length=settings.max_length,
                     seed=2)
batches = [next(stream) for _ in range(settings.profile_batches)]
calibration = [next(stream) for _ in range(settings.calibration_batches)]
loss_fn = answer_token_loss  # mean cross-entropy of the answer tokens: the loss everything here refers to
print(f"{settings.model}; {len(batches)} mini-batches of {tuple(batches[0]['input_ids'].shape)} tokens; "
      f"bases: {config.bases}, curvature: {config.curvature}, score: {config.score}")

# %% [markdown]
# ## 1. Scores, one layer, and its gradient
#
# A score is a small object that says what it needs, so the engine measures only
# that, and that exposes its *terms*, the parts it adds up:

# %%
display(Markdown(doc_markdown(Score)))
pd.DataFrame([{"score": s.name, "needs gradient": s.needs_gradient, "needs curvature": s.needs_curvature,
               "loss units": s.loss_units, "what": s.description} for s in SCORES.values()])

# %% [markdown]
# We study the `down_proj` of the **last** block: a backward pass from the loss
# to its sigma crosses only one block, so every gradient below is cheap. Only
# this layer is converted (`to_basis_form(..., names=[name])`), in the bases the
# engine uses by default: the whitened ones of notebook 01, from a few
# calibration batches. The rest of the model stays dense and frozen.
#
# The gradient with respect to the coefficients is a plain backward pass:
# `dl/dsigma_i = sum over tokens of (x v_i)(u_i . dl/dy)`. `GradientOnly`, the
# source the engine profiles with for `bsi-grad`, takes it batch by batch
# (`bsi.teaching.profile_rows` runs a source on one layer, one row per batch);
# averaged, it gives `g`, and `-sigma_i g_i` is the score's first term.

# %%
name = [n for n in compressible_linear_names(model) if n.endswith("mlp.down_proj")][-1]
linear = model.get_submodule(name)
covariance = result_of(input_statistics(model, {name: linear}, iter(calibration), len(calibration),
                                        covariance=True)).covariance()[name]
bases = {name: whitened_bases(linear.weight, covariance, config.whitening_damping)}
layer = to_basis_form(model, aux_rank=0, names=[name], bases=bases)[name]
sigma = layer.sigma.detach().clone()  # (r,)
everything = torch.arange(layer.rank)
losses, grads, _ = profile_rows(GradientOnly(), model, layer, everything, batches, loss_fn)
grad = grads.mean(0)  # (r,)
first_order = SCORES["bsi-grad"].terms(sigma, grad)["gradient"]  # (r,) -sigma_i g_i
print(f"{name}: rank {layer.rank}; mean loss {losses.mean():.4f}; |g| max {grad.abs().max():.2e}")
fig = make_subplots(rows=1, cols=2, subplot_titles=("gradient g_i", "first-order term -sigma_i g_i"))
fig.add_trace(go.Scatter(y=grad.numpy(), mode="markers", marker={"size": 4}, name="g_i"), row=1, col=1)
fig.add_trace(go.Scatter(y=first_order.numpy(), mode="markers", marker={"size": 4}, name="-sigma g"), row=1, col=2)
fig.update_xaxes(title="basis i (0 = largest sigma)")
fig.update_layout(height=340, showlegend=False)
fig.show()

# %% [markdown]
# ## 2. Curvature: the exact diagonal and three sources
#
# The exact Hessian diagonal needs one double backward per basis, far too
# expensive for 100k bases. The engine takes it from one of three sources:

# %%
display(Markdown(doc_markdown(bsi.method.curvature)))

# %% [markdown]
# **The paper and bsi's defaults.** The paper's curvature is Hutchinson's; bsi
# runs the Fisher unless told otherwise (`--curvature hutchinson`, or
# `--protocol paper` for every published setting at once). The table below is
# generated from `bsi.config`, so it states the values the code runs; each
# difference links to where it was measured:

# %%
display(Markdown(defaults_table_markdown("../docs/")))

# %% [markdown]
# To compare, we take a probe set of a few bases spread over this layer's
# candidate pool (section 4 explains the pool) and compute, on each profiling
# batch, the exact Hessian over them (`bsi.method.curvature.exact_hessian`,
# `k` double backwards, which switch the model to eager attention while they
# run: fused attention kernels have no double backward) and each source's
# estimate with the probe set as its
# pool. Hutchinson draws `settings.probes` Rademacher probes per batch with the
# perturbation intensity of the method's rule for float32 (with bsi's floor,
# `eps_floor`): `eps = max(min(2^-(f+1) sigma_max / alpha, eps_max), eps_floor)`,
# `f = 23` fraction bits.

# %%
pool = candidate_pool(sigma, config.pool_rho)  # (p,)
pick = torch.linspace(0, pool.numel() - 1, min(settings.exact_positions, pool.numel())).round().long().unique()
positions = pool[pick]  # (k,) the probe set
probes = config.hutchinson  # the Hutchinson curvature's own settings, eps's rule among them
eps = eps_rule(sigma_max(model), torch.float32, probes.eps_alpha, probes.eps_max, probes.eps_floor)
print(f"sigma_max = {sigma_max(model):.2f}  ->  eps = {eps:.2e}; "
      f"probe set: {positions.numel()} of the pool's {pool.numel()} bases")
# one layer: probing it alone ("layer" scope) or all layers at once ("model") is the same; the averaged
# centre gradient saves the third pass of each probe
hutchinson = Hutchinson(eps=eps, scope="model", center="average")
generator = torch.Generator().manual_seed(0)
t0 = time.perf_counter()
hessians = [exact_hessian(model, layer, b, loss_fn, positions) for b in batches]  # each (k, k) float64
t_exact = (time.perf_counter() - t0) / len(batches)
t0 = time.perf_counter()
probe_rows = [profile_rows(hutchinson, model, layer, positions, [b] * settings.probes, loss_fn, generator)[2]
              [:, positions].double() for b in batches]  # each (P, k): one-probe estimates
t_probe = (time.perf_counter() - t0) / (settings.probes * len(batches))
estimates = {
    "fisher": profile_rows(Fisher(), model, layer, positions, batches, loss_fn)[2][:, positions].double().mean(0),
    "mc-fisher": profile_rows(Fisher(sampled=True), model, layer, positions, batches, loss_fn,
                              torch.Generator().manual_seed(1))[2][:, positions].double().mean(0),
    "hutchinson": torch.cat(probe_rows).mean(0),
}
exact_diag = torch.stack([h.diagonal() for h in hessians]).mean(0)  # (k,) E[d2l/dsigma_i^2] over the batches
print(f"exact: {t_exact / positions.numel():.2f} s per basis (double backward); "
      f"hutchinson: {t_probe:.2f} s per probe (two gradients) for all {positions.numel()} bases at once; "
      f"fisher: free with the gradient")

fig = go.Figure()
fig.add_trace(go.Scatter(x=positions.numpy(), y=exact_diag.numpy(), mode="markers", name="exact diag H",
                         marker={"size": 11, "symbol": "circle-open"}))
for label, symbol in (("fisher", "diamond"), ("mc-fisher", "square"), ("hutchinson", "x")):
    fig.add_trace(go.Scatter(x=positions.numpy(), y=estimates[label].numpy(), mode="markers", name=label,
                             marker={"size": 6, "symbol": symbol}))
fig.update_layout(height=380, title=f"Hessian diagonal of {name} on the probe set, mean over {len(batches)} batches",
                  xaxis_title="basis i", yaxis_title="d2l/dsigma_i^2")
fig.show()
relative_error = {label: float((e - exact_diag).norm() / exact_diag.norm()) for label, e in estimates.items()}
for label, e in estimates.items():
    agree = float(torch.corrcoef(torch.stack([e, exact_diag]))[0, 1])
    print(f"{label:>10}: relative error {relative_error[label]:.2f}, correlation with the exact diagonal {agree:.2f}, "
          f"min {float(e.min()): .1e}")

# %% [markdown]
# Reading it: Hutchinson is unbiased, so its error is pure noise and falls with
# more probes; the two Fisher sources are never negative and cost (almost)
# nothing, but estimate the Gauss-Newton part of the Hessian, not the Hessian:
# where the loss is not at a minimum in sigma the two differ (`docs/curvature.md`
# compares the sources on many layers, with their costs). Why one Hutchinson
# probe is noisy: `z_i (H z)_i = H_ii + sum_{j != i} H_ij z_i z_j`. The cross terms
# average to zero over random signs, but each probe carries them, so the variance
# of one probe is `sum_{j != i} H_ij^2`: the **off-diagonal** mass of the Hessian.
# Here is `H` on the probe set (first batch):

# %%
H = hessians[0]
fig = go.Figure(go.Heatmap(z=H.numpy(), x=[str(int(p)) for p in positions], y=[str(int(p)) for p in positions],
                           colorscale="RdBu", zmid=0))
fig.update_layout(height=420, width=480, title="exact Hessian over the probe set", yaxis_autorange="reversed")
fig.show()
off = H - torch.diag(H.diagonal())
print(f"||diag H|| = {H.diagonal().norm():.3e}, ||off-diagonal|| = {off.norm():.3e}")

# %% [markdown]
# ## 3. How many probes, and which eps?
#
# **Probes.** Averaging `s` independent probes divides the variance by `s`, so the
# expected relative error falls like `sqrt(||H - diag H||_F^2 / s) / ||diag H||`.
# The measured curve (first batch, mean over disjoint groups of probes) follows
# that line, computed from the exact `H`. Notebook 04 turns this into the
# method's sample-complexity bound.

# %%
rows = probe_rows[0]  # (P, k) on the first batch
sizes = [s for s in (1, 2, 4, 8, 16, 32, 64, 128) if s <= rows.shape[0]]
measured = []
for s in sizes:
    groups = rows[: (rows.shape[0] // s) * s].reshape(-1, s, rows.shape[1]).mean(1)  # (G, k)
    measured.append(float(((groups - H.diagonal()).norm(dim=1) / H.diagonal().norm()).mean()))
predicted = [float(off.norm() / s**0.5 / H.diagonal().norm()) for s in sizes]
fig = go.Figure([go.Scatter(x=sizes, y=measured, mode="lines+markers", name="measured"),
                 go.Scatter(x=sizes, y=predicted, mode="lines", name="theory sqrt(||off||^2/s)/||diag||",
                            line={"dash": "dash"})])
fig.update_xaxes(type="log", title="probes s")
fig.update_yaxes(type="log", title="relative error of the diagonal")
fig.update_layout(height=340, title="Hutchinson: error against the number of probes")
fig.show()

# %% [markdown]
# **eps.** Fix one probe `z` and vary `eps`. The exact target is `z * (H z)`. Too
# small an `eps` and the two gradients differ by less than float32 can resolve
# (round-off error grows like `1/eps`); too large and the third-order Taylor
# terms show up (error grows like `eps^2`). The method's rule only guards the
# rounding of `sigma + eps`, asking that it stay within `alpha = 1%` of `eps` for
# the *largest* sigma in the model; bsi's floor guards the round-off of the
# gradients too, and `eps_max` caps the other side. The curve shows where this
# layer's valley actually lies.

# %%
zk = probe_vector(layer.rank, positions, torch.Generator().manual_seed(7))[positions].double()  # (k,) one fixed z
target = zk * (H @ zk)  # what a one-probe estimate with this z should return
rel_by_eps = []
for e in settings.eps_values:  # the same seed draws the same z inside the source
    row = profile_rows(Hutchinson(eps=e, scope="model", center="average"), model, layer, positions, batches[:1],
                       loss_fn, torch.Generator().manual_seed(7))[2][0, positions].double()  # (k,)
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
# Scoring every basis of every layer would waste probes (and variance) on bases
# that will never be pruned: the large ones. Each round, only a *pool* of the
# smaller bases is scored and may be pruned:

# %%
display(Markdown(doc_markdown(candidate_pool)))

# %%
fig = go.Figure()
in_pool = torch.zeros(layer.rank, dtype=torch.bool)
in_pool[pool] = True
fig.add_trace(go.Bar(x=torch.nonzero(~in_pool).flatten().numpy(), y=sigma[~in_pool].numpy(), name="protected (K)"))
fig.add_trace(go.Bar(x=pool.numpy(), y=sigma[pool].numpy(), name="candidate pool C"))
fig.update_layout(height=320, bargap=0, xaxis_title="basis i", yaxis_title="sigma_i",
                  title=f"rho = ratio^(gamma/T) = {config.pool_rho:.3f}: pool of {pool.numel()} / {layer.rank}")
fig.show()
for gamma in (0.5, 1.0, 2.0, 4.0):
    rho = pool_rho(config.size.ratio, gamma, config.rounds)
    print(f"gamma {gamma:>3}: rho = {rho:.3f}, pool = {candidate_pool(sigma, rho).numel():>4} of {layer.rank} bases")

# %% [markdown]
# In size mode `target` the engine widens a round's pools when they are too small
# to meet its parameter budget (`bsi.method.schedule.widen_pools`).
#
# ## 5. The scores' terms, and what each one prunes
#
# Now the real thing on the whole pool, with the engine's curvature source
# (`compress.curvature`) over the profiling batches. Every score in `SCORES` is
# computed from the same `sigma`, `g` and `h`; `bsi`'s two terms show which part
# decides: where the curvature term outweighs the gradient term, the second-order
# correction changes the ranking.

# %%
source = curvature_source(config.curvature, eps=eps)
_, grads, curvatures = profile_rows(source, model, layer, pool, batches, loss_fn, torch.Generator().manual_seed(1))
g, h = grads.mean(0), curvatures.mean(0)  # (r,), (r,) zero outside the pool
scores = {s: SCORES[s](sigma, g, h) for s in SCORES}  # each (r,)
terms = SCORES["bsi"].terms(sigma, g, h)  # {"gradient": (r,), "curvature": (r,)}, their sum is scores["bsi"]
fig = go.Figure(go.Scatter(x=terms["gradient"][pool].numpy(), y=terms["curvature"][pool].numpy(), mode="markers",
                           marker={"size": 5, "color": scores["bsi"][pool].numpy(), "colorscale": "RdBu",
                                   "colorbar": {"title": "I_i"}}))
fig.update_layout(height=380, title=f"bsi's terms over the pool ({source.name} curvature)",
                  xaxis_title="gradient term -sigma_i g_i", yaxis_title="curvature term sigma_i^2 h_i / 2")
fig.show()
share = float((terms["curvature"][pool].abs() > terms["gradient"][pool].abs()).float().mean())
print(f"the curvature term outweighs the gradient term for {share:.0%} of the pool's bases")

# %% [markdown]
# A round removes a parameter budget's worth of bases (size mode `target`). As if
# this layer were the whole model, round 1's budget
# (`bsi.method.schedule.gradual_budgets`) and the engine's selection
# (`select_to_budget`) make every score prune the *same number* of bases; only
# which ones differs.

# %%
shape = LayerShape(layer.in_features, layer.out_features, layer.rank)
budget, measure = gradual_budgets(shape.cost(shape.rank, "factor"), round(config.size.ratio * shape.dense),
                                  config.rounds)[0]
pruned = {s: set(select_to_budget({name: shape}, {name: scores[s]}, {name: pool}, budget, measure)[name].tolist())
          for s in scores}
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
# uses (in whitened bases: how much of its output on task inputs), not how much
# the *task's answers* need it: a small basis can carry exactly the direction the
# answers depend on (`I_i` high), and a large one can be one the answers do not
# care about, or even one whose removal lowers the loss (`I_i < 0`, removed first
# by BSI, kept by Basel as long as it is large).
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
                         name="bsi (with curvature)", text=[str(i) for i in check], textposition="top center"))
fig.add_trace(go.Scatter(x=scores["bsi-grad"][check].numpy(), y=measured_change.numpy(), mode="markers",
                         name="bsi-grad (gradient term only)", marker={"symbol": "x"}))
lo, hi = float(measured_change.min()), float(measured_change.max())
fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="prediction = measurement", line={"dash": "dot"}))
fig.update_layout(height=400, title="Predicted against measured loss change of dropping one basis",
                  xaxis_title="predicted", yaxis_title="measured")
fig.show()
for i, m in zip(check, measured_change.tolist()):
    print(f"basis {i:>4}: sigma {sigma[i]:8.4f}  predicted {scores['bsi'][i]: .2e}  "
          f"(gradient only {scores['bsi-grad'][i]: .2e})  measured {m: .2e}  [{category(i)}]")

# %% [markdown]
# The curvature term is only as good as the source's estimate of the diagonal
# (section 2): where a source overestimates it, the second-order correction moves
# the prediction away from the measurement instead of towards it.

# %% [markdown]
# ## 6. The whole model, during a real run
#
# One layer on two mini-batches is a small sample. The library measures the
# same thing on the whole model of a real run, at the end of each round, with
# the loss on held-out problems, and also measures what a round really does:
# remove its *whole* budget at once. From its docstring:

# %%
display(Markdown(doc_markdown(bsi.analysis.ranking, title=False)))
run_config = settings.pipeline_config({"eval_examples": 0, "validation_size": settings.test_size,
                                       "recover": {"steps": 0}, "compress": {"score": "bsi", "rounds": 2}})
run = Pipeline(run_config)
measured_rounds = []


def measure(compressor, round_scores, pruned):  # the engine's before_cut hook: the model still has every basis
    def held_out() -> float:
        return dataset_loss(compressor.model, run.tokenizer, run.task.validation, batch_size=8)

    names = list(compressor.layers)
    measured_rounds.append(measure_round(compressor.layers, round_scores, compressor.select, pruned, held_out,
                                         probe_layers=[names[len(names) // 2]], singles=settings.ranking_singles,
                                         shares=(0.5,)))


run.before_cut = measure
for _ in run.run():
    pass
cuts = pd.DataFrame([{"round": i + 1, "held-out loss before": r["loss"], **{k: v["loss"] for k, v in r["cuts"].items()}}
                     for i, r in enumerate(measured_rounds)]).set_index("round")
display(Markdown("Held-out loss after removing the round's whole budget, each way (no training in between):"))
display(cuts)
last = measured_rounds[-1]
probed, entry = next(iter(last["layers"].items()))
print(f"{probed}, last round: {len(entry['measured'])} of {entry['pool']} candidates removed one at a time")
ranking_figure({r: (entry["predicted"][r], entry["measured"], entry["spearman"][r]) for r in entry["predicted"]}).show()

# %% [markdown]
# Read the table along a row: `bsi` is the cut the run makes; `magnitude` is
# basel's; the two crossed rows keep one method's *how many per layer* and the
# other's *which inside a layer*. With this notebook's short run the numbers
# are one sample; `bench/ranking.py` measures every round of a longer run, and
# docs/benchmarks.md reports what it found.

# %%
prediction_error = {s: float((scores[s][check] - measured_change).abs().mean()) for s in ("bsi", "bsi-grad")}
outcome = {"relative_error": relative_error, "fisher_min": float(estimates["fisher"].min()),
           "probe_errors": dict(zip(sizes, measured)), "pruned": {s: len(p) for s, p in pruned.items()},
           "terms_add_up": bool(torch.allclose(terms["gradient"] + terms["curvature"], scores["bsi"])),
           "prediction_error": prediction_error,
           "whole_cuts": [{k: v["loss"] for k, v in r["cuts"].items()} | {"before": r["loss"]} for r in measured_rounds]}
print(f"Result: on {name}, Hessian diagonal on {positions.numel()} bases within {relative_error['hutchinson']:.0%} "
      f"of exact with {settings.probes} Hutchinson probes per batch ({relative_error['fisher']:.0%} with the "
      f"Fisher); BSI and Basel disagree on {len(pruned['bsi'] ^ pruned['basel'])} of {pool.numel()} pool bases; "
      f"mean |prediction error| {prediction_error['bsi']:.1e} with curvature vs {prediction_error['bsi-grad']:.1e} "
      f"without; ran in {time.perf_counter() - start:.0f} s")

# %% [markdown]
# ## Recap
#
# * The score is the second-order Taylor prediction of the loss increase of
#   the step `-sigma_i e_i`: `I_i = -sigma_i g_i + sigma_i^2 h_i / 2`, a
#   gradient term and a curvature term in loss units.
# * The gradient is exact and cheap; the curvature is estimated. Hutchinson's
#   symmetric perturbations (the paper's) are unbiased, their error is noise
#   that falls like `1/sqrt(probes)`, set by the Hessian's off-diagonal mass;
#   the Fisher (bsi's default) costs nothing extra and is never negative, but
#   estimates the Gauss-Newton part, not the Hessian.
# * `eps` has a valley: too small and float32 round-off of the two gradients
#   dominates, too large and the third-order terms do.
# * Only a candidate pool of the smaller bases is scored; every score prunes
#   the same budget, and BSI and Basel's `|sigma_i|` disagree on which bases go.
# * Single-basis predictions were checked against the measured loss changes,
#   and on the whole model a round's whole cut was measured each way.
#
# In numbers, this run:

# %%
display(Markdown(
    "\n".join(f"* {label}: relative error of the diagonal {error:.0%}" for label, error in relative_error.items())
    + f"\n* Hutchinson on the first batch: {measured[0]:.0%} error with 1 probe, {measured[-1]:.0%} with {sizes[-1]}"
    + f"\n* BSI and Basel disagree on {len(pruned['bsi'] ^ pruned['basel'])} of {pool.numel()} pool bases"
    + f"\n* mean |predicted - measured| loss change: {prediction_error['bsi']:.1e} with the curvature term, "
      f"{prediction_error['bsi-grad']:.1e} without"))

# %% [markdown]
# ## What to try
#
# Each exercise runs after the notebook, in the same kernel (it uses the
# variables above). Predict the outcome first, then open the solution.
#
# **1. Hutchinson against the Fisher, at a few probe counts.** Average 1, 4 and
# all `settings.probes` Hutchinson probes per batch and compare each diagonal's
# error with the Fisher's. How many probes does Hutchinson need to beat the
# Fisher on this layer, and what does each probe cost?
#
# <details><summary>Solution</summary>
#
# ```python
# for s in sorted({1, 4, settings.probes}):
#     hutch = torch.stack([rows[:s].mean(0) for rows in probe_rows]).mean(0)  # (k,) s probes per batch
#     error = float((hutch - exact_diag).norm() / exact_diag.norm())
#     print(f"hutchinson, {s:>2} probe(s) per batch: relative error {error:.2f} "
#           f"({2 * s} extra gradient passes per batch)")
# print(f"fisher: {relative_error['fisher']:.2f}, mc-fisher: {relative_error['mc-fisher']:.2f} (no extra pass, "
#       f"one extra for mc-fisher)")
# ```
#
# What you should see: Hutchinson's error falls roughly like `1/sqrt(s)` (it is
# noise); the Fisher's is one number, its bias, which no averaging removes.
# Whether Hutchinson passes the Fisher within these probes depends on the
# layer; every probe costs two gradient passes while the Fisher costs none,
# which is why bsi defaults to the Fisher.
#
# </details>
#
# **2. `eps` far too small and far too large.** Extend section 3's sweep to
# `1e-9` and `0.99`. What does the one-probe estimate do at each end?
#
# <details><summary>Solution</summary>
#
# ```python
# for e in (1e-9, 1e-7, eps, 0.5, 0.99):
#     row = profile_rows(Hutchinson(eps=e, scope="model", center="average"), model, layer, positions, batches[:1],
#                        loss_fn, torch.Generator().manual_seed(7))[2][0, positions].double()  # (k,) same z as target
#     print(f"eps {e:8.1e}: relative error against z*(Hz) {float((row - target).norm() / target.norm()):.2e}")
# ```
#
# What you should see: at `1e-9` the two gradients agree to float32 round-off,
# so their difference divided by `eps` is round-off blown up: an error near or
# above 1 (100%). At `0.99` the step is no longer small and the third-order
# terms enter: the error grows again. The rule's `eps` (with bsi's floor) lies
# in between; on the tiny random model the valley is shallower.
#
# </details>
#
# **3. The Taylor score with the exact curvature.** On the probe set,
# predict each basis' loss change with the exact diagonal, with each source's
# estimate and with the gradient term alone, and compare with the measured
# change. How much of the prediction error is the estimate's, and how much the
# expansion's?
#
# <details><summary>Solution</summary>
#
# ```python
# measured_k = loss_change_when_dropped(model, layer, batches, loss_fn, positions.tolist())  # (k,)
# s_k, g_k = sigma[positions], grad[positions]  # (k,), (k,): the coefficients and the batches' mean gradient
# curvatures = {"exact": exact_diag.float(), **{label: e.float() for label, e in estimates.items()},
#               "none (gradient term only)": torch.zeros_like(s_k)}
# for label, h_k in curvatures.items():
#     predicted = -s_k * g_k + 0.5 * s_k**2 * h_k  # the Taylor score of each basis
#     print(f"{label:>26}: mean |predicted - measured| {float((predicted - measured_k).abs().mean()):.2e}")
# ```
#
# What you should see: with the exact diagonal, what is left is the error of
# the expansion itself (the terms of order `sigma_i^3` and up, largest for the
# largest coefficients). An estimated diagonal adds its own error on top, so
# the estimates usually do worse than the exact diagonal, and the source with
# the smaller relative error in section 2 usually predicts better.
#
# </details>
#
# ## Further reading
#
# * BSI: Daniel Agyei Asante, Ernie Chang, Yang Li. *Importance-Guided Basis
#   Selection for Low-Rank Decomposition of Large Language Models*.
#   [arXiv:2605.01627](https://arxiv.org/abs/2605.01627), 2026. The score and
#   the symmetric-perturbation estimator come from there.
# * Basel: Yang Li, Daniel Agyei Asante, Changsheng Zhao, Ernie Chang, Yangyang
#   Shi, Vikas Chandra. *Basis Selection: Low-Rank Decomposition of Pretrained
#   Large Language Models for Target Applications*.
#   [arXiv:2405.15877](https://arxiv.org/abs/2405.15877). Its score is `|sigma_i|`.
# * [docs/method.md](../docs/method.md), sections 3 (scores), 4 (curvature
#   sources, the eps rule) and 5 (the pool); [docs/curvature.md](../docs/curvature.md)
#   compares the sources on many layers.
# * Next: [03 · Pruning rounds](03_pruning_rounds.ipynb), the engine at work.
