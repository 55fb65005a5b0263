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
# Everything below runs on the **fine-tuned** model, the model the engine
# scores: stage 1 of the run that section 6 studies (the fine-tune notebooks 03
# and 05 share; cached after its first run). Sections 1 to 5 study one layer
# on two mini-batches of a few problems (enough to check the maths, too few
# to rank a layer reliably); section 6 measures the whole model
# on held-out problems. BSI prunes the bases with the smallest `I_i`. The
# notebook computes every ingredient:
#
# 1. the scores as the library has them, and the gradient `g_i = E[dl/dsigma_i]`;
# 2. the curvature `h_i ~ E[d2l/dsigma_i^2]`: exactly (double backward), and from the
#    three curvature sources the engine can use (Fisher, sampled Fisher, Hutchinson);
# 3. how the Hutchinson estimate depends on the number of probes and on `eps`;
# 4. the candidate pool (the only bases that get scored and may be pruned);
# 5. the scores' terms and their choices against `|sigma_i|` (what Basel uses),
#    checked against the loss change actually measured;
# 6. the whole model during a real run: each ranking's whole cut, measured on
#    held-out problems, which separates *how many* bases each layer loses from
#    *which* ones.

# %%
import copy
import math
import time

import ipywidgets as widgets
import plotly.graph_objects as go
import torch
from IPython.display import Markdown, display
from plotly.subplots import make_subplots
from transformers.utils import logging as hf_logging

import bsi.analysis.ranking
import bsi.method.curvature
from bsi.analysis.figures import eps_figure, ranking_figure
from bsi.analysis.ranking import measure_round
from bsi.analysis.stats import Outcomes, paired_difference
from bsi.data import BatchStream
from bsi.method.bases import whitened_bases
from bsi.method.curvature import Fisher, GradientOnly, Hutchinson, curvature_source, exact_hessian
from bsi.method.schedule import LayerShape, gradual_budgets, select_to_budget
from bsi.method.scores import SCORES, Score, candidate_pool, eps_rule, pool_rho, probe_vector
from bsi.method.surgery import basis_layers, compressible_linear_names, to_basis_form
from bsi.pipeline.baselines import input_statistics
from bsi.pipeline.evaluate import evaluate
from bsi.pipeline.losses import answer_token_loss
from bsi.pipeline.runner import Pipeline
from bsi.pipeline.whatif import EpsStudy
from bsi.reports import StageReport
from bsi.teaching import (
    defaults_table_markdown,
    doc_markdown,
    loss_change_when_dropped,
    markdown_rows,
    notebook_settings,
    profile_rows,
    result_of,
)

hf_logging.disable_progress_bar()  # no loading bars between the results
settings = notebook_settings()
start = time.perf_counter()
run = Pipeline(settings.pipeline_config(settings.ranking_work))  # section 6's run; its stage 1 is our model
stage_one = [r for r in run.reference_stage() if isinstance(r, StageReport) and r.stage == "finetune"][-1:]
finetune_s = time.perf_counter() - start
config = settings.pipeline_config().compress  # sections 1-5: the pruning settings of notebook 03's preset
model, tokenizer, task = copy.deepcopy(run.model).eval(), run.tokenizer, run.task  # sections 1-5 work on a copy
model.requires_grad_(False)  # frozen: gradients flow to the converted layer's sigma only
stream = BatchStream(task.train, tokenizer, batch_size=settings.profile_batch_size, max_length=settings.max_length,
                     seed=2)
batches = [next(stream) for _ in range(settings.profile_batches)]
calibration = [next(stream) for _ in range(settings.calibration_batches)]
others = [next(stream) for _ in range(settings.profile_batches)]  # as many other problems, for section 5's check
loss_fn = answer_token_loss  # mean cross-entropy of the answer tokens: the loss everything here refers to


def table(rows: list[dict], fmt: str = ".4f") -> str:
    """Rows with the same keys as a Markdown table; floats formatted with ``fmt``."""
    cell = lambda v: (format(v, fmt) if isinstance(v, float) else str(v)).replace("|", "\\|")  # noqa: E731
    head = list(rows[0])
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(cell(r[k]) for k in head) + " |" for r in rows])


problems = sum(int(b["input_ids"].shape[0]) for b in batches)  # the problems sections 1-5 average over
print(f"{settings.model}, fine-tuned ({'from the cache' if stage_one and stage_one[0].cached else 'just now'}, "
      f"{finetune_s:.0f} s); {len(batches)} mini-batches of {tuple(batches[0]['input_ids'].shape)} tokens "
      f"({problems} problems); "
      f"bases: {config.bases}, curvature: {config.curvature}, score: {config.score}")

# %% [markdown]
# ## 1. Scores, one layer, and its gradient
#
# A score is a small object that says what it needs, so the engine measures only
# that, and that exposes its *terms*, the parts it adds up:

# %%
display(Markdown(doc_markdown(Score, paragraphs=3)))
display(Markdown(table([{"score": s.name, "needs gradient": s.needs_gradient, "needs curvature": s.needs_curvature,
                         "loss units": s.loss_units, "what": s.description} for s in SCORES.values()])))

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
print(f"{name}: rank {layer.rank}; loss on the {len(batches)} mini-batches {losses.mean():.4f}; "
      f"|g| max {grad.abs().max():.2e}")
fig = make_subplots(rows=1, cols=2, subplot_titles=("gradient g_i", "first-order term -sigma_i g_i"))
fig.add_trace(go.Scatter(y=grad.numpy(), mode="markers", marker={"size": 4}, name="g_i"), row=1, col=1)
fig.add_trace(go.Scatter(y=first_order.numpy(), mode="markers", marker={"size": 4}, name="-sigma g"), row=1, col=2)
fig.update_xaxes(title="basis i (0 = largest sigma)")
fig.update_layout(height=340, showlegend=False)
fig.show()

# %% [markdown]
# *What to see:* the gradient (left) takes either sign for bases large and
# small: at a fine-tuned model the mean gradient over a few problems is
# small and mostly their noise. Multiplied by `sigma_i` (right), it is
# largest for the first, largest bases, which the candidate pool (section 4)
# never offers for pruning.
#
# ## 2. Curvature: the exact diagonal and three sources
#
# The exact Hessian diagonal needs one double backward per basis, far too
# expensive for 100k bases. The engine estimates it from one of three sources.
# With the logits `z` of the answer tokens, the Hessian of a cross-entropy loss
# splits in two (the Gauss-Newton decomposition):
#
# $$H \;=\; \underbrace{J^\top \nabla_z^2 l\, J}_{G:\ \text{Gauss-Newton, never negative}} \;+\; \sum_k \frac{\partial l}{\partial z_k}\,\nabla_\sigma^2 z_k,$$
#
# with `J = dz/dsigma`. The second part is weighted by the residuals
# `dl/dz = p - y` (predicted probabilities less the one-hot answer) and
# vanishes where the model predicts its targets.
#
# * **`hutchinson`** (the paper's): `z * (H z)` for random signs `z`, from two
#   gradients at `sigma +- (eps/2) z`. Unbiased for the diagonal of `H`
#   itself; its error is noise, which more probes average away.
# * **`mc-fisher`**, the *sampled* Fisher: squared per-example gradients with
#   the answer tokens *drawn from the model's own predictive distribution*.
#   For a softmax cross-entropy its expectation over the draws is exactly the
#   diagonal of `G`: an unbiased estimate of the Gauss-Newton part, which is
#   biased for `H` only by the residual part.
# * **`fisher`**, the *empirical* Fisher (bsi's default): squared per-example
#   gradients with the *data's* answers. It equals the sampled Fisher only
#   where the data's answers are distributed as the model predicts them; in
#   general it estimates neither `G` nor `H`: it can be larger or smaller than
#   both. Its merits are cost (free with the per-example gradients the
#   backward pass already has) and sign (never negative).
#
# The module's own summary, and where the rest of it is:

# %%
display(Markdown(doc_markdown(bsi.method.curvature, paragraphs=1)))

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
# estimate with the probe set as its pool. Hutchinson draws `settings.probes`
# Rademacher probes per batch with the perturbation intensity of the method's
# rule for float32 (with bsi's floor, `eps_floor`):
# `eps = max(min(2^-(f+1) sigma_max / alpha, eps_max), eps_floor)`, `f = 23`
# fraction bits. `sigma_max` is the largest coefficient of the **whole model**
# in the bases the engine uses, as in notebook 01: the engine perturbs every
# layer at once, so the rule must hold for the largest coefficient anywhere.
# Only one layer is converted here, so for every other layer we compute what
# its largest coefficient would be once converted: the largest singular value
# of `W S`, on this notebook's calibration batches (checked below against the
# converted layer's own SVD).

# %%
def largest_whitened_coefficient(weight, covariance, damping, iters: int = 50) -> float:
    """The largest singular value of `W S`: the layer's largest coefficient once converted to whitened bases.

    `S S^T = C + damping * mean(diag C) * I` (notebook 01's whitening, `C` the inputs' second moment), so the
    value is the square root of the largest eigenvalue of `W (S S^T) W^T`: power iteration finds it without
    forming `S`.
    """
    w, c = weight.detach().double(), covariance.double()  # (out, in), (in, in)
    c = c + damping * c.diagonal().mean() * torch.eye(c.shape[0], dtype=c.dtype)
    u = torch.ones(w.shape[0], dtype=w.dtype)  # (out,)
    for _ in range(iters):
        u = w @ (c @ (w.T @ u))  # (out,)
        u = u / u.norm()
    return float(u @ (w @ (c @ (w.T @ u)))) ** 0.5  # the Rayleigh quotient of the unit vector u


def whitened_sigma_max(model, batches, damping) -> tuple[float, str]:
    """The largest coefficient over every compressible layer in whitened bases, and the layer that holds it."""
    values = {n: float(converted.sigma.detach().abs().max()) for n, converted in basis_layers(model).items()}
    linears = {n: model.get_submodule(n) for n in compressible_linear_names(model)}  # the layers still dense
    covariances = result_of(input_statistics(model, linears, iter(batches), len(batches), covariance=True)).covariance()
    values.update({n: largest_whitened_coefficient(m.weight, covariances[n], damping) for n, m in linears.items()})
    top = max(values, key=values.get)
    return values[top], top


sigma_max, holder = whitened_sigma_max(model, calibration, config.whitening_damping)
check_value = largest_whitened_coefficient(linear.weight, covariance, config.whitening_damping)  # against section 1
print(f"power iteration on {name}'s dense weight: {check_value:.6g}; its whitened SVD: {float(sigma.max()):.6g}")
pool = candidate_pool(sigma, config.pool_rho)  # (p,)
pick = torch.linspace(0, pool.numel() - 1, min(settings.exact_positions, pool.numel())).round().long().unique()
positions = pool[pick]  # (k,) the probe set
probes = config.hutchinson  # the Hutchinson curvature's own settings, eps's rule among them
eps = eps_rule(sigma_max, torch.float32, probes.eps_alpha, probes.eps_max, probes.eps_floor)
eps_layer = eps_rule(float(sigma.abs().max()), torch.float32, probes.eps_alpha, probes.eps_max, probes.eps_floor)
print(f"sigma_max = {sigma_max:.4g} (in {holder})  ->  eps = {eps:.2e}  (this layer's own largest, "
      f"{float(sigma.abs().max()):.4g}, would give {eps_layer:.2e}); probe set: {positions.numel()} of the pool's "
      f"{pool.numel()} bases")
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
                         marker={"size": 13, "symbol": "circle-open", "line": {"width": 2}}))
for label, symbol, size in (("fisher", "diamond", 11), ("mc-fisher", "square", 6), ("hutchinson", "x", 7)):
    fig.add_trace(go.Scatter(x=positions.numpy(), y=estimates[label].numpy(), mode="markers", name=label,
                             marker={"size": size, "symbol": symbol}))
# a log axis: the sources differ by factors (the empirical Fisher's gap below the exact entries would hide under a
# few large values on a linear one); a value at or below zero has no place on it and is counted in the title
left_out = sum(int((e <= 0).sum()) for e in (exact_diag, *estimates.values()))
fig.update_layout(height=380, title=f"Hessian diagonal on the probe set ({len(batches)} batches)"
                  + (f"; {left_out} values <= 0 not drawn" if left_out else ""),
                  xaxis_title="basis i of the layer", yaxis_title="d2l/dsigma_i^2 (log)", yaxis_type="log",
                  yaxis_exponentformat="power")
fig.show()
relative_error = {label: float((e - exact_diag).norm() / exact_diag.norm()) for label, e in estimates.items()}
ratio = {label: float((e / exact_diag).median()) for label, e in estimates.items()}  # > 1: overestimates
display(Markdown(table([{"source": label, "relative error": relative_error[label],
                         "correlation with exact": float(torch.corrcoef(torch.stack([e, exact_diag]))[0, 1]),
                         "median estimate / exact": ratio[label], "smallest value": float(e.min())}
                        for label, e in estimates.items()], ".2g")))

# %% [markdown]
# *What to see:* each source is right where its marker sits inside the
# circle of the exact diagonal. The axis is logarithmic, so the same gap
# anywhere on it is the same factor: a source that sits a fixed distance
# below the circles is off by a constant factor (a bias), one that scatters
# around them is noisy. The relative error is
# `||estimate - exact|| / ||exact||` over the probe set, on the same batches.

# %%
best = min(relative_error, key=relative_error.get)
off_ratio = {label: ratio[label] for label in ("fisher", "mc-fisher")}
display(Markdown(
    f"**Reading it, on this layer and these {problems} problems.** "
    f"The closest source is `{best}` (relative error {relative_error[best]:.0%}). "
    f"Hutchinson's error ({relative_error['hutchinson']:.0%} with {settings.probes} probes per batch) is noise "
    "around the right answer and falls with more probes (section 3). "
    f"The empirical Fisher's typical estimate is {off_ratio['fisher']:.2g} times the exact entry "
    f"(median ratio) and its relative error {relative_error['fisher']:.0%}: a bias, which no averaging removes; "
    f"the sampled Fisher's ratio is {off_ratio['mc-fisher']:.2g} (error {relative_error['mc-fisher']:.0%}), "
    "the Gauss-Newton part plus the noise of its sampled answers. "
    + ("**The two Fisher estimates are identical here**: the fine-tuned model is so sure of these answers "
       f"(loss {losses.mean():.4f}) that drawing the answer tokens from its own predictions gave back the data's "
       "answers every time. The sampled Fisher is unbiased for the Gauss-Newton part only in expectation: the "
       "draws that differ from the data, which carry that expectation, come about as often as the model is wrong, "
       "so one draw per token almost never sees one. "
       if torch.allclose(estimates["fisher"], estimates["mc-fisher"]) else "")
    + ("Both Fisher estimates lie far *below* the exact diagonal: an example's gradient is `J^T (p - y)`, so the "
       "empirical Fisher scales with the squared residuals, which are tiny where the model is right. "
       if max(off_ratio.values()) < 0.5 else "")
    + "Section 5 shows what such a bias does to the score's predictions; "
    "[docs/curvature.md](../docs/curvature.md) compares the sources on many layers, with their costs."))

# %% [markdown]
# Why one Hutchinson probe is noisy: `z_i (H z)_i = H_ii + sum_{j != i} H_ij z_i z_j`.
# The cross terms average to zero over random signs, but each probe carries
# them, so the variance of one probe is `sum_{j != i} H_ij^2`: the
# **off-diagonal** mass of the Hessian. Here is `H` on the probe set (first
# batch):

# %%
H = hessians[0]
fig = go.Figure(go.Heatmap(z=H.numpy(), x=[str(int(p)) for p in positions], y=[str(int(p)) for p in positions],
                           colorscale="RdBu", zmid=0))
fig.update_layout(height=440, width=560, title="Exact Hessian over the probe set (first batch)",
                  yaxis_autorange="reversed", xaxis_title="basis j", yaxis_title="basis i")
fig.show()
off = H - torch.diag(H.diagonal())
print(f"||diag H|| = {H.diagonal().norm():.3e}, ||off-diagonal|| = {off.norm():.3e}")
display(Markdown(f"*What to see:* blue is positive, red negative, white zero. The off-diagonal entries hold "
                 f"{float(off.norm() / H.diagonal().norm()):.0%} of the diagonal's norm here: that mass is what each "
                 "Hutchinson probe carries as noise, and what sets one probe's error (section 3)."))

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
                 go.Scatter(x=sizes, y=predicted, mode="lines", name="theory", line={"dash": "dash"})])
fig.update_xaxes(type="log", title="probes s")
fig.update_yaxes(type="log", title="relative error of the diagonal")
fig.update_layout(height=340, title="Hutchinson: error against the number of probes")
fig.show()

# %% [markdown]
# *What to see:* both axes are logarithmic, so `1/sqrt(s)` is a straight
# line of slope -1/2 (dashed: `sqrt(||off||^2 / s) / ||diag||` from the exact
# `H`). The last point averages a single group of all the probes, so it
# scatters more than the others.
#
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
fig.add_vline(x=eps, line_dash="dot", annotation_text=f"the rule: {eps:.1e}", annotation_position="top left")
fig.update_xaxes(type="log", title="eps")
fig.update_yaxes(type="log", title="relative error vs exact z*(Hz)")
fig.update_layout(height=340, title="One probe, varying the perturbation intensity")
fig.show()
nearest = min(range(len(rel_by_eps)), key=lambda n: abs(math.log(settings.eps_values[n] / eps)))
lowest = min(range(len(rel_by_eps)), key=rel_by_eps.__getitem__)
turn = ("keeps falling up to the largest eps tried: the third-order terms do not show in this range"
        if lowest == len(rel_by_eps) - 1 else f"turns up again past {settings.eps_values[lowest]:.0e}: the third-order terms")
print(f"error near the rule's eps ({settings.eps_values[nearest]:.0e}): {rel_by_eps[nearest]:.1e}; "
      f"smallest error {rel_by_eps[lowest]:.1e} at eps = {settings.eps_values[lowest]:.0e}; the error {turn}")

# %% [markdown]
# *What to see:* the error falls as `eps` grows (less round-off). Third-order
# terms make it rise again once `eps` is large enough; the line above says
# whether this range reaches that point (exercise 2 tries 0.99). The dotted
# line is the rule's `eps` from the whole model's `sigma_max`.
#
# **What eps does to the layer's ranking.** The curve above follows one probe
# against its own target. What matters to the method is the *diagonal*
# estimate averaged over batches, and which bases it keeps.
# `bsi.pipeline.whatif.EpsStudy` (the dashboard's *What if* tab runs the same)
# estimates this layer's whole diagonal by Hutchinson's method at one `eps`
# (one probe on each batch), beside the Fisher on the same batches and the
# exact diagonal at the 8 largest coefficients, and ranks the layer with each:
# the score's curvature term `1/2 sigma^2 h` alone here (the gradient term is
# left out: the default's z-test passes almost none, walkthrough 03), keeping
# as many bases as a cut of half the candidate pool would. A static series
# first, measured when this notebook ran:

# %%
eps_study = EpsStudy(model, name, batches, loss_fn, torch.zeros(layer.rank), keep=layer.rank - pool.numel() // 2)
eps_series = sorted({1e-6, 1e-4, float(f"{eps:.1e}"), 1e-2, 0.5})
for e in eps_series:
    eps_study.at(e)
display(Markdown(markdown_rows([{"eps": f"{p.eps:.1e}" + (" (the rule)" if p.eps == float(f"{eps:.1e}") else ""),
                         "error at the 8 largest": f"{p.error:.2g}", "negative estimates":
                         f"{int((p.curvature < 0).sum())} of {p.curvature.numel()}",
                         "kept bases that differ from the Fisher's": f"{p.kept_changed} of {eps_study.keep}",
                         "rank correlation with the Fisher's ranking": f"{p.spearman:+.3f}", "time": f"{p.seconds:.1f} s"}
                        for p in eps_study.points.values()])))
print(f"the Fisher's error at the same 8: {eps_study.fisher_error:.2g}; the layer's setup (Fisher and exact diagonal) "
      f"took {eps_study.setup_seconds:.1f} s")
eps_figure(eps_study, eps_series[-1], eps).show()

# %% [markdown]
# **Your own eps.** Move the slider (log10 of eps) and press *Estimate*: about
# ten seconds a value on the embedded model; each value joins the error curve.

# %%
eps_slider = widgets.FloatSlider(value=round(math.log10(eps), 1), min=-7, max=-0.1, step=0.1,
                                 description="log10 eps", continuous_update=False)
eps_button = widgets.Button(description="Estimate")
eps_out = widgets.Output()


def on_eps(_):
    point = eps_study.at(float(10 ** eps_slider.value))
    with eps_out:
        eps_out.clear_output(wait=True)
        print(f"eps {point.eps:.2g}: error {point.error:.2g} (Fisher {eps_study.fisher_error:.2g}), "
              f"{point.kept_changed} of {eps_study.keep} kept bases differ from the Fisher's, {point.seconds:.1f} s")
        eps_figure(eps_study, point.eps, eps).show()


eps_button.on_click(on_eps)
display(widgets.VBox([widgets.HBox([eps_slider, eps_button]), eps_out]))

# %% [markdown]
# ## 4. The candidate pool
#
# Scoring every basis of every layer would waste probes (and variance) on bases
# that will never be pruned: the large ones. Each round, only a *pool* of the
# smaller bases is scored and may be pruned:

# %%
display(Markdown(doc_markdown(candidate_pool, paragraphs=2)))

# %%
fig = go.Figure()
in_pool = torch.zeros(layer.rank, dtype=torch.bool)
in_pool[pool] = True
fig.add_trace(go.Bar(x=torch.nonzero(~in_pool).flatten().numpy(), y=sigma[~in_pool].numpy(), name="protected (K)",
                     marker_color="#7f7f7f"))
fig.add_trace(go.Bar(x=pool.numpy(), y=sigma[pool].numpy(), name="candidate pool C", marker_color="#d62728"))
fig.update_yaxes(type="log", title="sigma_i (log scale)")
fig.update_layout(height=340, bargap=0, xaxis_title="basis i (0 = largest sigma)",
                  title=f"Candidate pool: {pool.numel()} of {layer.rank} bases (rho = {config.pool_rho:.3f})")
fig.show()
print(f"sigma of the pool: {float(sigma[pool].min()):.3g} to {float(sigma[pool].max()):.3g}; of the protected "
      f"bases: {float(sigma[~in_pool].min()):.3g} to {float(sigma[~in_pool].max()):.4g}")
for gamma in (0.5, 1.0, 2.0, 4.0):
    rho = pool_rho(config.size.ratio, gamma, config.rounds)
    print(f"gamma {gamma:>3}: rho = {rho:.3f}, pool = {candidate_pool(sigma, rho).numel():>4} of {layer.rank} bases")

# %% [markdown]
# *What to see:* on a logarithmic axis the spectrum falls steadily; the
# protected bases (grey) are the few largest, which hold a share `rho` of the
# summed `|sigma|`, and the pool (red) is the long tail of small ones: most of
# the bases, little of the mass. A larger `gamma` widens the pool.
#
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
fig.update_layout(height=380, title=f"bsi's two terms over the pool ({source.name} curvature)",
                  xaxis_title="gradient term -sigma_i g_i", yaxis_title="curvature term sigma_i^2 h_i / 2")
fig.show()
share = float((terms["curvature"][pool].abs() > terms["gradient"][pool].abs()).float().mean())
negative = float((scores["bsi"][pool] < 0).float().mean())
print(f"the curvature term outweighs the gradient term for {share:.0%} of the pool's bases; "
      f"{negative:.0%} of them have a negative score (removing them is predicted to lower the loss)")

# %% [markdown]
# *What to see:* each dot is one pool basis, coloured by its score `I_i`
# (their sum). The curvature term is never negative; where the dots spread
# left and right the gradient term decides the ranking, where they spread up
# and down the curvature term does.
#
# Here every first-order term is kept, as the paper does. The engine's
# default keeps one only where the gradient stands out from its noise by
# `compress.gradient_z` standard errors, computed from the per-example
# gradients of a whole round; with a few problems there is nothing to test
# against, and near a fine-tuned minimum most of these terms are that noise.
#
# A round removes a parameter budget's worth of bases (size mode `target`). As if
# this layer were the whole model, round 1's budget
# (`bsi.method.schedule.gradual_budgets`) and the engine's selection
# (`select_to_budget`) make every score prune the *same number* of bases; only
# which ones differs.

# %%
shape = LayerShape(layer.in_features, layer.out_features, layer.rank)
budget, budget_measure = gradual_budgets(shape.cost(shape.rank, "factor"), round(config.size.ratio * shape.dense),
                                         config.rounds)[0]
pruned = {s: set(select_to_budget({name: shape}, {name: scores[s]}, {name: pool}, budget, budget_measure)[name]
                 .tolist()) for s in scores}
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
# *What to see:* Basel prunes the left edge (the smallest `|sigma|`), BSI the
# bottom (the smallest `I_i`); the red and blue dots are where they disagree.
#
# **Why the disagreement matters.** `|sigma_i|` says how much of a basis the layer
# uses (in whitened bases: how much of its output on task inputs), not how much
# the *task's answers* need it: a small basis can carry exactly the direction the
# answers depend on (`I_i` high), and a large one can be one the answers do not
# care about, or even one whose removal lowers the loss (`I_i < 0`, removed first
# by BSI, kept by Basel as long as it is large). Whether the answers' needs,
# *estimated on a few problems*, are the better guide is what section 6 measures.
#
# Is the prediction right? Drop some of the disputed bases one at a time and
# measure the loss change on the same mini-batches (`bsi.teaching.loss_change_when_dropped`):

# %%
only_bsi = sorted(pruned["bsi"] - pruned["basel"], key=lambda i: float(scores["bsi"][i]))[:4]
only_basel = sorted(pruned["basel"] - pruned["bsi"], key=lambda i: -float(scores["bsi"][i]))[:4]
extremes = [int(pool[torch.argmax(scores["bsi"][pool])]), int(pool[torch.argmin(scores["bsi"][pool])])]
check = list(dict.fromkeys(only_bsi + only_basel + extremes))
measured_change = loss_change_when_dropped(model, layer, batches, loss_fn, check)  # (c,) the same problems
measured_elsewhere = loss_change_when_dropped(model, layer, others, loss_fn, check)  # (c,) as many other problems
fig = go.Figure()
fig.add_trace(go.Scatter(x=scores["bsi"][check].numpy(), y=measured_change.numpy(), mode="markers",
                         name="bsi (with curvature)", marker={"size": 9}))
fig.add_trace(go.Scatter(x=scores["bsi-grad"][check].numpy(), y=measured_change.numpy(), mode="markers",
                         name="bsi-grad (gradient term only)", marker={"symbol": "x", "size": 9}))
fig.add_trace(go.Scatter(x=scores["bsi"][check].numpy(), y=measured_elsewhere.numpy(), mode="markers",
                         name="bsi, measured on other problems", marker={"symbol": "triangle-up", "size": 9}))
lo = min(float(measured_change.min()), float(measured_elsewhere.min()))
hi = max(float(measured_change.max()), float(measured_elsewhere.max()))
fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="prediction = measurement", line={"dash": "dot"}))
fig.update_layout(height=400, title="Predicted against measured loss change of dropping one basis",
                  xaxis_title="predicted loss change", yaxis_title="measured loss change")
fig.show()
display(Markdown(table([{"basis": i, "sigma": float(sigma[i]), "predicted (bsi)": float(scores["bsi"][i]),
                         "gradient term only": float(scores["bsi-grad"][i]),
                         "curvature term": float(terms["curvature"][i]), "measured": m, "on other problems": m2,
                         "which": category(i)}
                        for i, m, m2 in zip(check, measured_change.tolist(), measured_elsewhere.tolist())], ".2e")))

# %% [markdown]
# *What to see:* a point on the dotted line is a perfect prediction. Each
# basis appears three times: circle and cross at the same height (its change
# measured on the problems the scores came from), the triangle at its change
# on as many other problems.

# %%
prediction_error = {s: float((scores[s][check] - measured_change).abs().mean()) for s in ("bsi", "bsi-grad")}
worst = max(range(len(check)), key=lambda n: abs(float(scores["bsi"][check[n]]) - float(measured_change[n])))
helped = prediction_error["bsi"] < prediction_error["bsi-grad"]
elsewhere_error = float((scores["bsi"][check] - measured_elsewhere).abs().mean())
same_sign = int((torch.sign(scores["bsi"][check]) == torch.sign(measured_elsewhere)).sum())
display(Markdown(
    f"**Reading it.** Over these {len(check)} bases the mean |predicted - measured| is "
    f"{prediction_error['bsi']:.1e} with the curvature term and {prediction_error['bsi-grad']:.1e} without it: "
    + ("the second-order term brings the prediction closer. " if helped else
       "**the curvature term makes the prediction worse.** ")
    + f"The largest miss is basis {check[worst]}, predicted {float(scores['bsi'][check[worst]]):+.1e}, "
    f"measured {float(measured_change[worst]):+.1e}, of which the curvature term is "
    f"{float(terms['curvature'][check[worst]]):+.1e}. The curvature term is only as good as the source's "
    f"estimate of the diagonal: the {source.name} source's median ratio to the exact diagonal was "
    f"{ratio.get(source.name, float('nan')):.2g} in section 2, "
    + ("and a diagonal too large adds a positive correction the measurement does not have. "
       if ratio.get(source.name, 1.0) > 1 else "so the correction it adds is smaller than the exact one. ")
    + f"These are the same {problems} problems the scores were computed on, so the check tests the Taylor "
    f"expansion. **On {problems} other problems** the same removals changed the loss by amounts the prediction "
    f"misses by {elsewhere_error:.1e} on average ({elsewhere_error / prediction_error['bsi']:.0f} times the error "
    f"above), with the predicted sign for {same_sign} of {len(check)} bases: "
    + ("the ranking of a few problems says little about others." if same_sign < 0.75 * len(check)
       else "the signs mostly carry over, the sizes much less.")
    + " That is why the engine averages its scores over every batch of a round and tests the first-order "
    "terms, and why section 6 measures on held-out problems."))

# %% [markdown]
# ## 6. The whole model, during a real run
#
# One layer on a few problems is a small sample. The library measures the same
# thing on the whole model of a real run, at the end of each round, with the
# loss on held-out problems, and also measures what a round really does:
# remove its *whole* budget at once. From its docstring:

# %%
display(Markdown(doc_markdown(bsi.analysis.ranking, title=False, paragraphs=1)))

# %% [markdown]
# A round's cut answers two questions: **how many** bases each layer loses
# (its budget) and **which** ones inside each layer. `measure_round` crosses the
# answers of `bsi` and of magnitude (`|sigma|`, Basel's score with its
# per-layer mass rule), so each can be judged apart, and measures each cut's
# held-out loss with no training in between. This run is short (two rounds,
# a few iterations each, `settings.ranking_work`); in the last round it also
# removes a few candidates of one layer one at a time.

# %%
evaluations = []  # every held-out evaluation of the run, in order: each problem's loss (for paired intervals)


def held_out(compressor) -> float:
    """The held-out loss of the model as it is now; keeps each problem's outcome too."""
    result = evaluate(compressor.model, run.tokenizer, run.task.validation, answered=0, batch_size=8)
    evaluations.append(Outcomes.from_columns(result.columns()))
    return result.metrics.loss


measured_rounds = []


def measure(compressor, round_scores, cut):  # the engine's before_cut hook: the model still has every basis
    names = list(compressor.layers)
    last_round = compressor.round_index == compressor.config.rounds
    first = len(evaluations)
    r = measure_round(compressor.layers, round_scores, compressor.select, cut, lambda: held_out(compressor),
                      probe_layers=[names[len(names) // 2]] if last_round else [], singles=settings.ranking_singles,
                      shares=())
    # measure_round measures the model as it is first and the cuts last, in the order of r["cuts"]
    r["outcomes"] = {"before": evaluations[first], **dict(zip(r["cuts"], evaluations[-len(r["cuts"]):]))}
    measured_rounds.append(r)


t0 = time.perf_counter()
run.before_cut = measure
for _ in run.compress():  # stage 2 only: stage 1 ran at the top, and no recovery
    pass
run_s = time.perf_counter() - t0
examples = len(run.task.validation)
print(f"{len(measured_rounds)} rounds measured on {examples} held-out problems in {run_s:.0f} s")

# %%
WAYS = {  # each cut: (what sets each layer's budget, what chooses inside a layer)
    "bsi": ("bsi", "bsi"), "magnitude": ("mass rule on |sigma|", "|sigma|"),
    "bsi budgets, magnitude inside": ("bsi", "|sigma|"), "magnitude budgets, bsi inside": ("mass rule on |sigma|", "bsi"),
    "bsi budgets, random inside": ("bsi", "random"), "bsi-grad": ("bsi-grad", "bsi-grad"),
}
versus = [{label: paired_difference([r["outcomes"][label]], [r["outcomes"]["bsi"]], "loss") for label in r["cuts"]}
          for r in measured_rounds]  # per round: each cut's loss less bsi's, with a 95% interval over the problems


def span(iv) -> str:
    return f"{iv.estimate:+.4f} [{iv.low:+.4f}, {iv.high:+.4f}]"


cut_rows = [{"cut": label, "budgets from": WAYS.get(label, ("?", "?"))[0], "inside": WAYS.get(label, ("?", "?"))[1],
             **{f"round {t + 1} loss": r["cuts"][label]["loss"] for t, r in enumerate(measured_rounds)},
             **{f"round {t + 1} vs bsi": "" if label == "bsi" else span(versus[t][label])
                for t, r in enumerate(measured_rounds)}}
            for label in measured_rounds[0]["cuts"]]
display(Markdown("Held-out loss before each round's cut: "
                 + ", ".join(f"round {t + 1} {r['loss']:.4f}" for t, r in enumerate(measured_rounds))
                 + f". After removing the round's whole budget each way ({examples} problems; "
                 "'vs bsi' is the cut's loss less bsi's, with a 95% paired bootstrap interval over the problems):\n\n"
                 + table(cut_rows)))

# %% [markdown]
# Read the table in pairs of rows that change one answer only:
#
# * `bsi` against `bsi budgets, magnitude inside`: the same budgets, a
#   different choice inside each layer. This isolates **which** bases.
# * `bsi` against `magnitude budgets, bsi inside`: the same choice inside, the
#   budgets of Basel's mass rule. This isolates **how many** per layer.
# * `bsi budgets, random inside`: how much the choice inside matters at all.
# * `bsi-grad`: the first-order term alone, with no significance test: what
#   the gradient's noise does to a whole cut.

# %%
def verdict(iv, worse: str, better: str) -> str:
    """In words: which way a paired difference goes, or 'within noise' when its interval holds 0."""
    if not iv.excludes_zero:
        return f"within noise ({span(iv)})"
    return f"{worse if iv.estimate > 0 else better} ({span(iv)})"


lesson = []
for t, v in enumerate(versus):
    lesson.append(
        f"* **Round {t + 1}.** Choosing inside each layer by `|sigma|` instead of bsi's score, with bsi's budgets: "
        + verdict(v["bsi budgets, magnitude inside"], "worse than bsi", "better than bsi")
        + ". Giving each layer the mass rule's budget instead of bsi's, with bsi's choice inside: "
        + verdict(v["magnitude budgets, bsi inside"], "worse than bsi", "better than bsi")
        + ". A random choice inside, with bsi's budgets: "
        + verdict(v["bsi budgets, random inside"], "worse than bsi", "better than bsi")
        + (". The untested gradient term alone (`bsi-grad`, its own budgets and choice): "
           + verdict(v["bsi-grad"], "worse than bsi", "better than bsi") if "bsi-grad" in v else "") + ".")
display(Markdown("\n".join(lesson)))

# %% [markdown]
# **What the score adds, and where.** Inside one whitened layer, `|sigma_i|`
# already measures what a basis contributes: up to the whitening's small
# damping, `sigma_i^2` is the output energy on the calibration inputs that
# removing it takes away (notebook 01). That makes magnitude a good, and
# noise-free, ranking *inside* a layer; a random choice shows how much the
# choice inside matters at all. What `|sigma|` cannot do is compare a basis of one layer
# with a basis of another: layers' outputs matter unequally to the loss. The
# score is in loss units, so it can, and that is what sets the budgets (the
# global selection, least importance per parameter across layers). Where the
# intervals above hold 0 the run cannot tell the rankings apart; the longer
# ranking bench found the same split, bsi's budgets better than the mass
# rule's in every round and `|sigma|` at least as good inside a layer, and
# the variant `bsi-mag` that combines them gave no consistent gain once
# recovery followed ([docs/benchmarks.md](../docs/benchmarks.md#does-bsi-beat-the-other-methods-and-where)).
#
# The single-basis check of the last round, on one layer:

# %%
last = measured_rounds[-1]
probed, entry = next(iter(last["layers"].items()))
singles = len(entry["measured"])
ranking_figure({r: (entry["predicted"][r], entry["measured"], entry["spearman"][r]) for r in entry["predicted"]}).show()
noise_band = 1.96 / math.sqrt(singles - 1) if singles > 1 else float("nan")
display(Markdown(
    f"*What to see:* {singles} of the {entry['pool']} candidates of `{probed}`, each removed alone; a ranking "
    "that predicts well puts its points on a rising line (Spearman near +1). "
    f"**With {singles} bases these correlations are noise:** if a ranking had no relation at all to the "
    f"measurement, its Spearman would still scatter with a standard deviation of about 1/sqrt(n - 1) = "
    f"{1 / math.sqrt(singles - 1):.2f}, so anything inside +-{noise_band:.2f} is what chance alone gives 95% of "
    "the time. Here: " + ", ".join(f"{r} {v:+.2f}" for r, v in entry["spearman"].items())
    + (", all inside that band: this check cannot tell the rankings apart (the random ranking is the control). "
       if all(abs(v) < noise_band for v in entry["spearman"].values()) else ". ")
    + f"The measured changes are tiny (largest {max(abs(m) for m in entry['measured']):.1e} in loss, against "
    f"{last['loss']:.4f} before the cut): one basis alone barely moves the loss, so whole cuts (the table above) are "
    "the measurement that counts."))

# %% [markdown]
# ## What the data say
#
# Computed from this run, so they stay true after a new render; the
# unflattering results first.
#
# *The code that writes this reading from the run's numbers is folded in the
# notebook (open it there); the rendered pages show only what it wrote.*

# %% tags=["hide-input"]
def eps_reading(study, rule_eps: float) -> str:
    """Section 3's eps series in words: where Hutchinson's diagonal is closest to the exact one, and what it moves."""
    points = sorted(study.points.values(), key=lambda p: p.eps)
    best = min(points, key=lambda p: p.error)
    rule = min(points, key=lambda p: abs(math.log(p.eps / rule_eps)))
    falls = points[-1] is best
    return (f"* **eps on the layer's diagonal** ({len(study.batches)} batches, one probe each): Hutchinson's error "
            f"against the exact diagonal at the 8 largest coefficients went from {points[0].error:.2g} at eps "
            f"{points[0].eps:.0e} to {points[-1].error:.2g} at {points[-1].eps:g}"
            + (", falling all the way: no valley in this range (round-off shrinks, the third-order terms never show)"
               if falls else f", lowest ({best.error:.2g}) at {best.eps:.0e}")
            + f"; at the rule's {rule.eps:.1e} it was {rule.error:.2g}, the Fisher's {study.fisher_error:.2g}. "
            f"Ranked with it, {rule.kept_changed} of the {study.keep} kept bases differ from the Fisher's choice "
            f"(rank correlation {rule.spearman:+.3f}). One layer, two batches.")


first_round = versus[0]
one_probe = measured[0]  # Hutchinson's relative error with one probe (section 3)
effect = ("hurt" if not helped else "barely helped" if prediction_error["bsi"] > 0.5 * prediction_error["bsi-grad"]
          else "helped")
said = [
    (f"* **bsi's default curvature is {'far off' if relative_error['fisher'] > 0.5 else 'close'} here.** "
     f"The empirical Fisher's median estimate is "
     f"{ratio['fisher']:.2g} times the exact diagonal (relative error {relative_error['fisher']:.0%}) on "
     f"{positions.numel()} bases of one layer"
     + (", and the sampled Fisher gave the same numbers" if torch.allclose(estimates["fisher"], estimates["mc-fisher"])
        else f"; the sampled Fisher's {ratio['mc-fisher']:.2g}")
     + f" (section 2). Hutchinson, the paper's source, came within {relative_error['hutchinson']:.0%} with "
     f"{settings.probes} probes per batch, each costing two gradient passes ({t_probe:.2f} s here); its error fell "
     f"from {one_probe:.0%} with one probe to {measured[-1]:.0%} with {sizes[-1]} (first batch)."),
    (f"* **The curvature term {effect} the single-basis predictions** (section 5): "
     f"mean |predicted - measured| {prediction_error['bsi']:.1e} with it, {prediction_error['bsi-grad']:.1e} "
     f"without, over {len(check)} bases on the {problems} problems the scores came from; the gradient term "
     f"decided the ranking (the curvature term outweighed it for {share:.0%} of the pool). On {problems} other "
     f"problems the prediction missed by {elsewhere_error:.1e} on average, with the right sign for {same_sign} of "
     f"{len(check)}. One layer, few bases: an indication."),
    (f"* **The single-basis rank correlations of section 6 are noise**: n = {singles}, so chance alone spans "
     f"+-{noise_band:.2f}; " + ", ".join(f"{r} {v:+.2f}" for r, v in entry["spearman"].items()) + "."),
    ("* **Whole cuts** (one run, one seed, " + f"{examples} held-out problems; intervals over the problems, not "
     "over training runs): "
     + "; ".join(f"round {t + 1}: magnitude inside instead of bsi's choice: "
                 + verdict(v["bsi budgets, magnitude inside"], "raised the loss", "lowered the loss")
                 + ", the mass rule's budgets instead of bsi's: "
                 + verdict(v["magnitude budgets, bsi inside"], "raised it", "lowered it")
                 + ", random inside: " + verdict(v["bsi budgets, random inside"], "raised it", "lowered it")
                 + (", the untested gradient term (bsi-grad): " + verdict(v["bsi-grad"], "raised it", "lowered it")
                    if "bsi-grad" in v else "")
                 for t, v in enumerate(versus)) + "."),
    (f"* **eps**: the rule's {eps:.1e} (from the whole model's sigma_max {sigma_max:.4g}) gave a one-probe error of "
     f"{rel_by_eps[nearest]:.1e} against the exact `z * (H z)` at the nearest tested value; the smallest, "
     f"{rel_by_eps[lowest]:.1e}, was at {settings.eps_values[lowest]:.0e}. "
     + (f"Both are far below the noise of one probe against the diagonal ({one_probe:.0%}), so inside the valley "
        "the choice of eps does not matter." if rel_by_eps[nearest] < 0.1 * one_probe else
        f"The rule's value is not in the valley here: its error is comparable with one probe's noise ({one_probe:.0%}).")),
    eps_reading(eps_study, eps),
    (f"* **BSI and Basel disagree** on {len(pruned['bsi'] ^ pruned['basel'])} of the {pool.numel()} pool bases of "
     f"one layer (rank correlation of the two scores over the pool {spearman:+.2f}); {negative:.0%} of the pool "
     "had a negative score."),
]
display(Markdown("\n".join(said)))

# %%
outcome = {"relative_error": relative_error, "fisher_min": float(estimates["fisher"].min()),
           "probe_errors": dict(zip(sizes, measured)), "pruned": {s: len(p) for s, p in pruned.items()},
           "terms_add_up": bool(torch.allclose(terms["gradient"] + terms["curvature"], scores["bsi"])),
           "prediction_error": prediction_error, "sigma_max": sigma_max, "eps": eps,
           "whole_cuts": [{k: v["loss"] for k, v in r["cuts"].items()} | {"before": r["loss"]} for r in measured_rounds]}
print(f"Result: on {name} of the fine-tuned model, Hessian diagonal on {positions.numel()} bases within "
      f"{relative_error['hutchinson']:.0%} of exact with {settings.probes} Hutchinson probes per batch "
      f"({relative_error['fisher']:.0%} with the Fisher); BSI and Basel disagree on "
      f"{len(pruned['bsi'] ^ pruned['basel'])} of {pool.numel()} pool bases; mean |prediction error| "
      f"{prediction_error['bsi']:.1e} with curvature vs {prediction_error['bsi-grad']:.1e} without; whole cut of round "
      f"1: bsi {measured_rounds[0]['cuts']['bsi']['loss']:.4f}, magnitude inside "
      f"{measured_rounds[0]['cuts']['bsi budgets, magnitude inside']['loss']:.4f}; ran in "
      f"{time.perf_counter() - start:.0f} s (stage 1 {finetune_s:.0f} s)")

# %% [markdown]
# ## Recap
#
# * The score is the second-order Taylor prediction of the loss increase of
#   the step `-sigma_i e_i`: `I_i = -sigma_i g_i + sigma_i^2 h_i / 2`, a
#   gradient term and a curvature term in loss units.
# * The gradient is exact and cheap; the curvature is estimated. Hutchinson's
#   symmetric perturbations (the paper's) are unbiased for the Hessian's
#   diagonal, their error is noise that falls like `1/sqrt(probes)`, set by the
#   Hessian's off-diagonal mass. The sampled Fisher estimates the Gauss-Newton
#   part without bias; the empirical Fisher (bsi's default) costs nothing extra
#   and is never negative, but estimates neither the Hessian nor the
#   Gauss-Newton part in general.
# * `eps` trades two errors: too small and float32 round-off of the two
#   gradients dominates, too large and the third-order terms do. On this
#   layer the error kept falling up to the largest eps tried, so the second
#   never showed ("What the data say"). The rule takes eps from the whole
#   model's largest coefficient.
# * Only a candidate pool of the smaller bases is scored; every score prunes
#   the same budget, and BSI and Basel's `|sigma_i|` disagree on which bases go.
# * A cut is two decisions: how many bases each layer loses, and which ones.
#   Scores in loss units can make the first across layers; inside a whitened
#   layer `|sigma|` is a strong ranking already.
#
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
# largest coefficients), far below the others. An estimated diagonal adds
# its own error on top: Hutchinson's noise, or the Fisher's bias. A diagonal
# far smaller than the exact one (the Fisher's median ratio in section 2)
# corrects little, so its line lands near the gradient term alone; one too
# large would overshoot and could do worse than no curvature term at all.
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
#   compares the sources on many layers; [bsi/analysis/ranking.py](../bsi/analysis/ranking.py)
#   holds every measurement of section 6.
# * Next: [03 · Pruning rounds](03_pruning_rounds.ipynb), the engine at work.
