# Source of notebooks/01_reparameterization.ipynb (build: python notebooks/build.py).

# %% [markdown]
# # 01 · Re-parameterization: a linear layer as a sum of bases
#
# BSI never edits a weight matrix directly. It first rewrites every linear layer
# as a weighted sum of rank-one *bases*, and from then on it only learns, scores
# and removes the *weights* of that sum. This notebook takes one real layer of the
# embedded model (SmolLM2-135M-Instruct) apart, then the whole model:
#
# 1. its SVD and singular-value spectrum;
# 2. the **Basel form** and why it computes exactly what the layer did;
# 3. two choices of bases, the plain SVD and the SVD on *whitened* task inputs:
#    both exact, but very different once bases are dropped;
# 4. small is not unimportant: what dropping the *smallest* bases of every
#    layer does to the whole model's loss, plain against whitened, and why the
#    published protocol collapsed on this model;
# 5. what keeping `r` bases costs, and the rank below which it pays off;
# 6. the whole model converted, with a table of layers and ranks;
#
# and ends with what the data say.
#
# Set `BSI_NOTEBOOK_MODEL=tiny-random-llama` before starting Jupyter to run
# everything on a tiny random model in seconds (CI does).

# %%
import json
import math
import time

import pandas as pd
import plotly.graph_objects as go
import torch
import torch.nn.functional as F
from IPython.display import Markdown, display
from plotly.subplots import make_subplots
from transformers.utils import logging as hf_logging

import bsi.method.bases
import bsi.method.layers
from bsi.analysis.spectrum import layer_kind
from bsi.data import BatchStream, load_task
from bsi.data.text import load_text_task
from bsi.method.bases import svd_bases, whitened_bases
from bsi.method.layers import BasisLinear, break_even_rank, factor_cost
from bsi.method.surgery import (
    compressible_linear_names,
    compressible_parameters,
    model_parameters,
    sigma_max,
    to_basis_form,
)
from bsi.models import load_model_and_tokenizer
from bsi.pipeline.baselines import input_statistics
from bsi.results import read_study_rows
from bsi.shipped import round_losses, shipped_sweep
from bsi.teaching import doc_markdown, notebook_settings, rank_table, result_of, truncation_errors

hf_logging.disable_progress_bar()  # no loading bars between the results
settings = notebook_settings()
start = time.perf_counter()
model, tokenizer = load_model_and_tokenizer(settings.model)
model.eval()
task = load_task("embedded-math", test_size=settings.test_size)
stream = BatchStream(task.train, tokenizer, batch_size=settings.batch_size, max_length=settings.max_length)
calibration = [next(stream) for _ in range(settings.calibration_batches)]  # sets the whitened bases
held_out = [next(stream) for _ in range(settings.calibration_batches)]  # other task batches: where errors are measured
names = compressible_linear_names(model)
print(f"model {settings.model}: {model_parameters(model):,} parameters, {len(names)} compressible linear layers; "
      f"{len(calibration)} + {len(held_out)} batches of {tuple(calibration[0]['input_ids'].shape)} tokens")


def markdown_table(rows: list[dict]) -> Markdown:
    """A list of dicts (values already formatted as text) as a Markdown table."""
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(r[h]) for h in head) + " |" for r in rows]
    return Markdown("\n".join(lines))


def short(layer: str) -> str:
    """model.layers.1.self_attn.v_proj -> 1.self_attn.v_proj"""
    return layer.removeprefix("model.layers.")


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
# energy (`sum sigma_i^2`, the Frobenius norm squared) the top `k` bases hold.

# %%
k = torch.arange(1, sigma.numel() + 1)
mass = (sigma.cumsum(0) / sigma.sum()).numpy()
energy = (sigma.square().cumsum(0) / sigma.square().sum()).numpy()
fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                    subplot_titles=("singular values (log scale)", "share held by the top-k bases"))
fig.add_trace(go.Scatter(x=k, y=sigma.numpy(), mode="lines", name="sigma_i"), row=1, col=1)
fig.add_trace(go.Scatter(x=k, y=mass, name="sigma mass"), row=1, col=2)
fig.add_trace(go.Scatter(x=k, y=energy, name="energy (sigma^2)"), row=1, col=2)
ticks = [t for t in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
         if float(sigma[-1]) / 2 <= t <= float(sigma[0]) * 2]
fig.update_yaxes(type="log", title="sigma_i", tickvals=ticks, row=1, col=1)
fig.update_yaxes(title="share of the total", row=1, col=2)
fig.update_xaxes(title="index i (sorted)")
fig.update_layout(height=400, title=f"Spectrum of {name}")
fig.show()
for share in (0.5, 0.9):
    print(f"{share:.0%} of the sigma mass: top {int((mass < share).sum()) + 1} of {sigma.numel()} bases; "
          f"{share:.0%} of the energy: top {int((energy < share).sum()) + 1}")
print(f"largest / smallest sigma: {float(sigma[0] / sigma[-1]):.0f}")

# %% [markdown]
# What to see: on the left, the spectrum falls smoothly, with no cliff after
# which the bases are obviously negligible; on the right, the energy curve
# lies above the mass curve (squaring favours the large `sigma_i`), and neither
# reaches 90% before most bases are in. No small set of bases is obviously
# enough: which ones the *task* needs is the question BSI answers.
#
# ## 2. The Basel form, exact at start
#
# BSI (like Basel before it) replaces the layer by `BasisLinear`. Its module's
# docstring, first paragraphs:

# %%
display(Markdown(doc_markdown(bsi.method.layers, paragraphs=3)))

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
# choice decides is what *dropping* bases costs.

# %%
display(Markdown(doc_markdown(bsi.method.bases, paragraphs=2)))

# %% [markdown]
# * `svd_bases`, the plain SVD, keeps the *weight*: truncating it to its first
#   `k` bases gives the smallest `||W - W_k||_F` (Eckart-Young). It never sees
#   the data.
# * `whitened_bases` takes the SVD of `W S`, where `S S^T = C` is the second
#   moment of the layer's inputs on task batches (a Cholesky factor, damped by
#   `1e-3` of its mean diagonal so that it is invertible), and folds `S^{-1}`
#   back into `V`: truncating it gives the smallest *output* error
#   `||X (W - W_k)^T||_F` on those inputs.
#
# The second moment `C` comes from forward passes over a few task batches
# (`bsi.pipeline.baselines.input_statistics`, the calibration the engine and
# SVD-LLM run). We measure it twice, for every layer at once (one pass each,
# kept for section 6 and exercise 2): on the calibration batches, which set the
# whitened bases, and on *other* task batches, where the errors below are measured.
#
# The error of keeping the first `k` bases is computed exactly from the bases and
# a second moment by `bsi.teaching.truncation_errors`:

# %%
display(Markdown(doc_markdown(truncation_errors, paragraphs=1)))

# %% [markdown]
# It is `sqrt(tr((W - W_k) C (W - W_k)^T) / tr(W C W^T))`: with the identity as
# `C`, the weight error `||W - W_k||_F / ||W||_F`; with the held-out inputs' `C`,
# the relative output error on task text.

# %%
linears = {n: model.get_submodule(n) for n in names}
covariances = result_of(input_statistics(model, linears, iter(calibration), len(calibration),
                                         covariance=True)).covariance()  # name -> (in, in), sets the whitened bases
held_out_covariances = result_of(input_statistics(model, linears, iter(held_out), len(held_out),
                                                  covariance=True)).covariance()  # name -> (in, in), measures errors
covariance, test_covariance = covariances[name], held_out_covariances[name]  # (in, in) each
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
fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                    subplot_titles=("weight error ||W - W_k|| / ||W||", "output error on held-out task inputs"))
for label, color in (("plain SVD", "#1f77b4"), ("whitened", "#d62728")):
    for col, kind in ((1, "weight"), (2, "output")):
        fig.add_trace(go.Scatter(x=share, y=errors[label][kind], name=label, line={"color": color},
                                 showlegend=col == 1), row=1, col=col)
fig.update_xaxes(title="share of bases kept, k / r")
fig.update_yaxes(range=[0, 1.05])
fig.update_layout(height=400, title=f"Truncating {short(name)}: the first k bases of each factorisation")
fig.show()
half = sigma.numel() // 2
output_at_half = {label: float(e["output"][half]) for label, e in errors.items()}
print(f"keeping half the bases: weight error {errors['plain SVD']['weight'][half]:.2f} (plain) vs "
      f"{errors['whitened']['weight'][half]:.2f} (whitened); output error {output_at_half['plain SVD']:.3f} "
      f"(plain) vs {output_at_half['whitened']:.3f} (whitened)")

# %% [markdown]
# What to see: on the left the plain SVD's curve lies below the whitened one
# (it wins on the weight, by construction); on the right the order flips, and
# the right panel is what the model feels. The task's activations are far from
# isotropic, so directions of `W` they rarely excite are cheap to drop even
# when their singular value is large.
#
# In the whitened bases, `sigma_i^2` is the mean squared change of the layer's
# output when basis `i` alone is dropped, *on the calibration inputs*: exactly
# so only at zero damping (the default damping, `1e-3`, makes it a slight
# overestimate), and only an estimate on any other inputs, such as the held-out
# batches of the right panel. That is why even the plain magnitude `|sigma_i|`
# (Basel's score) means something for the task in these bases, and why
# `compress.bases` defaults to `whitened`.
#
# ## 4. Small is not unimportant: plain against whitened tails
#
# Section 3 measured one layer's output. What a compression method must not
# break is the whole model's loss, and the bases that go first are the
# *smallest* ones: a truncation drops them first, and the candidate pool of the
# published protocol (notebook 02) is each layer's small-`|sigma|` end. So:
# drop the smallest few percent of the bases of many layers at once, and
# measure the model's loss.
#
# The text is WikiText-2 (its validation split ships with bsi: no network),
# cut into windows (their number and length are printed below): the first
# windows are where every loss is measured. The whitened bases get their input
# statistics twice: from the next as many windows (text these bases never saw,
# the fair test) and from the measured windows themselves (the best case,
# in-sample). The model is the embedded one as it is, with no training. A cut
# subtracts the dropped bases from the weights, measures, and puts the weights
# back.

# %%
text = load_text_task("wikitext-2", tokenizer, window=settings.tail_window)
windows = text.train_windows[:settings.tail_windows]  # (W, L): every loss below is measured on these
whitening_windows = text.train_windows[settings.tail_windows:2 * settings.tail_windows]  # (W, L): other text


def window_losses() -> torch.Tensor:
    """(W,) mean next-token loss of each window (every token after its first) for the model as it is now."""
    with torch.no_grad():
        logits = model(input_ids=windows, use_cache=False).logits[:, :-1].float()  # (W, L-1, vocab)
    targets = windows[:, 1:]  # (W, L-1)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view(targets.shape).mean(1)


def dropped_tail(bases, drop: int) -> torch.Tensor:
    """(out, in): the sum of the last ``drop`` bases of ``(U, sigma, V)``, what dropping the smallest ``drop`` removes."""
    U_, s_, V_ = bases  # (out, r), (r,), (in, r), sigma descending
    return (U_[:, -drop:] * s_[-drop:]) @ V_[:, -drop:].T


def losses_with_tails_dropped(bases: dict, share: float, chosen: list[str]) -> torch.Tensor:
    """(W,) window losses with the smallest ``share`` of each chosen layer's bases dropped; the weights restored after."""
    kept = {n: linears[n].weight.data for n in chosen}
    try:
        for n in chosen:
            drop = round(share * bases[n][1].numel())
            if drop:
                linears[n].weight.data = kept[n] - dropped_tail(bases[n], drop)
        return window_losses()
    finally:
        for n, w in kept.items():
            linears[n].weight.data = w


def second_moments(batch_windows: torch.Tensor) -> dict[str, torch.Tensor]:
    """name -> (in, in) second moment of every layer's inputs on ``batch_windows`` (one forward pass)."""
    batch = {"input_ids": batch_windows, "attention_mask": torch.ones_like(batch_windows)}
    return result_of(input_statistics(model, linears, iter([batch]), 1, covariance=True)).covariance()


t0 = time.perf_counter()
plain_bases = {n: svd_bases(linears[n].weight) for n in names}  # name -> (U, sigma, V)
other_moments, measured_moments = second_moments(whitening_windows), second_moments(windows)
whitened_other = {n: whitened_bases(linears[n].weight, other_moments[n]) for n in names}  # name -> (U, sigma, V)
whitened_same = {n: whitened_bases(linears[n].weight, measured_moments[n]) for n in names}  # in-sample
v_projs = [n for n in names if n.endswith("self_attn.v_proj")]
one = v_projs[1] if len(v_projs) > 1 else v_projs[0]  # block 1's value projection
OTHER, SAME = "whitened on other windows", "whitened on these windows"
bases_of = {"plain SVD": plain_bases, OTHER: whitened_other, SAME: whitened_same}
cuts = [("plain SVD", "every layer", 0.01, names), ("plain SVD", "every v_proj", 0.05, v_projs),
        ("plain SVD", f"{short(one)} only", 0.05, [one]),
        (OTHER, "every layer", 0.05, names), (OTHER, "every layer", 0.30, names),
        (SAME, "every layer", 0.05, names), (SAME, "every layer", 0.30, names)]
dense_losses = window_losses()  # (W,)
tails = []
for bases_label, where, cut_share, chosen in cuts:
    losses = losses_with_tails_dropped(bases_of[bases_label], cut_share, chosen)
    change = losses - dense_losses  # (W,) paired by window
    tails.append({"bases": bases_label, "layers": where, "share": cut_share, "layer_count": len(chosen),
                  "dropped": sum(round(cut_share * min(linears[n].weight.shape)) for n in chosen),
                  "loss": float(losses.mean()), "change": float(change.mean()),
                  "change_low": float(change.min()), "change_high": float(change.max())})
tail_seconds = time.perf_counter() - t0
print(f"{len(windows)} windows of {windows.shape[1]} tokens ({len(windows) * (windows.shape[1] - 1):,} next-token "
      f"predictions); loss of the model as it is: {float(dense_losses.mean()):.2f} "
      f"(windows from {float(dense_losses.min()):.2f} to {float(dense_losses.max()):.2f}); "
      f"{len(cuts)} cuts measured in {tail_seconds:.0f} s")
display(markdown_table([{"bases": r["bases"], "layers cut": f"{r['layers']} ({r['layer_count']})",
                         "smallest dropped": f"{r['share']:.0%} of each ({r['dropped']:,} bases)",
                         "loss": f"{r['loss']:.2f}",
                         "change (lowest, highest window)": f"{r['change']:+.2f} ({r['change_low']:+.2f}, "
                                                            f"{r['change_high']:+.2f})"} for r in tails]))

# %%
fig = go.Figure()
for r in reversed(tails):
    color = {"plain SVD": "#1f77b4", OTHER: "#d62728", SAME: "#ff9896"}[r["bases"]]
    fig.add_trace(go.Bar(
        y=[f"{r['bases']}: {r['share']:.0%} of {r['layers']}<br>({r['dropped']:,} bases)"], x=[r["change"]],
        orientation="h", marker_color=color, showlegend=False,
        error_x={"type": "data", "symmetric": False, "array": [r["change_high"] - r["change"]],
                 "arrayminus": [r["change"] - r["change_low"]]}))
fig.update_xaxes(title=f"rise of the loss, mean of {len(windows)} windows (whiskers: lowest, highest window)",
                 range=[min(0.0, min(r["change_low"] for r in tails)), max(r["change_high"] for r in tails) * 1.1])
fig.update_layout(height=460, title=f"Dropping the smallest bases: loss {float(dense_losses.mean()):.2f} before",
                  margin={"l": 330})
fig.show()
plain_1, v_5, one_5, other_5, other_30, same_5, same_30 = tails
display(Markdown(
    f"What to see: the blue bars (plain SVD) against the red ones (whitened). {plain_1['dropped']:,} plain bases, "
    f"the smallest 1% of every layer, raised the loss by {plain_1['change']:+.2f}; the smallest 5% of one layer, "
    f"{short(one)}, by {one_5['change']:+.2f} on its own. Whitened on other windows, the smallest 5% of every layer "
    f"({other_5['dropped']:,} bases) cost {other_5['change']:+.2f} and 30% ({other_30['dropped']:,}) "
    f"{other_30['change']:+.2f}; whitened on the measured windows themselves, {same_5['change']:+.2f} and "
    f"{same_30['change']:+.2f}. The gap between the two red shades is the price of whitening on "
    f"{whitening_windows.numel():,} tokens of other text instead of the text measured: the deeper the cut, the more it "
    f"relies on directions those tokens hardly excited (exercise 1 shows the same with a tiny damping)."))

# %% [markdown]
# Why? The plain SVD ranks a direction of `W` by the weight alone. If the
# layer's inputs are huge along that direction (language models carry a few
# input channels whose activations are far larger than the rest), a basis with
# a tiny `sigma_i` can still carry a large share of the layer's output. For
# block 1's `v_proj`, the share of its output on the measured windows that each
# tail carries (computed like `truncation_errors`, from the windows' second
# moment of its inputs):

# %%
def tail_output_error(bases, drop: int, second_moment: torch.Tensor, weight: torch.Tensor) -> float:
    """sqrt(E||x T^T||^2 / E||x W^T||^2) for T the last ``drop`` bases, inputs x of second moment C (in, in)."""
    if drop == 0:
        return 0.0
    U_, s_, V_ = bases  # (out, r), (r,), (in, r)
    a, v = U_[:, -drop:] * s_[-drop:], V_[:, -drop:]  # (out, d), (in, d)
    tail_energy = float(((a.T @ a) * (v.T @ second_moment @ v)).sum())  # tr(T C T^T)
    return max(tail_energy / float(((weight @ second_moment) * weight).sum()), 0.0) ** 0.5


w_one, c_one, r_one = linears[one].weight.detach(), measured_moments[one], min(linears[one].weight.shape)
for label, share_cut in (("plain SVD", 0.01), ("plain SVD", 0.05), (OTHER, 0.05), (OTHER, 0.30)):
    drop = round(share_cut * r_one)
    print(f"{short(one)}, {label}, smallest {share_cut:.0%} ({drop} bases): "
          f"{tail_output_error(bases_of[label][one], drop, c_one, w_one):.1%} of its output")
channel_rms = c_one.diagonal().sqrt()  # (in,) root mean square of each input channel
print(f"its input channels: the largest root mean square is {float(channel_rms.max() / channel_rms.median()):.0f}x "
      f"the median channel's")
del plain_bases, whitened_other, whitened_same, other_moments, measured_moments, bases_of

# %% [markdown]
# Whitening is what makes "small" mean "unimportant": it measures every
# direction of `W` by the layer's actual inputs (`W S` instead of `W`), so a
# direction that the inputs use heavily gets a large coefficient and is not
# in the tail. How well it does so depends on how much text the statistics
# came from, as the two red shades show.
#
# This is what happened to the *published* protocol (plain SVD bases, each
# layer's importance-mass candidate pool, a one-probe curvature estimate) when
# it was given its own schedule of 40 rounds of 12 iterations on the same
# model, fine-tuned on the math task, on one H100 (seed 0). The run ships in
# [data/sweeps/paper-40x12-h100/](../data/sweeps/paper-40x12-h100/) (its
# `command.txt` says where and how it ran; `sweep.log` holds every round's line):

# %%
gpu_run = shipped_sweep("paper-40x12-h100")
if gpu_run is None:
    print("data/sweeps/paper-40x12-h100 is not in this installation (it ships with a checkout of the repository)")
else:
    rounds = round_losses((gpu_run / "sweep.log").read_text(encoding="utf-8"))  # (round, rounds, kept, loss)
    gpu_rows = read_study_rows(gpu_run / "results.jsonl")
    gpu_dense = next(r for r in gpu_rows if r.method == "dense")
    gpu_bsi = sorted((r for r in gpu_rows if r.method == "bsi"), key=lambda r: -r.target)
    same_model = json.loads((gpu_run / "sweep.json").read_text(encoding="utf-8"))["config"]["model"] == settings.model
    all_bases = sum(min(m.weight.shape) for m in linears.values())  # every layer's full rank, on this model
    first_cut = 1 - rounds[0][2] / all_bases if same_model else float("nan")  # the GPU ran the embedded model
    first_cut_text = f"{first_cut:.1%} of the bases" if same_model else "its first bases"
    display(markdown_table([{"round": f"{i} of {total}", "bases kept after it": f"{kept:,}" + (
                                 f" ({kept / all_bases:.0%})" if same_model else ""),
                             "mean tuning loss during it": f"{loss:.3f}"}
                            for i, total, kept, loss in rounds[:3] + rounds[-1:]]))
    display(markdown_table([{"model": "dense (fine-tuned)", "size": "1.00x",
                             "accuracy": f"{gpu_dense.metrics.accuracy:.1%}", "answer loss": f"{gpu_dense.metrics.loss:.3f}"}]
                           + [{"model": f"bsi, paper protocol, {r.target:.0%} of the linear layers' parameters kept",
                               "size": f"{r.compression_ratio:.2f}x smaller", "accuracy": f"{r.metrics.accuracy:.1%}",
                               "answer loss": f"{r.metrics.loss:.3f}"} for r in gpu_bsi]))
    display(Markdown(
        f"Round 1 ran at tuning loss {rounds[0][3]:.3f} and cut {first_cut_text}; during round 2 the "
        f"tuning loss was {rounds[1][3]:.2f}, and it never came back (round {rounds[-1][0]}: {rounds[-1][3]:.2f}). "
        f"After recovery the compressed models answered {', '.join(f'{r.metrics.accuracy:.1%}' for r in gpu_bsi)} of "
        f"the {gpu_dense.metrics.examples} test problems at {', '.join(f'{r.compression_ratio:.2f}x' for r in gpu_bsi)}, "
        f"against {gpu_dense.metrics.accuracy:.1%} for the dense model. One run, one seed: no interval over runs."))

# %% [markdown]
# The table of section 4 shows the mechanism on the same model: a cut of a
# few percent of plain-SVD bases, taken from the small end where the
# published candidate pool looks, can remove bases that the model cannot do
# without. Whitened bases, cut much deeper, cost a fraction of that.
#
# Is it the bases, or the estimate that should have protected them? The same
# GPU run was repeated with one setting of the published protocol changed at
# a time ([data/sweeps/paper-40x12-one-change-h100/](../data/sweeps/paper-40x12-one-change-h100/),
# seed 0): `paper-whitened` swaps in whitened bases, `paper-layer-probes`
# estimates the curvature with one probe per layer, as the published
# pseudo-code draws, instead of one probe over the whole model (421 gradient
# passes per profiling batch instead of 3). The loss during round 2 is what
# round 1's cut did:

# %%
one_change = shipped_sweep("paper-40x12-one-change-h100")
if one_change is None:
    print("data/sweeps/paper-40x12-one-change-h100 is not in this installation (it ships with a checkout)")
else:
    change_rows = []
    for log in sorted(one_change.glob("sweep-*.log")):
        found = {i: (total, loss) for i, total, _, loss in round_losses(log.read_text(encoding="utf-8"))}
        last = max(found)
        change_rows.append({"protocol-method (its log)": log.stem.removeprefix("sweep-"),
                            **{f"round {i}": f"{found[i][1]:.3f}" if i in found else "-" for i in (1, 2, 3)},
                            "rounds finished": f"{last} of {found[last][0]}"})
    display(markdown_table(change_rows))
    recovered = read_study_rows(one_change / "results.jsonl")  # the dense model first: what each started from
    display(markdown_table([{"protocol": r.protocol, "method": r.method, "linear-layer parameters kept": f"{r.target:.0%}",
                             "accuracy": f"{r.metrics.accuracy:.1%}", "answer loss": f"{r.metrics.loss:.3f}"}
                            for r in sorted(recovered, key=lambda r: (r.method != "dense", r.protocol, r.method,
                                                                      -r.target))]))

# %% [markdown]
# Whitened bases alone remove the collapse: the tuning loss does not rise at
# the first cuts, and at the mildest size the published method then answers
# *more* problems than the fine-tuned dense model it started from (the table's
# first row; the path's tuning and the recovery are training the dense model
# never got). Probing each layer on its own, a
# less noisy estimate than one probe for the whole model but still an
# estimate, not the exact diagonal, shrinks the first cut's damage several-fold
# but does not remove it, and at about 200 s a round on a GPU its path could
# not be finished.
# One seed, one path per row: a hint of the mechanism, not a measured
# effect size. And the whitened rows do not favour BSI: `basel`, which keeps
# the bases with the largest re-learned |sigma|, ends with the lower loss at
# all three sizes ([the results page](../docs/results/paper-40x12-one-change-h100.md)
# gives the intervals and our reading of why).
#
# ## 5. What keeping `r` bases costs
#
# A layer that keeps `r` bases and `a` auxiliary vectors is exported as two
# factors, `A = [U diag(sigma), U_aux]` of shape `(out, r+a)` and
# `B = [V, V_aux]^T` of shape `(r+a, in)`: sigma folds into `A`, so it costs
# nothing extra.

# %%
display(Markdown(doc_markdown(factor_cost, paragraphs=1)))
display(Markdown(doc_markdown(break_even_rank, paragraphs=1)))

# %% [markdown]
# At full rank the factors cost *more* than the matrix, so a layer saves nothing
# until it has lost `full rank - r*` bases; above `r*` the exporter simply
# stores it dense.

# %%
aux = 8
fin, fout = linear.in_features, linear.out_features
ranks = torch.arange(0, min(fin, fout) + 1)
r_star = break_even_rank(fin, fout, aux)
fig = go.Figure()
fig.add_trace(go.Scatter(x=ranks, y=[factor_cost(fin, fout, int(r), aux) for r in ranks], name="factors (r+a)(in+out)"))
fig.add_trace(go.Scatter(x=ranks, y=[fin * fout] * len(ranks), name="dense in*out", line={"dash": "dash"}))
fig.add_vline(x=r_star, line_dash="dot", annotation_text=f"break-even r* = {r_star:.0f}",
              annotation_position="top left")
fig.update_layout(height=380, title=f"Parameters of {short(name)} ({fout}x{fin}) by rank, a = {aux}",
                  xaxis_title="bases kept r", yaxis_title="parameters", legend={"orientation": "h", "y": -0.2})
fig.show()

# %% [markdown]
# What to see: the factors' line crosses the dense line at `r*`; to its right
# the factors cost more than the matrix.
#
# Every kind of layer in the model, with its break-even rank (the share of the
# full rank a layer must fall below before it saves a single parameter):

# %%
shapes = {}
for n in names:
    shapes.setdefault(layer_kind(n), (linears[n].in_features, linears[n].out_features))
kinds = [{"kind": kind, "in": i, "out": o, "dense params": i * o, "full rank": min(i, o),
          "break-even rank": break_even_rank(i, o, aux), "share": break_even_rank(i, o, aux) / min(i, o)}
         for kind, (i, o) in shapes.items()]
display(markdown_table([{"kind": r["kind"], "in x out": f"{r['in']} x {r['out']}", "dense params": f"{r['dense params']:,}",
                         "full rank": r["full rank"], f"break-even rank (a = {aux})": f"{r['break-even rank']:.0f}",
                         "share of full rank": f"{r['share']:.0%}"} for r in kinds]))
kind_params = {kind: 0 for kind in shapes}
for n in names:
    kind_params[layer_kind(n)] += linears[n].in_features * linears[n].out_features
typical = max({round(r["share"], 2) for r in kinds}, key=lambda s: sum(round(r["share"], 2) == s for r in kinds))
typical_kinds = [r["kind"] for r in kinds if round(r["share"], 2) == typical]
typical_params = sum(kind_params[kind] for kind in typical_kinds) / sum(kind_params.values())
others = ", ".join(f"{r['kind']} {r['share']:.0%}" for r in kinds if r["kind"] not in typical_kinds)
display(Markdown(
    f"Break-even: {typical:.0%} of the full rank for {len(typical_kinds)} of the {len(kinds)} kinds of layer "
    f"({', '.join(typical_kinds)}), which hold {typical_params:.0%} of the compressible parameters; "
    f"{others or 'no other kind'}. A layer {min(fin, fout)} x {max(fin, fout)} breaks even at "
    f"`in*out/(in+out) - a`, about {max(fin, fout) / (fin + fout):.0%} of its rank before the auxiliary vectors; a "
    f"square one at half. So most layers save nothing until they have lost about {1 - typical:.0%} of their bases."))

# %% [markdown]
# ## 6. The whole model in Basel form
#
# `bsi.method.surgery.to_basis_form` does the same for every linear layer except the
# embeddings (and an output layer tied to them, which *is* the embedding):

# %%
display(Markdown(doc_markdown(to_basis_form, paragraphs=1)))

# %% [markdown]
# We give it the whitened bases of every layer, from the calibration pass of
# section 3 over all of them, as the engine does before its first round:

# %%
with torch.no_grad():
    logits_before = model(input_ids=held_out[0]["input_ids"], attention_mask=held_out[0]["attention_mask"]).logits
t0 = time.perf_counter()
layers = to_basis_form(model, aux_rank=aux, bases=lambda n, lin: whitened_bases(lin.weight, covariances[n]))
seconds = time.perf_counter() - t0
with torch.no_grad():
    logits_after = model(input_ids=held_out[0]["input_ids"], attention_mask=held_out[0]["attention_mask"]).logits
logit_change = float((logits_after - logits_before).abs().max())
now, dense = compressible_parameters(model)
print(f"{len(layers)} layers converted in {seconds:.1f} s; {sum(layer.rank for layer in layers.values()):,} bases in all")
print(f"max |logit change| on a held-out batch: {logit_change:.2e} (logits reach {logits_before.abs().max():.3g})")
print(f"compressible parameters: stored {now:,} / dense {dense:,} (full rank: every layer is still stored dense)")
trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
print(f"trainable now: {trainable:,} numbers (sigma and auxiliary vectors), of {model_parameters(model):,} parameters")

# %% [markdown]
# The table of layers and ranks (what notebook 03 watches shrink round by round),
# summed by kind:

# %%
table = pd.DataFrame(rank_table(model)).astype({"block": "Int64"})
by_kind = table.groupby("kind").agg(layers=("layer", "count"), bases=("rank", "sum"), stored=("params", "sum"),
                                    dense=("dense_params", "sum"))
display(markdown_table([{"kind": kind, "layers": r.layers, "bases": f"{r.bases:,}", "stored params": f"{r.stored:,}",
                         "dense params": f"{r.dense:,}"} for kind, r in by_kind.iterrows()]))

# %% [markdown]
# The largest coefficient of each layer, block by block. In whitened bases it is
# the layer's largest output contribution on task inputs, so it follows the scale
# of the activations, not only of the weights. The largest over the whole model,
# `sigma_max` (`bsi.method.surgery.sigma_max`), sets the perturbation intensity
# `eps` of the Hutchinson estimator (notebook 02).

# %%
table["sigma_1"] = [float(layers[n].sigma.detach().max()) for n in table["layer"]]
grid = table.dropna(subset=["block"]).pivot(index="kind", columns="block", values="sigma_1")
log_grid = grid.apply(lambda column: column.map(lambda v: math.log10(v)))
decades = range(math.floor(log_grid.min().min()), math.ceil(log_grid.max().max()) + 1)
fig = go.Figure(go.Heatmap(z=log_grid.values, x=grid.columns, y=grid.index, colorscale="Viridis",
                           customdata=grid.values, hovertemplate="block %{x}, %{y}: sigma_1 %{customdata:.3g}<extra></extra>",
                           colorbar={"title": "sigma_1", "tickvals": list(decades),
                                     "ticktext": [f"{10 ** d:g}" for d in decades]}))
fig.update_layout(height=360, title="Largest coefficient per layer (whitened bases), log colour scale",
                  xaxis_title="block", margin={"l": 130})
fig.show()
sigma_all = table["sigma_1"].sort_values(ascending=False)
top = table.loc[sigma_all.index[:3], "layer"].map(short).tolist()
print(f"sigma_max = {sigma_max(model):.1f} in {table.loc[table['sigma_1'].idxmax(), 'layer']}; "
      f"median of the layers' sigma_1: {sigma_all.median():.1f}; the three largest: {', '.join(top)}")
within = float(((sigma_all >= sigma_all.median() / 10) & (sigma_all <= sigma_all.median() * 10)).mean())
display(Markdown(
    f"What to see: the colour is `log10(sigma_1)`, one step of the colour bar per factor of ten (on a linear scale "
    f"the largest, {sigma_all.iloc[0]:.0f} in {top[0]}, turned every other cell one colour). {within:.0%} of the "
    f"{len(sigma_all)} layers lie within a factor of ten of the median, {sigma_all.median():.1f}; the largest is "
    f"{sigma_all.iloc[0] / sigma_all.median():.0f}x the median. That one layer sets `sigma_max`, and so `eps`, "
    f"for the whole model."))

# %%
outcome = {"logit_change": logit_change, "logit_scale": float(logits_before.abs().max()),
           "exact_error": {label: float(e["output"][-1]) for label, e in errors.items()},
           "output_error_at_half": output_at_half, "layers": len(layers),
           "text_loss": float(dense_losses.mean()), "tail_losses": {f"{r['bases']}, {r['layers']}, {r['share']:.0%}":
                                                                    r["loss"] for r in tails},
           "break_even_share": {r["kind"]: r["share"] for r in kinds}}
print(f"Result: {len(layers)} layers ({sum(layer.rank for layer in layers.values()):,} bases) in Basel form, "
      f"max |logit change| {logit_change:.1e}; keeping half of {name.rsplit('.', 1)[-1]}'s bases loses "
      f"{output_at_half['whitened']:.1%} of its output on held-out task inputs with whitened bases against "
      f"{output_at_half['plain SVD']:.1%} with plain ones; WikiText-2 loss {outcome['text_loss']:.2f} -> "
      f"{plain_1['loss']:.2f} with the smallest 1% of plain bases dropped, {other_5['loss']:.2f} with 5% of "
      f"whitened ones; ran in {time.perf_counter() - start:.0f} s")

# %% [markdown]
# ## What the data say
#
# Every result this run printed, the unflattering ones first:
#
# *The code that writes this reading from the run's numbers is folded in the
# notebook (open it there); the rendered pages show only what it wrote.*

# %% tags=["hide-input"]
W, L = windows.shape
display(Markdown("\n".join([
    f"* **The plain SVD's smallest bases are not unimportant on this model.** Dropping the smallest 1% of every "
    f"layer's plain bases ({plain_1['dropped']:,} bases) took the WikiText-2 loss from {outcome['text_loss']:.2f} to "
    f"{plain_1['loss']:.2f}; 5% of every `v_proj` to {v_5['loss']:.2f}; 5% of {short(one)} alone to "
    f"{one_5['loss']:.2f}. Measured on {W} windows of {L} tokens ({W * (L - 1):,} predictions), one draw of windows, "
    f"no training: the smallest rise of any window in these three cuts was "
    f"{min(r['change_low'] for r in (plain_1, v_5, one_5)):+.2f}, while the windows' own losses spread from "
    f"{float(dense_losses.min()):.2f} to {float(dense_losses.max()):.2f}.",
    "* **The published protocol collapsed on this model** (section 4's GPU run: one seed, one run, no interval over "
    "runs" + (f"; its tuning loss went from {rounds[0][3]:.3f} to {rounds[1][3]:.2f} after its first cut ("
              f"{first_cut_text}, plain ones, from each layer's small-sigma pool)" if gpu_run is not None else "")
    + "). The cuts above are consistent with that: small plain bases can be bases the model needs. Whether the "
    "paper's importance estimate, given a better curvature estimate than one probe per layer, could have protected "
    "them is open.",
    f"* **A layer saves nothing until it has lost about {1 - typical:.0%} of its bases** ({typical:.0%} break-even for "
    f"{len(typical_kinds)} of {len(kinds)} kinds, {typical_params:.0%} of the parameters; exact arithmetic on the "
    f"shapes, no noise).",
    f"* **The whitened bases lose on the weight:** at half of {short(name)}'s bases, weight error "
    f"{float(errors['whitened']['weight'][half]):.2f} against {float(errors['plain SVD']['weight'][half]):.2f} for the "
    f"plain SVD, as Eckart-Young says they must; the output error, what the model feels, is "
    f"{output_at_half['whitened']:.1%} against {output_at_half['plain SVD']:.1%} on {len(held_out)} held-out task "
    f"batches (one layer; exercise 2 counts the other layers).",
    f"* **Whitened tails cost far less, but not nothing:** with bases whitened on other windows, dropping the "
    f"smallest 5% of every layer ({other_5['dropped']:,} bases, {other_5['dropped'] / plain_1['dropped']:.0f}x the plain "
    f"cut above) raised the loss by {other_5['change']:+.2f} (windows from {other_5['change_low']:+.2f} to "
    f"{other_5['change_high']:+.2f}) and 30% by {other_30['change']:+.2f}; whitened on the measured windows "
    f"themselves (in-sample, the best case) {same_5['change']:+.2f} and {same_30['change']:+.2f}. The out-of-sample "
    f"figure is the one a compression run meets. The gap suggests that {whitening_windows.numel():,} tokens of "
    f"statistics may be too few for deep cuts (a guess this notebook does not test: more windows would). Same {W} "
    f"windows, one draw, no interval.",
    f"* **The conversion is exact:** the whole model in Basel form changed no logit by more than {logit_change:.1e} "
    f"(logits up to {outcome['logit_scale']:.3g}): float32 round-off.",
    f"* **One layer sets eps:** `sigma_max` = {sigma_max(model):.0f} ({top[0]}), against a median `sigma_1` of "
    f"{sigma_all.median():.1f} over the {len(table)} layers (whitened on {len(calibration)} task batches).",
])))

# %% [markdown]
# ## Recap
#
# * A linear layer is a sum of rank-one bases, `W = sum_i sigma_i u_i v_i^T`;
#   dropping basis `i` means `sigma_i := 0`, and keeping `r` of them costs
#   `r (in + out)` parameters (plus `a (in + out)` for `a` auxiliary vectors).
# * The **Basel form** (`BasisLinear`) is exact at start: the whole model
#   computes the same logits after the conversion, up to float32 round-off.
# * *Which* factorisation matters once bases go: the plain SVD keeps the weight
#   (Eckart-Young), the whitened SVD keeps the layer's output on the task's
#   inputs. On this model the plain SVD's *smallest* bases are not
#   unimportant: a 1% cut of them breaks the model, where a whitened cut five
#   times deeper costs a small fraction of that (section 4 has the figures).
#   Whitening makes "small" mean "unimportant", the better the more text its
#   statistics come from; the published protocol, on plain bases, collapsed here.
# * A layer saves parameters only below its break-even rank
#   `r* = in*out/(in+out) - a`: 71% of the full rank for most kinds of layer
#   in this model (section 5 computes it), half for a square one.
#
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
# wins = []
# for n in names:
#     w = model.get_submodule(n).dense_weight().detach()  # (out, in), exact: the auxiliary term is zero
#     k = min(w.shape) // 2
#     e_plain = float(truncation_errors(w, svd_bases(w), held_out_covariances[n])[k])
#     e_white = float(truncation_errors(w, whitened_bases(w, covariances[n]), held_out_covariances[n])[k])
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
# * SVD-LLM (the whitening of section 3): Xin Wang, Yu Zheng, Zhongwei Wan,
#   Mi Zhang. *SVD-LLM: Truncation-aware Singular Value Decomposition for Large
#   Language Model Compression*. [arXiv:2403.07378](https://arxiv.org/abs/2403.07378).
# * [docs/method.md](../docs/method.md), sections 1 (the Basel form) and 2
#   (plain or whitened bases).
# * The GPU runs of section 4: [data/sweeps/paper-40x12-h100/](../data/sweeps/paper-40x12-h100/), and with one
#   setting changed at a time [data/sweeps/paper-40x12-one-change-h100/](../data/sweeps/paper-40x12-one-change-h100/).
# * Next: [02 · Importance scoring](02_importance_scoring.ipynb), which bases
#   can go.
