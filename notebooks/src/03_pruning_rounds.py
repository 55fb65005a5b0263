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
from bsi.config import PRESETS, CompressConfig, RecoverConfig
from bsi.method.layers import factor_cost
from bsi.method.schedule import gradual_budgets
from bsi.method.surgery import compressible_parameters, model_parameters
from bsi.pipeline.runner import Pipeline
from bsi.reports import EvalReport, RoundReport, StageReport, StepReport
from bsi.teaching import block_index, doc_markdown, notebook_settings, rank_history, rank_table

display(Markdown(doc_markdown(CompressConfig)))

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
print(f"model {config.model}; size mode {c.size_mode}: compressible layers to {c.target_ratio:.0%} of their size in "
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
budgets = gradual_budgets(full_factors, round(c.target_ratio * dense), c.rounds)
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
           "cuts": [[r.loss_before, r.loss_after] for r in rounds], "target": c.target_ratio,
           "compressible_share": after["compressible share"], "params": [params_before, params_after],
           "accuracy": [before["accuracy"], after["accuracy"]], "loss": [before["loss"], after["loss"]],
           "ranks_fall": all(h == sorted(h, reverse=True) for h in ranks.values()),
           "types": exported["type"].value_counts().to_dict()}
print(f"Result: {params_before:,} -> {params_after:,} parameters ({params_before / params_after:.2f}x whole model, "
      f"compressible layers at {after['compressible share']:.0%} for a target of {c.target_ratio:.0%}) in "
      f"{len(rounds)} rounds; accuracy {before['accuracy']:.0%} -> {after['accuracy']:.0%}, loss "
      f"{before['loss']:.3f} -> {after['loss']:.3f}; ran in {time.perf_counter() - start:.0f} s")
