# Source of notebooks/03_pruning_rounds.ipynb (build: python notebooks/build.py).

# %% [markdown]
# # 03 · Pruning rounds: watching the engine work
#
# Notebooks 01 and 02 took one layer apart. Here the engine runs for real on the
# whole model: the three-stage pipeline (task fine-tune, compress, recover),
# driven stage by stage from this notebook with the library's `demo` preset
# (only with fewer test questions, so that it runs in a few minutes on a CPU).
# We watch
#
# * the parameter budget of each round, and what each cut costs on a fixed batch;
# * each layer's rank, round by round, and which layers lose the most;
# * the loss and the task accuracy along the way, and the recovery of the factors;
# * any round and any layer in detail, with widgets;
# * and finally the model's answers in a chat, before and after.
#
# The pruning stage, in the words of its configuration's docstring:

# %%
import time

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
import torch
from IPython.display import HTML, Markdown, display
from plotly.subplots import make_subplots
from transformers.utils import logging as hf_logging

from bsi.analysis.spectrum import layer_kind
from bsi.chat import ChatSession
from bsi.config import PRESETS, CompressConfig, RecoverConfig, SizeRule
from bsi.method.layers import factor_cost
from bsi.method.schedule import gradual_budgets
from bsi.method.surgery import compressible_parameters, model_parameters
from bsi.pipeline.runner import Pipeline
from bsi.reports import EvalReport, RoundReport, StageReport, StepReport
from bsi.teaching import block_index, doc_markdown, notebook_settings, rank_history, rank_table

display(Markdown(doc_markdown(CompressConfig)))
display(Markdown(doc_markdown(SizeRule)))  # its `size`: one rule, one ratio

# %% [markdown]
# ## 1. Settings, model and stage 1 (task fine-tuning)
#
# The configuration is the preset with less work on top. Stage 1 fine-tunes the
# dense model on the task (embedded word problems in GSM8K's format); its result
# is cached under `~/.cache/bsi` by a hash of its settings, so a second run of this
# notebook (or of notebook 05, or of `bsi compress --preset default`) skips it.
# `Pipeline.reference_stage()` loads, fine-tunes and evaluates the dense model:
# what the compressed model is compared with.

# %%
hf_logging.disable_progress_bar()  # no loading bars between the results
settings = notebook_settings()
start = time.perf_counter()
torch.manual_seed(0)
config = settings.pipeline_config()
c = config.compress
print(f"preset '{settings.preset}' = {PRESETS[settings.preset]}\nwith less work: {settings.work}")
print(f"model {config.model}; size mode {c.size.mode}: compressible layers to {c.size.ratio:.0%} of their size in "
      f"T={c.rounds} rounds of {c.round_length} iterations ({c.round_length - c.profiling_iters} tuning + "
      f"{c.profiling_iters} profiling); bases {c.bases}, score {c.score}, curvature {c.curvature}")
pipeline = Pipeline(config)  # no out_dir: everything stays in memory
history, finetune_losses = [], []


def record(report):
    now, dense = compressible_parameters(pipeline.model)
    history.append({"when": report.when, "accuracy": report.accuracy, "loss": report.loss,
                    "params": report.params_total, "compressible share": now / dense})
    return history[-1]


for report in pipeline.reference_stage():
    if isinstance(report, StepReport):
        finetune_losses.append(report.loss)
    elif isinstance(report, EvalReport):
        print(record(report))
    elif report.stage == "finetune" and report.event == "end":
        print(f"stage 1: {'from cache ' if report.cached else ''}{report.detail}")
model, tokenizer = pipeline.model, pipeline.tokenizer
if finetune_losses:
    print(f"fine-tuned for {len(finetune_losses)} steps: loss {finetune_losses[0]:.3f} -> {finetune_losses[-1]:.3f}")

# %% [markdown]
# ## 2. Before compression: a chat
#
# Accuracy (above) is the share of test questions whose generated answer ends with
# the right number; the loss is the answer-token cross-entropy, the loss the whole
# method works with. `bsi.chat.ChatSession` answers greedily, so the same
# question always gets the same answer and before/after are comparable.

# %%
def chat(prompts):
    return [ChatSession(model, tokenizer, max_new_tokens=config.max_new_tokens).reply(p) for p in prompts]


answers_before = chat(settings.chat_prompts)
params_before = history[0]["params"]
for q, a in zip(settings.chat_prompts, answers_before):
    print(f"Q: {q}\nA: {a}\n")

# %% [markdown]
# ## 3. The budgets
#
# In size mode `target` each round has a parameter budget. A layer saves nothing
# until it has lost about half its bases (notebook 01's break-even rank), so the
# rounds budget *factor* parameters, shrinking evenly from the full-rank factors,
# and only the last round budgets the stored size itself:

# %%
display(Markdown(doc_markdown(gradual_budgets)))

# %%
_, dense = compressible_parameters(model)
full_factors = sum(factor_cost(r["in"], r["out"], r["full_rank"], c.aux_rank) for r in rank_table(model))
budgets = gradual_budgets(full_factors, round(c.size.ratio * dense), c.rounds)
pd.DataFrame([{"after round": t, "budget": b, "measured as": m, "of the dense layers": b / dense}
              for t, (b, m) in enumerate(budgets, start=1)]).style.format(
    {"budget": "{:,}", "of the dense layers": "{:.0%}"})

# %% [markdown]
# ## 4. Stage 2: the pruning rounds
#
# `pipeline.compress()` runs the method, here the engine
# (`bsi.method.engine.Compressor`): first a calibration pass (the whitened bases),
# then every iteration yields a `StepReport` (a tuning step, or a profiling step
# that only gathers the score's statistics), and every round ends with a
# `RoundReport` holding, for every layer, sigma, g, h, the score's terms, the pool
# and the pruned bases, plus how many bases went (`removed`) and the loss on a
# fixed batch just before and just after the cut (`loss_before`, `loss_after`).
# We keep them all, and measure accuracy after each round.

# %%
steps, rounds = [], []
for report in pipeline.compress():
    if isinstance(report, StepReport):
        steps.append(report)
    elif isinstance(report, StageReport) and report.event == "note":
        print(f"note: {report.detail}")
    elif isinstance(report, RoundReport):
        rounds.append(report)
        active = sum(layer.rank_before for layer in report.layers)
        evaluation = record(next(r for r in pipeline.evaluate_stage(f"round {report.round}")
                                 if isinstance(r, EvalReport)))
        print(f"round {report.round}/{report.total_rounds}: removed {report.removed:,} of {active:,} bases, "
              f"compressible layers at {report.compressible_ratio:.1%}; loss on the fixed batch "
              f"{report.loss_before:.3f} -> {report.loss_after:.3f} at the cut; accuracy {evaluation['accuracy']:.0%}; "
              f"{report.elapsed:.0f} s")

# %% [markdown]
# The bars show what each cut cost on the same fixed batch (`loss_before` ->
# `loss_after`). Between two cuts the tuning steps of the next round adapt sigma
# and the auxiliary vectors to the bases that are left: compare a round's
# "before" with the previous round's "after" to see what they won back. This is
# why the method prunes gradually rather than all at once.

# %%
fig = make_subplots(rows=1, cols=2, subplot_titles=("loss per iteration", "loss on the fixed batch at each cut"))
for stage, color in (("train", "#1f77b4"), ("profile", "#ff7f0e")):
    chosen = [s for s in steps if s.stage == stage]
    fig.add_trace(go.Scatter(x=[s.step for s in chosen], y=[s.loss for s in chosen], mode="markers",
                             marker={"color": color, "size": 5}, name=f"{stage} step"), row=1, col=1)
for r in rounds:
    fig.add_vline(x=r.round * c.round_length + 0.5, line_dash="dot", line_width=1, row=1, col=1)
fig.add_trace(go.Bar(x=[f"round {r.round}" for r in rounds], y=[r.loss_before for r in rounds], name="before the cut"),
              row=1, col=2)
fig.add_trace(go.Bar(x=[f"round {r.round}" for r in rounds], y=[r.loss_after for r in rounds], name="after the cut"),
              row=1, col=2)
fig.update_xaxes(title="iteration", row=1, col=1)
fig.update_layout(height=380)
fig.show()

# %% [markdown]
# ## 5. Stage 3: recovery of the factors, then the record
#
# Recovery fine-tunes the compressed model on the task again. By default it first
# exports every layer to its cheapest plain form (two factors, or dense where that
# is smaller) and trains those factors, the dense layers and the norms:

# %%
display(Markdown(doc_markdown(RecoverConfig)))

# %%
recover_losses = [r.loss for r in pipeline.recover_stage() if isinstance(r, StepReport)]
record(next(r for r in pipeline.evaluate_stage("recovered") if isinstance(r, EvalReport)))
exported = pd.DataFrame(rank_table(model))
print(f"recovery ({config.recover.train}): {len(recover_losses)} steps"
      + (f", loss {recover_losses[0]:.3f} -> {recover_losses[-1]:.3f}" if recover_losses else ""))
print(exported.groupby("type")["params"].agg(["count", "sum"]).to_string())
record_table = pd.DataFrame(history)
record_table.style.format({"accuracy": "{:.0%}", "loss": "{:.3f}", "params": "{:,}", "compressible share": "{:.1%}"})

# %%
fig = make_subplots(specs=[[{"secondary_y": True}]])
fig.add_trace(go.Scatter(x=record_table["when"], y=record_table["accuracy"], name="accuracy", mode="lines+markers"))
fig.add_trace(go.Scatter(x=record_table["when"], y=record_table["loss"], name="test loss", mode="lines+markers"),
              secondary_y=True)
fig.update_yaxes(title="accuracy")
fig.update_yaxes(title="answer-token loss", secondary_y=True)
fig.update_layout(height=360, title="Accuracy and loss along the pipeline")
fig.show()

# %% [markdown]
# ## 6. Ranks, round by round
#
# Each row is a layer, each column the end of a round; colour is the share of its
# full rank still active. One budget is shared by all layers, so layers shrink at
# different speeds: the ones whose bases matter least to the task go first.

# %%
ranks = rank_history(rounds)  # name -> [r_0, r_1, ..., r_T]
names = list(ranks)
full = {n: ranks[n][0] for n in names}
share = [[r / full[n] for r in ranks[n]] for n in names]
labels = [f"{block_index(n)}.{layer_kind(n)}" if block_index(n) is not None else n for n in names]
fig = go.Figure(go.Heatmap(z=share, x=[f"after {t}" if t else "start" for t in range(len(rounds) + 1)], y=labels,
                           colorscale="Viridis", zmin=0, zmax=1, colorbar={"title": "rank / full"}))
fig.update_layout(height=max(300, 9 * len(names)), title="Active bases per layer", yaxis_autorange="reversed")
fig.show()

# %% [markdown]
# Which layers lose most? Averaged by kind of layer, and by depth:

# %%
final = pd.DataFrame({"layer": names, "kind": [layer_kind(n) for n in names],
                      "block": [block_index(n) for n in names],
                      "full rank": [full[n] for n in names], "rank": [ranks[n][-1] for n in names]})
final["kept"] = final["rank"] / final["full rank"]
fig = make_subplots(rows=1, cols=2, subplot_titles=("share of rank kept, by kind", "by block"))
by_kind = final.groupby("kind")["kept"].mean().sort_values()
fig.add_trace(go.Bar(x=by_kind.index, y=by_kind.values, name="kind"), row=1, col=1)
for kind, group in final.dropna(subset=["block"]).groupby("kind"):
    fig.add_trace(go.Scatter(x=group["block"], y=group["kept"], mode="lines", name=kind), row=1, col=2)
fig.update_yaxes(range=[0, 1.05])
fig.update_layout(height=380)
fig.show()
final.sort_values("kept").head(10).style.format({"kept": "{:.0%}"})

# %% [markdown]
# ## 7. Any round, any layer
#
# Scrub through the rounds and pick a layer. Top: every active basis at the start
# of that round, by its index in the original factorisation (0 = largest
# coefficient), coloured as protected (outside the pool), kept from the pool, or
# pruned. Bottom: the score's two terms for the pool (`LayerRound.terms`), the
# gradient term against the curvature term; a basis' importance is their sum.
# (Widgets need a live kernel: run the notebook, then move the slider.)

# %%
index = {layer.name: n for n, layer in enumerate(rounds[0].layers)}
most_pruned = final.sort_values("kept")["layer"].iloc[0]
round_slider = widgets.IntSlider(min=1, max=len(rounds), value=1, description="round")
layer_pick = widgets.Dropdown(options=names, value=most_pruned, description="layer",
                              layout=widgets.Layout(width="420px"))
info = widgets.HTML()
bases = go.FigureWidget(
    [go.Scatter(mode="markers", name=n, marker={"size": 5, "color": color})
     for n, color in (("protected", "#999"), ("pool, kept", "#1f77b4"), ("pruned", "#d62728"))],
    layout={"height": 300, "xaxis_title": "original basis index", "yaxis_title": "sigma_i", "margin": {"t": 30}})
term_plot = go.FigureWidget(
    [go.Scatter(mode="markers", name=n, marker={"size": 6, "color": color})
     for n, color in (("pool, kept", "#1f77b4"), ("pruned", "#d62728"))],
    layout={"height": 300, "xaxis_title": "gradient term", "yaxis_title": "curvature term", "margin": {"t": 30}})


def show_round(*_):
    lr = rounds[round_slider.value - 1].layers[index[layer_pick.value]]
    pool = torch.zeros(lr.rank_before, dtype=torch.bool)
    pool[lr.pool] = True
    cut = torch.zeros(lr.rank_before, dtype=torch.bool)
    cut[lr.pruned] = True
    groups = (~pool, pool & ~cut, cut)
    zero = torch.zeros(lr.rank_before)
    x, y = lr.terms.get("gradient", lr.importance), lr.terms.get("curvature", zero)
    with bases.batch_update():
        for trace, mask in zip(bases.data, groups):
            trace.x, trace.y = lr.basis_ids[mask].tolist(), lr.sigma[mask].tolist()
    with term_plot.batch_update():
        for trace, mask in zip(term_plot.data, groups[1:]):
            trace.x, trace.y = x[mask].tolist(), y[mask].tolist()
    info.value = (f"<b>{lr.name}</b>, round {round_slider.value}: rank {lr.rank_before} &rarr; {lr.rank_after}; "
                  f"pool {lr.pool.numel()}, pruned {lr.pruned.numel()}; layer now stores {lr.params_after:,} parameters")


round_slider.observe(show_round, "value")
layer_pick.observe(show_round, "value")
show_round()
display(widgets.VBox([widgets.HBox([round_slider, layer_pick]), info, bases, term_plot]))

# %% [markdown]
# ## 8. After: the same questions
#
# The compressed model is an ordinary transformers model now (its layers are
# `LowRankLinear` factors or plain `nn.Linear`), so it chats as before.

# %%
answers_after = chat(settings.chat_prompts)
params_after = model_parameters(model)
rows = "".join(f"<tr><td>{q}</td><td>{a}</td><td>{b}</td></tr>"
               for q, a, b in zip(settings.chat_prompts, answers_before, answers_after))
display(HTML(f"<table><tr><th>question</th><th>before ({params_before:,} params)</th>"
             f"<th>after ({params_after:,} params)</th></tr>{rows}</table>"))

# %%
before, after = history[0], history[-1]
outcome = {"rounds": len(rounds), "removed": [r.removed for r in rounds],
           "cuts": [[r.loss_before, r.loss_after] for r in rounds], "target": c.size.ratio,
           "compressible_share": after["compressible share"], "params": [params_before, params_after],
           "accuracy": [before["accuracy"], after["accuracy"]], "loss": [before["loss"], after["loss"]],
           "ranks_fall": all(h == sorted(h, reverse=True) for h in ranks.values()),
           "types": exported["type"].value_counts().to_dict()}
print(f"Result: {params_before:,} -> {params_after:,} parameters ({params_before / params_after:.2f}x whole model, "
      f"compressible layers at {after['compressible share']:.0%} for a target of {c.size.ratio:.0%}) in "
      f"{len(rounds)} rounds; accuracy {before['accuracy']:.0%} -> {after['accuracy']:.0%}, loss "
      f"{before['loss']:.3f} -> {after['loss']:.3f}; ran in {time.perf_counter() - start:.0f} s")

# %% [markdown]
# ## Recap
#
# * The engine prunes in rounds: each round tunes `sigma` and the auxiliary
#   vectors, profiles the score's statistics, then removes a parameter budget's
#   worth of bases. The budgets shrink evenly in factor parameters and only the
#   last one is the stored-size target, which the run lands on.
# * Each cut raises the loss on the fixed batch; the next round's tuning steps
#   win part of it back. That is why the method cuts gradually.
# * One budget is shared by every layer, so layers shrink at different speeds:
#   the heat map and the by-kind bars show which ones the task needs least.
# * Recovery exports each layer to two factors (or dense, where that is
#   smaller) and fine-tunes them; the compressed model is an ordinary
#   transformers model that answers the same questions.
#
# In numbers, this run:

# %%
display(Markdown(
    f"* parameters {params_before:,} -> {params_after:,} ({params_before / params_after:.2f}x the whole model); "
    f"compressible layers at {after['compressible share']:.1%} for a target of {c.size.ratio:.0%}\n"
    f"* {len(rounds)} rounds; largest cut on the fixed batch: "
    f"{max(r.loss_after - r.loss_before for r in rounds):+.3f} in loss\n"
    f"* accuracy {before['accuracy']:.0%} -> {after['accuracy']:.0%}, test loss {before['loss']:.3f} -> "
    f"{after['loss']:.3f} (on {config.eval_examples} problems: a small sample)\n"
    f"* the layer that kept least: {final.sort_values('kept')['layer'].iloc[0]} "
    f"({final['kept'].min():.0%} of its rank)"))

# %% [markdown]
# ## What to try
#
# Each exercise runs after the notebook, in the same kernel (it uses the
# variables above), and runs the pipeline again with one setting changed: on
# the embedded model a few minutes each (the fine-tune is cached), on the tiny
# model seconds. Predict the outcome first, then open the solution.
#
# **1. The `basel` and `bsi` rank heat maps side by side.** Run the same
# pipeline with `score="basel"` (which selects with each layer's mass rule,
# one keep fraction for all layers) and draw both heat maps of section 6 next
# to each other. Which spreads the cuts more evenly over the layers?
#
# <details><summary>Solution</summary>
#
# ```python
# def rounds_with(compress):
#     """The round reports of a run of this notebook's configuration with `compress` changed (no evaluation)."""
#     run = Pipeline(settings.pipeline_config({"eval_examples": 0, "recover": {"steps": 0}, "compress": compress}))
#     return [r for r in run.run() if isinstance(r, RoundReport)]
#
#
# basel_rounds = rounds_with({"score": "basel"})
# fig = make_subplots(rows=1, cols=2, subplot_titles=("bsi", "basel"), shared_yaxes=True)
# spread = {}
# for col, (label, reports) in enumerate((("bsi", rounds), ("basel", basel_rounds)), start=1):
#     history_of = rank_history(reports)  # name -> [r_0, ..., r_T]
#     kept = [[r / history_of[n][0] for r in history_of[n]] for n in names]
#     spread[label] = float(torch.tensor([row[-1] for row in kept]).std())
#     fig.add_trace(go.Heatmap(z=kept, y=labels, colorscale="Viridis", zmin=0, zmax=1, showscale=col == 2),
#                   row=1, col=col)
# fig.update_yaxes(autorange="reversed")
# fig.update_layout(height=max(300, 9 * len(names)), title="Share of each layer's rank kept, round by round")
# fig.show()
# print({label: f"std of the final kept share across layers {s:.3f}" for label, s in spread.items()})
# ```
#
# What you should see: both runs reach the same size, but not by the same
# cuts. `bsi` ranks every pool basis of every layer together by predicted
# loss per parameter, so some layers keep almost everything while others lose
# most of their rank; `basel` gives every layer the same keep fraction of its
# `|sigma|` mass, so how much a layer loses follows the shape of its spectrum.
# The printed spreads say which run cut more unevenly on this model.
#
# </details>
#
# **2. `aux_rank` 0 against 8.** The `demo` preset gives every layer 8
# auxiliary vectors. Run it with `aux_rank=0`: at the same target size, how
# many more bases does the model keep, and what happens to the test loss?
#
# <details><summary>Solution</summary>
#
# ```python
# run0 = Pipeline(settings.pipeline_config({"compress": {"aux_rank": 0}}))
# reports0 = list(run0.run())
# rounds0 = [r for r in reports0 if isinstance(r, RoundReport)]
# final0 = [r for r in reports0 if isinstance(r, EvalReport)][-1]
# bases_kept = {f"aux_rank {c.aux_rank}": sum(layer.rank_after for layer in rounds[-1].layers),
#               "aux_rank 0": sum(layer.rank_after for layer in rounds0[-1].layers)}
# print(bases_kept, f"({len(rounds[-1].layers)} layers)")
# print(f"aux_rank {c.aux_rank}: accuracy {after['accuracy']:.0%}, loss {after['loss']:.3f}; "
#       f"aux_rank 0: accuracy {final0.accuracy:.0%}, loss {final0.loss:.3f}")
# ```
#
# What you should see: the same compressible size, with roughly `aux_rank`
# more bases per layer kept when there are no auxiliary vectors (each vector
# pair costs as much as a basis). The loss and accuracy differ a little; on
# this few test problems a small difference is noise, not a finding (notebook
# 05 shows how to tell).
#
# </details>
#
# **3. One cut instead of several.** Run with `rounds=1` (the same iterations,
# one cut at the end) and compare its cut on the fixed batch with the gradual
# run's cuts. Why does the method prune gradually?
#
# <details><summary>Solution</summary>
#
# ```python
# single = rounds_with({"rounds": 1})  # the helper of exercise 1
# print(f"one round: loss on the fixed batch {single[0].loss_before:.3f} -> {single[0].loss_after:.3f}, "
#       f"{single[0].removed:,} bases at once")
# for r in rounds:
#     print(f"round {r.round}: {r.loss_before:.3f} -> {r.loss_after:.3f}, {r.removed:,} bases")
# ```
#
# What you should see: on the embedded model, expect the single cut to raise
# the loss on the fixed batch more than any one gradual cut, and to end
# higher than the gradual run's last "after": removing everything at once
# leaves no tuning steps to adapt `sigma` between cuts, and the Taylor score,
# accurate only for small steps, must rank one very large step
# (docs/method.md, section 9, measured that more, smaller cuts rank better).
# On the tiny random model the loss barely moves either way (it has learned
# nothing to lose).
#
# </details>
#
# ## Further reading
#
# * BSI: Daniel Agyei Asante, Ernie Chang, Yang Li. *Importance-Guided Basis
#   Selection for Low-Rank Decomposition of Large Language Models*.
#   [arXiv:2605.01627](https://arxiv.org/abs/2605.01627), 2026. Its Algorithm 1
#   is the round structure run here.
# * Basel: Yang Li, Daniel Agyei Asante, Changsheng Zhao, Ernie Chang, Yangyang
#   Shi, Vikas Chandra. *Basis Selection: Low-Rank Decomposition of Pretrained
#   Large Language Models for Target Applications*.
#   [arXiv:2405.15877](https://arxiv.org/abs/2405.15877).
# * [docs/method.md](../docs/method.md), sections 6 to 10 (size modes, selection,
#   the cut cap, the rounds, the pipeline); [docs/cli.md](../docs/cli.md) for the
#   same run from the command line (`bsi compress --preset demo`).
# * Next: [04 · Curvature](04_curvature.ipynb), how many probes suffice.
