# Source of notebooks/03_pruning_rounds.ipynb (build: python notebooks/build.py).

# %% [markdown]
# # 03 · Pruning rounds: watching the engine work
#
# Notebooks 01 and 02 took one layer apart. Here the engine runs for real on the
# whole model: the three-stage pipeline (task fine-tune, compress, recover) with
# a short schedule, driven step by step from this notebook. We watch
#
# * each layer's rank, round by round, and which layers lose the most;
# * the loss and the task accuracy along the way;
# * any round and any layer in detail, with widgets;
# * and finally the model's answers in a chat, before and after.
#
# The schedule, in the words of the configuration's docstring:

# %%
import time

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
import torch
from IPython.display import HTML, Markdown, display
from transformers.utils import logging as hf_logging
from plotly.subplots import make_subplots

from bsi import CompressConfig, Pipeline, make_config
from bsi.chat import ChatSession
from bsi.pipeline.evaluate import evaluate
from bsi.method.surgery import compressible_parameters, model_parameters
from bsi.reports import RoundReport, StepReport
from bsi.teaching import block_index, doc_markdown, layer_kind, notebook_settings, rank_history

display(Markdown(doc_markdown(CompressConfig)))

# %% [markdown]
# ## 1. Settings, model and stage 1 (task fine-tuning)
#
# A short version of the `default` preset, so the whole notebook runs in a few
# minutes on a CPU. Stage 1 fine-tunes the dense model on the task (embedded
# word problems in GSM8K's format); its result is cached under `~/.cache/bsi`, so
# a second run of this notebook skips it.

# %%
hf_logging.disable_progress_bar()  # no loading bars between the results
settings = notebook_settings()
start = time.perf_counter()
torch.manual_seed(0)
config = make_config(None, settings.pipeline_overrides())
c = config.compress
print(f"model {config.model}; rounds T={c.rounds}, {c.round_length} iterations per round "
      f"({c.round_length - c.profiling_iters} tuning + {c.profiling_iters} profiling), KeepRatio {c.keep_ratio} "
      f"-> keep {c.keep_per_round:.3f} of the pool's importance per round, pool rho {c.pool_rho:.3f}")
pipeline = Pipeline(config)  # no out_dir: everything stays in memory
pipeline.load()
finetune_losses = []
for report in pipeline.finetune_stage():
    if isinstance(report, StepReport):
        finetune_losses.append(report.loss)
    else:
        print(f"stage 1: {report.event} {'(from cache) ' if report.cached else ''}{report.detail}")
model, tokenizer, test = pipeline.model, pipeline.tokenizer, pipeline.task.test[: settings.eval_examples]
if finetune_losses:
    print(f"fine-tuned for {len(finetune_losses)} steps: loss {finetune_losses[0]:.3f} -> {finetune_losses[-1]:.3f}")

# %% [markdown]
# ## 2. Before compression: accuracy, loss and a chat
#
# Accuracy is the share of test questions whose generated answer ends with the
# right number; the loss is the answer-token cross-entropy, the loss the whole
# method works with. `bsi.chat.ChatSession` answers greedily, so the same
# question always gets the same answer and before/after are comparable.

# %%
def measure(when):
    m = evaluate(model, tokenizer, test, batch_size=16, max_new_tokens=settings.max_new_tokens,
                 max_length=settings.max_length)
    now, dense = compressible_parameters(model)
    return {"when": when, "accuracy": m.accuracy, "loss": m.loss, "params": model_parameters(model),
            "compressible share": now / dense}


def chat(prompts):
    return [ChatSession(model, tokenizer, max_new_tokens=settings.max_new_tokens).reply(p) for p in prompts]


history = [measure("fine-tuned")]
answers_before = chat(settings.chat_prompts)
params_before = history[0]["params"]
print(history[0])
for q, a in zip(settings.chat_prompts, answers_before):
    print(f"Q: {q}\nA: {a}\n")

# %% [markdown]
# ## 3. Stage 2: the pruning rounds
#
# `pipeline.compress()` wraps `bsi.method.engine.Compressor.run()`, a generator: every
# iteration yields a `StepReport` (a tuning step, or a profiling step that only
# gathers `E[g]` and the Hessian-diagonal estimate), and every round ends with a
# `RoundReport` holding, for every layer, sigma, g, h, the importance, the pool
# and the pruned bases. We keep them all, and measure accuracy after each round.

# %%
steps, rounds = [], []
for report in pipeline.compress():
    if isinstance(report, StepReport):
        steps.append(report)
    elif isinstance(report, RoundReport):
        rounds.append(report)
        history.append(measure(f"round {report.round}"))
        print(f"round {report.round}/{report.total_rounds}: compressible layers at {report.compressible_ratio:.1%} "
              f"of their size, mean tuning loss {report.mean_loss:.3f}, accuracy {history[-1]['accuracy']:.0%}, "
              f"eps {report.eps:.1e}, {report.elapsed:.0f} s")

# %% [markdown]
# ## 4. Stage 3: recovery, then the record
#
# A short fine-tune of the remaining sigmas and auxiliary vectors. Then the whole
# record: loss per iteration (tuning and profiling), and per round the accuracy,
# the evaluation loss and the size.

# %%
recover_losses = [r.loss for r in pipeline.recover_stage() if isinstance(r, StepReport)]
history.append(measure("recovered"))
record = pd.DataFrame(history)
record.style.format({"accuracy": "{:.0%}", "loss": "{:.3f}", "params": "{:,}", "compressible share": "{:.1%}"})

# %%
fig = make_subplots(rows=1, cols=2, subplot_titles=("loss per iteration", "per round"),
                    specs=[[{}, {"secondary_y": True}]])
for stage, color in (("train", "#1f77b4"), ("profile", "#ff7f0e")):
    chosen = [s for s in steps if s.stage == stage]
    fig.add_trace(go.Scatter(x=[s.step for s in chosen], y=[s.loss for s in chosen], mode="markers",
                             marker={"color": color, "size": 5}, name=f"{stage} step"), row=1, col=1)
for r in rounds:
    fig.add_vline(x=r.round * config.compress.round_length + 0.5, line_dash="dot", line_width=1, row=1, col=1)
fig.add_trace(go.Scatter(x=record["when"], y=record["accuracy"], name="accuracy", mode="lines+markers"), row=1, col=2)
fig.add_trace(go.Scatter(x=record["when"], y=record["loss"], name="eval loss", mode="lines+markers"),
              row=1, col=2, secondary_y=True)
fig.update_xaxes(title="iteration", row=1, col=1)
fig.update_yaxes(title="accuracy", row=1, col=2)
fig.update_yaxes(title="loss", row=1, col=2, secondary_y=True)
fig.update_layout(height=380)
fig.show()

# %% [markdown]
# ## 5. Ranks, round by round
#
# Each row is a layer, each column the end of a round; colour is the share of its
# full rank still active. The importance-mass rule decides per layer, so layers
# shrink at different speeds: the ones whose bases matter least to the task go first.

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
# ## 6. Any round, any layer
#
# Scrub through the rounds and pick a layer. Top: every active basis at the start
# of that round, by its original SVD index (0 = largest singular value), coloured
# as protected (outside the pool), kept from the pool, or pruned. Bottom: the
# pool's importance `I_i = -sigma_i g_i + 1/2 sigma_i^2 h_i` against `|sigma_i|`.
# (Widgets need a live kernel: run the notebook, then move the slider.)

# %%
index = {layer.name: n for n, layer in enumerate(rounds[0].layers)}
most_pruned = final.sort_values("kept")["layer"].iloc[0]
round_slider = widgets.IntSlider(min=1, max=len(rounds), value=1, description="round")
layer_pick = widgets.Dropdown(options=names, value=most_pruned, description="layer",
                              layout=widgets.Layout(width="420px"))
info = widgets.HTML()
bases = go.FigureWidget(
    [go.Scatter(mode="markers", name=n, marker={"size": 5, "color": c})
     for n, c in (("protected", "#999"), ("pool, kept", "#1f77b4"), ("pruned", "#d62728"))],
    layout={"height": 300, "xaxis_title": "original basis index", "yaxis_title": "sigma_i", "margin": {"t": 30}})
scores = go.FigureWidget(
    [go.Scatter(mode="markers", name=n, marker={"size": 6, "color": c})
     for n, c in (("pool, kept", "#1f77b4"), ("pruned", "#d62728"))],
    layout={"height": 300, "xaxis_title": "|sigma_i|", "yaxis_title": "importance I_i", "margin": {"t": 30}})


def show_round(*_):
    lr = rounds[round_slider.value - 1].layers[index[layer_pick.value]]
    pool = torch.zeros(lr.rank_before, dtype=torch.bool)
    pool[lr.pool] = True
    cut = torch.zeros(lr.rank_before, dtype=torch.bool)
    cut[lr.pruned] = True
    groups = (~pool, pool & ~cut, cut)
    with bases.batch_update():
        for trace, mask in zip(bases.data, groups):
            trace.x, trace.y = lr.basis_ids[mask].tolist(), lr.sigma[mask].tolist()
    with scores.batch_update():
        for trace, mask in zip(scores.data, groups[1:]):
            trace.x, trace.y = lr.sigma[mask].abs().tolist(), lr.importance[mask].tolist()
    info.value = (f"<b>{lr.name}</b>, round {round_slider.value}: rank {lr.rank_before} &rarr; {lr.rank_after}; "
                  f"pool {lr.pool.numel()}, pruned {lr.pruned.numel()}; layer now stores {lr.params_after:,} parameters")


round_slider.observe(show_round, "value")
layer_pick.observe(show_round, "value")
show_round()
display(widgets.VBox([widgets.HBox([round_slider, layer_pick]), info, bases, scores]))

# %% [markdown]
# ## 7. After: the same questions
#
# The compressed model still has its layers in Basel form (exporting them as
# two-factor `LowRankLinear` layers changes nothing in the outputs), so we can
# chat with it directly.

# %%
answers_after = chat(settings.chat_prompts)
params_after = model_parameters(model)
rows = "".join(f"<tr><td>{q}</td><td>{a}</td><td>{b}</td></tr>"
               for q, a, b in zip(settings.chat_prompts, answers_before, answers_after))
display(HTML(f"<table><tr><th>question</th><th>before ({params_before:,} params)</th>"
             f"<th>after ({params_after:,} params)</th></tr>{rows}</table>"))

# %%
before, after = history[0], history[-1]
print(f"Result: {params_before:,} -> {params_after:,} parameters ({params_before / params_after:.2f}x whole model, "
      f"compressible layers at {after['compressible share']:.0%}) in {len(rounds)} rounds; accuracy "
      f"{before['accuracy']:.0%} -> {after['accuracy']:.0%}, loss {before['loss']:.3f} -> {after['loss']:.3f}; "
      f"ran in {time.perf_counter() - start:.0f} s")
