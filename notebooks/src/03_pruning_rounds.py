# Source of notebooks/03_pruning_rounds.ipynb (build: python notebooks/build.py).

# %% [markdown]
# # 03 · Pruning rounds: watching the engine work
#
# Notebooks 01 and 02 took one layer apart. Here the engine runs for real on the
# whole model: the three-stage pipeline (task fine-tune, compress, recover),
# driven stage by stage from this notebook with one of the library's presets
# (with less work, so that it runs in a few minutes on a CPU). We watch
#
# * the parameter budget of each round, and what each cut costs on a fixed batch;
# * each layer's rank, round by round, and which layers lose the most;
# * the loss and the task accuracy along the way, and the recovery of the factors;
# * any round and any layer in detail, and the paper's KeepRatio rule on a real
#   layer, with widgets;
# * what one cut of the whole model at once, planned from one round's scores,
#   would cost, measured against the run's own gradual rounds (with widgets);
# * and finally the model's answers in a chat, before and after.
#
# The pruning stage and its size rule, in the words of their docstrings (the
# schedule's formulas are in the rest of the first, linked below it):

# %%
import json
import time

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
import torch
from IPython.display import HTML, Markdown, display
from plotly.subplots import make_subplots
from transformers.utils import logging as hf_logging

from bsi.analysis.figures import whatif_curve_figure
from bsi.analysis.ranking import RoundSnapshots
from bsi.analysis.spectrum import layer_kind
from bsi.analysis.stats import Outcomes, paired_difference, value_interval
from bsi.analysis.whatif import RANK_LABELS
from bsi.chat import ChatSession
from bsi.config import CompressConfig, RecoverConfig, SizeRule
from bsi.data import extract_answer
from bsi.method.layers import break_even_rank, factor_cost
from bsi.method.schedule import gradual_budgets
from bsi.method.scores import candidate_pool, get_score, mass_rule_keep_count, pool_rho, select_pruned
from bsi.method.surgery import compressible_parameters, model_parameters
from bsi.pipeline.runner import Pipeline
from bsi.pipeline.whatif import WhatIf
from bsi.reports import EvalReport, RoundReport, StageReport, StepReport
from bsi.shipped import shipped_run
from bsi.teaching import block_index, doc_markdown, markdown_rows, notebook_settings, rank_history, rank_table

display(Markdown(doc_markdown(CompressConfig, title=False, paragraphs=1)))
display(Markdown(doc_markdown(SizeRule, title=False, paragraphs=2)))


def markdown_table(rows: list[dict]) -> Markdown:
    """A list of dicts (values already formatted as text) as a Markdown table."""
    return Markdown(markdown_rows(rows))


def short(name: str) -> str:
    """model.layers.3.mlp.up_proj -> 3.mlp.up_proj"""
    return name.removeprefix("model.layers.")


# %% [markdown]
# ## 1. Settings, model and stage 1 (task fine-tuning)
#
# The configuration is the preset with less work on top. Stage 1 fine-tunes the
# dense model on the task (embedded word problems in GSM8K's format) for 20
# steps here, against the preset's 50, so that the notebook's first run stays
# at about 5 minutes on 2 cores; its result is cached under `~/.cache/bsi` by a
# hash of its settings, so a second run of this notebook (or of notebooks 02
# and 05, which share it) skips it. `Pipeline.reference_stage()` loads, fine-tunes and evaluates the
# dense model: what the compressed model is compared with.

# %%
hf_logging.disable_progress_bar()  # no loading bars between the results
settings = notebook_settings()
start = time.perf_counter()
torch.manual_seed(0)
config = settings.pipeline_config()
c = config.compress


def flat(d: dict, prefix: str = "") -> list[str]:
    """{'compress': {'rounds': 4}} -> ['`compress.rounds` 4']"""
    return [x for k, v in d.items()
            for x in (flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"`{prefix}{k}` {v}"])]


display(Markdown(
    f"Preset `{settings.preset}`, with less work: {', '.join(flat(settings.work))}. "
    f"Model `{config.model}`; size mode `{c.size.mode}`: the compressible layers to {c.size.ratio:.0%} of their dense "
    f"size in T = {c.rounds} rounds of {c.round_length} iterations ({c.round_length - c.profiling_iters} tuning + "
    f"{c.profiling_iters} profiling); bases `{c.bases}`, score `{c.score}` (with `gradient_z` {c.gradient_z:g}), "
    f"curvature `{c.curvature}`; recovery {config.recover.steps} steps; {config.eval_examples} test problems "
    "answered at each evaluation."))
pipeline = Pipeline(config)  # no out_dir: everything stays in memory
snapshots = RoundSnapshots()  # every round's model before its cut, for section 9's what-ifs
pipeline.before_cut = snapshots.capture
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
        reference = record(report)
    elif report.stage == "finetune" and report.event == "end" and report.cached:
        print("stage 1: the fine-tuned model comes from the cache")
model, tokenizer = pipeline.model, pipeline.tokenizer
if finetune_losses:
    print(f"stage 1: fine-tuned for {len(finetune_losses)} steps, training loss "
          f"{finetune_losses[0]:.3f} -> {finetune_losses[-1]:.3f}")
print(f"the dense fine-tuned model: accuracy {reference['accuracy']:.0%} on {config.eval_examples} test problems, "
      f"test loss {reference['loss']:.3f}, {reference['params']:,} parameters")

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
# A layer stores less than its dense matrix only once it keeps fewer bases than
# its *break-even rank* (notebook 01): its factors cost `(r + a)(in + out)`
# parameters against `in * out` dense, so it breaks even at
# `r = in * out / (in + out) - a`, with `a` the auxiliary vectors. For this
# model, kind by kind:

# %%
_, dense = compressible_parameters(model)
shapes = pd.DataFrame(rank_table(model))
by_kind_shape = shapes.groupby("kind").agg(inp=("in", "first"), out=("out", "first"), full=("full_rank", "first"),
                                           params=("dense_params", "sum"))
break_even = {kind: break_even_rank(r.inp, r.out, c.aux_rank) / r.full for kind, r in by_kind_shape.iterrows()}
display(markdown_table([{"kind": kind, "shape (in x out)": f"{r.inp} x {r.out}", "full rank": r.full,
                         "break-even rank": f"{break_even[kind] * r.full:.0f}",
                         "share of full rank": f"{break_even[kind]:.0%}",
                         "share of the compressible parameters": f"{r.params / dense:.0%}"}
                        for kind, r in by_kind_shape.iterrows()]))
high = [k for k, share in break_even.items() if share > 0.6]
display(Markdown(
    f"So a layer saves nothing until it has lost {1 - max(break_even.values()):.0%} to "
    f"{1 - min(break_even.values()):.0%} of its bases: the {', '.join(f'`{k}`' for k in high)} layers, "
    f"{by_kind_shape.loc[high, 'params'].sum() / dense:.0%} of the compressible parameters, break even at about "
    f"{sum(break_even[k] for k in high) / len(high):.0%} of their rank, the square ones at about "
    f"{min(break_even.values()):.0%}. The rounds therefore budget *factor* parameters, shrinking evenly from the "
    "full-rank factors, and only the last round budgets the stored size itself:"))

# %%
display(Markdown(doc_markdown(gradual_budgets, title=False, paragraphs=2)))

# %%
full_factors = sum(factor_cost(r["in"], r["out"], r["full_rank"], c.aux_rank) for r in rank_table(model))
budgets = gradual_budgets(full_factors, round(c.size.ratio * dense), c.rounds)
display(markdown_table([{"after round": t, "budget (parameters)": f"{b:,}", "measured as": m,
                         "of the dense layers": f"{b / dense:.0%}"} for t, (b, m) in enumerate(budgets, start=1)]))

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
        evaluation = record(next(r for r in list(pipeline.evaluate_stage(f"round {report.round}"))
                                 if isinstance(r, EvalReport)))  # list(): run the stage to its end
        print(f"round {report.round}/{report.total_rounds}: removed {report.removed:,} of {active:,} bases, "
              f"compressible layers at {report.compressible_ratio:.1%}; loss on the fixed batch "
              f"{report.loss_before:.3f} -> {report.loss_after:.3f} at the cut; accuracy {evaluation['accuracy']:.0%}; "
              f"{report.elapsed:.0f} s")

# %% [markdown]
# Left, the training loss of every iteration (each on its own batch of
# problems, so it jumps from batch to batch); the dotted lines mark the cuts. Right, what each cut cost on the same fixed batch (`loss_before` ->
# `loss_after`). Between two cuts the tuning steps of the next round adapt sigma
# and the auxiliary vectors to the bases that are left: compare a round's
# "before" with the previous round's "after" to see what they won back.

# %%
fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                    subplot_titles=("training loss, each iteration", "fixed batch, before and after each cut"))
for stage, color in (("train", "#1f77b4"), ("profile", "#ff7f0e")):
    chosen = [s for s in steps if s.stage == stage]
    fig.add_trace(go.Scatter(x=[s.step for s in chosen], y=[s.loss for s in chosen], mode="markers",
                             marker={"color": color, "size": 6}, name=f"{stage} step"), row=1, col=1)
for r in rounds:
    fig.add_vline(x=r.round * c.round_length + 0.5, line_dash="dot", line_width=1, row=1, col=1)
fig.add_trace(go.Bar(x=[f"round {r.round}" for r in rounds], y=[r.loss_before for r in rounds], name="before the cut",
                     marker_color="#2ca02c"), row=1, col=2)
fig.add_trace(go.Bar(x=[f"round {r.round}" for r in rounds], y=[r.loss_after for r in rounds], name="after the cut",
                     marker_color="#d62728"), row=1, col=2)
fig.update_xaxes(title="iteration", row=1, col=1)
fig.update_yaxes(title="answer-token loss", row=1, col=1)
fig.update_yaxes(title="answer-token loss, fixed batch", row=1, col=2)
fig.update_layout(height=420, template="plotly_white", legend={"orientation": "h", "yanchor": "top", "y": -0.2, "x": 0})
fig.show()

# %% [markdown]
# ## 5. Stage 3: recovery of the factors, then the record
#
# Recovery fine-tunes the compressed model on the task again. By default it first
# exports every layer to its cheapest plain form (two factors, or dense where that
# is smaller) and trains those factors, the dense layers and the norms:

# %%
display(Markdown(doc_markdown(RecoverConfig, title=False, paragraphs=2)))

# %%
recover_losses = [r.loss for r in pipeline.recover_stage() if isinstance(r, StepReport)]
record(next(r for r in list(pipeline.evaluate_stage("recovered")) if isinstance(r, EvalReport)))
exported = pd.DataFrame(rank_table(model))
print(f"recovery ({config.recover.train}): {len(recover_losses)} steps"
      + (f", training loss {recover_losses[0]:.3f} -> {recover_losses[-1]:.3f} (one batch each)" if recover_losses else ""))
kinds_exported = exported.groupby("type")["params"].agg(["count", "sum"])
print("exported: " + "; ".join(f"{int(r['count'])} layers as {t} ({int(r['sum']):,} parameters)"
                               for t, r in kinds_exported.iterrows()))
display(markdown_table([{"when": h["when"], "accuracy": f"{h['accuracy']:.0%}", "test loss": f"{h['loss']:.4f}",
                         "parameters": f"{h['params']:,}", "compressible share": f"{h['compressible share']:.1%}"}
                        for h in history]))

# %% [markdown]
# The same record as a figure, each point with its 95% interval: a bootstrap
# over the test problems (`bsi.analysis.stats.value_interval`), which says how
# much of the movement the small test set alone could produce.

# %%
def outcomes(when: str) -> Outcomes:
    """The per-problem outcomes of one evaluation, as the statistics module takes them."""
    return Outcomes.from_columns(pipeline.evaluations[when].columns())


whens = [h["when"] for h in history]
bands = {stat: [value_interval([outcomes(w)], stat) for w in whens] for stat in ("accuracy", "loss")}
fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                    subplot_titles=(f"accuracy on {config.eval_examples} problems", "test loss (answer tokens)"))
for col, stat, scale in ((1, "accuracy", 100), (2, "loss", 1)):
    values = bands[stat]
    fig.add_trace(go.Scatter(
        x=whens, y=[v.estimate * scale for v in values], mode="lines+markers", showlegend=False,
        error_y={"type": "data", "symmetric": False, "array": [(v.high - v.estimate) * scale for v in values],
                 "arrayminus": [(v.estimate - v.low) * scale for v in values]}), row=1, col=col)
fig.update_yaxes(title="accuracy (%)", range=[0, 100], row=1, col=1)
fig.update_yaxes(title="loss", rangemode="tozero", row=1, col=2)
fig.update_layout(height=400, template="plotly_white", title="Along the pipeline, with 95% intervals")
fig.show()

# %% [markdown]
# ### What recovery did here, and what it does with a real budget
#
# Computed from this run's per-problem outcomes (paired: the same problems
# before and after recovery) and from the shipped run `data/runs/default`,
# which gave recovery, and a copy of the dense model, the same larger budget:

# %%
last = f"round {len(rounds)}"
pruned_o, recovered_o = outcomes(last), outcomes("recovered")
n = len(pruned_o)
lost = [i for i, (a, b) in enumerate(zip(pruned_o.correct, recovered_o.correct)) if a and not b]
won = [i for i, (a, b) in enumerate(zip(pruned_o.correct, recovered_o.correct)) if b and not a]
accuracy_change = paired_difference([recovered_o], [pruned_o], "accuracy")
loss_change = paired_difference([recovered_o], [pruned_o], "loss")
moves = sorted(((b - a) / sum(recovered_o.tokens), i)
               for i, (a, b) in enumerate(zip(pruned_o.loss_sum, recovered_o.loss_sum)))  # each problem's share
top = sorted(moves, key=lambda m: -abs(m[0]))[:2]


def interval(iv, scale: float = 100, unit: str = " points", digits: int = 0) -> str:
    """A difference with its 95% interval, and whether the data support it (an Interval or its dict)."""
    iv = iv if isinstance(iv, dict) else iv.to_dict()
    return (f"{iv['estimate'] * scale:+.{digits}f}{unit}, 95% interval [{iv['low'] * scale:+.{digits}f}, "
            f"{iv['high'] * scale:+.{digits}f}]: " + ("the data support a change" if iv["excludes_zero"] else "within noise"))


said = [
    f"* **n = {n}.** One problem is {100 / n:.1f} points of accuracy. From the end of round {len(rounds)} to after "
    f"recovery, {len(lost)} problem(s) went from right to wrong and {len(won)} from wrong to right: accuracy "
    f"{pruned_o.accuracy():.0%} -> {recovered_o.accuracy():.0%}, a paired difference of "
    f"{interval(accuracy_change)}.",
    f"* **The loss is a mean over {sum(recovered_o.tokens)} answer tokens**, and a few problems carry it: the two "
    f"largest per-problem moves account for {sum(m for m, _ in top):+.4f} of the change "
    f"{pruned_o.loss():.4f} -> {recovered_o.loss():.4f} ({interval(loss_change, 1, '', 4)}).",
    f"* **Why recovery can look worse on a few examples:** it trained {len(recover_losses)} steps on batches of "
    f"{config.batch_size} problems at learning rate {config.recover.lr:g}, and its training loss jumped from batch to "
    f"batch ({min(recover_losses, default=float('nan')):.3f} to {max(recover_losses, default=float('nan')):.3f}) "
    "more than it moved. A nudge that small changes a few answers one way or the other, and which of so few "
    "problems flip is chance: the paired intervals above measure exactly that.",
]
summary_path = shipped_run("default")
if summary_path is not None:
    shipped = json.loads((summary_path / "summary.json").read_text(encoding="utf-8"))
    before, after, dense_rec = (shipped[k] for k in ("metrics_before", "metrics_after", "metrics_dense_recovered"))
    vs_dense = shipped["paired"]["recovered - dense_recovered"]
    said.append(
        f"* **With a real budget** (`data/runs/default`: the `default` preset, {after['examples']} problems, "
        f"{shipped['config']['recover']['steps']} recovery steps, compressible layers to "
        f"{shipped['compressible_ratio']:.0%}): the fine-tuned dense model {before['accuracy']:.0%} / "
        f"{before['loss']:.4f}; compressed and recovered {after['accuracy']:.0%} / {after['loss']:.4f}; the dense "
        f"model given the same {shipped['config']['recover']['steps']} steps, the equal-budget reference, "
        f"{dense_rec['accuracy']:.0%} / {dense_rec['loss']:.4f}. There recovery lifts the compressed model above "
        "the dense fine-tune, and the dense model gains at least as much from the same training, so the gain is "
        "the extra training, not the compression. Compressed minus "
        f"equal-budget dense, accuracy {interval(vs_dense['accuracy'])}; loss {interval(vs_dense['loss'], 1, '', 4)}.")
display(Markdown("\n".join(said)))

# %% [markdown]
# ## 6. Ranks, round by round
#
# Each row is a layer, each column the end of a round; colour is the share of its
# full rank still active. One budget is shared by all layers, so layers shrink at
# different speeds: the ones whose bases matter least to the task go first. What
# to see: which rows darken first, and how unevenly the budget falls.

# %%
ranks = rank_history(rounds)  # name -> [r_0, r_1, ..., r_T]
names = list(ranks)
full = {n: ranks[n][0] for n in names}
share = [[r / full[n] for r in ranks[n]] for n in names]
labels = [short(n) for n in names]
fig = go.Figure(go.Heatmap(z=share, x=[f"after {t}" if t else "start" for t in range(len(rounds) + 1)], y=labels,
                           colorscale="Viridis", zmin=0, zmax=1, colorbar={"title": "rank / full"}))
fig.update_layout(height=max(300, 9 * len(names)), title="Active bases per layer (rows: block.kind)",
                  yaxis_autorange="reversed", margin={"l": 150})
fig.show()

# %% [markdown]
# Which layers lose most? Averaged by kind of layer (the black marks are each
# kind's break-even share from section 3: a layer that keeps more than that is
# stored dense after the export), and by depth:

# %%
final = pd.DataFrame({"layer": names, "kind": [layer_kind(n) for n in names],
                      "block": [block_index(n) for n in names],
                      "full rank": [full[n] for n in names], "rank": [ranks[n][-1] for n in names]})
final["kept"] = final["rank"] / final["full rank"]
fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=("mean share of rank kept, by kind",
                                                                             "share kept, by block"))
by_kind = final.groupby("kind")["kept"].mean().sort_values()
kind_label = {k: k.split(".")[-1] for k in by_kind.index}  # self_attn.q_proj -> q_proj
fig.add_trace(go.Bar(x=[kind_label[k] for k in by_kind.index], y=by_kind.values, name="kept (mean)",
                     marker_color="#9ecae1"), row=1, col=1)
fig.add_trace(go.Scatter(x=[kind_label[k] for k in by_kind.index], y=[break_even.get(k) for k in by_kind.index],
                         mode="markers", marker={"symbol": "line-ew-open", "size": 20, "color": "black",
                                                 "line": {"width": 3}}, name="break-even share"), row=1, col=1)
for kind, group in final.dropna(subset=["block"]).groupby("kind"):
    fig.add_trace(go.Scatter(x=group["block"], y=group["kept"], mode="lines", name=kind_label[kind]), row=1, col=2)
fig.update_yaxes(range=[0, 1.05])
fig.update_yaxes(title="mean share of rank kept", row=1, col=1)
fig.update_yaxes(title="share of rank kept", row=1, col=2)
fig.update_xaxes(title="block", row=1, col=2)
fig.update_layout(height=440, template="plotly_white", legend={"orientation": "h", "yanchor": "top", "y": -0.15, "x": 0})
fig.show()
dense_after = (exported["type"] == "Linear").sum()
print(f"{dense_after} of {len(exported)} layers kept more bases than their break-even rank and were exported dense")
display(markdown_table([{"layer": short(r.layer), "full rank": r["full rank"], "rank kept": r["rank"],
                         "share kept": f"{r.kept:.0%}"} for _, r in final.sort_values("kept").head(8).iterrows()]))

# %% [markdown]
# ## 7. Any round, any layer
#
# Scrub through the rounds and pick a layer. Top: every active basis at the start
# of that round, by its index in the original factorisation (0 = largest
# coefficient), coloured as protected (outside the pool), kept from the pool, or
# pruned. Bottom: the score's two ingredients for each pool basis: the
# first-order term `-sigma_i g_i` as measured (x) and the curvature term
# `sigma_i^2 h_i / 2` (y, log scale).
#
# Why the bottom plot looks as it does: near a fine-tuned minimum the mean
# gradient `g_i` over a few profiling batches is mostly batch noise. The default
# score therefore keeps a basis's first-order term only where its gradient
# exceeds `gradient_z` standard errors (the per-example spread of the
# gradient); everywhere else the term is set to zero and the importance is the
# curvature term alone (`bsi.method.scores.significant_gradient`). Ringed
# markers are the bases whose first-order term passed that test.
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
     for n, color in (("protected", "#999"), ("pruned", "#d62728"), ("pool, kept", "#1f77b4"))],  # kept on top
    layout={"height": 320, "xaxis_title": "original basis index", "yaxis_title": "|sigma_i|", "yaxis_type": "log",
            "yaxis_exponentformat": "power", "showlegend": True, "margin": {"t": 40}, "template": "plotly_white",
            "title": "the layer's bases at the cut"})
term_plot = go.FigureWidget(
    [go.Scatter(mode="markers", name=n, marker={"size": 6, "color": color})
     for n, color in (("pool, kept", "#1f77b4"), ("pruned", "#d62728"))]
    + [go.Scatter(mode="markers", name="first-order term kept (passed the test)",
                  marker={"size": 13, "color": "rgba(0,0,0,0)", "line": {"width": 2, "color": "black"}})],
    layout={"height": 340, "xaxis_title": "first-order term -sigma g, as measured",
            "yaxis_title": "curvature term sigma^2 h / 2", "yaxis_type": "log", "yaxis_exponentformat": "power",
            "xaxis_exponentformat": "e", "showlegend": True, "margin": {"t": 40}, "template": "plotly_white",
            "title": "the pool's score terms"})


def show_round(*_):
    lr = rounds[round_slider.value - 1].layers[index[layer_pick.value]]
    pool = torch.zeros(lr.rank_before, dtype=torch.bool)
    pool[lr.pool] = True
    cut = torch.zeros(lr.rank_before, dtype=torch.bool)
    cut[lr.pruned] = True
    groups = (~pool, pool & ~cut, cut)
    zero = torch.zeros(lr.rank_before)
    raw = -lr.sigma * lr.grad if lr.grad is not None else lr.terms.get("gradient", zero)  # (r,) before the test
    curvature = lr.terms.get("curvature", zero)  # (r,)
    passed = pool & (lr.terms.get("gradient", zero) != 0)  # (r,) first-order term kept by the score
    drawn = {"protected": groups[0], "pool, kept": groups[1], "pruned": groups[2]}
    with bases.batch_update():
        for trace in bases.data:
            mask = drawn[trace.name]
            trace.x, trace.y = lr.basis_ids[mask].tolist(), lr.sigma[mask].abs().tolist()
    with term_plot.batch_update():
        for trace, mask in zip(term_plot.data, (*groups[1:], passed)):
            trace.x, trace.y = raw[mask].tolist(), curvature[mask].tolist()
    info.value = (f"<b>{lr.name}</b>, round {round_slider.value}: rank {lr.rank_before} &rarr; {lr.rank_after}; "
                  f"pool {lr.pool.numel()}, pruned {lr.pruned.numel()}; first-order terms that passed the "
                  f"z = {c.gradient_z:g} test: {int(passed.sum())} of {lr.pool.numel()}; "
                  f"layer now stores {lr.params_after:,} parameters")


round_slider.observe(show_round, "value")
layer_pick.observe(show_round, "value")
show_round()
display(widgets.VBox([widgets.HBox([round_slider, layer_pick]), info, bases, term_plot]))

# %%
passing = [r.significant_gradients for r in rounds]
shown = rounds[0].layers[index[most_pruned]]
raw = (-shown.sigma * shown.grad)[shown.pool].abs() if shown.grad is not None else None
curv = shown.terms.get("curvature", torch.zeros(shown.rank_before))[shown.pool]
display(Markdown(
    "What the snapshot shows: "
    + (f"in round 1 the measured first-order terms of `{short(most_pruned)}`'s pool are typically "
       f"{float(raw.median()):.2g} in size against {float(curv.median()):.2g} for the curvature term (medians), "
       "and they scatter on both sides of zero. " if raw is not None else "")
    + "Over all layers, the share of pool bases whose first-order term passed the test, round by round: "
    + ", ".join("n/a" if p != p else f"{p:.1%}" for p in passing)
    + ". Where it is near zero the score is, in effect, the curvature term alone, which is why the plot of the "
    "score's gradient term would be a column of zeros."))

# %% [markdown]
# ## 8. The paper's KeepRatio rule on a real layer
#
# This run chose its cuts by size (size mode `target`: one parameter budget per
# round, spent across all layers). The paper's own rule, size mode `keep`
# (`SizeRule.keep(KeepRatio)`), decides per layer and per round from the
# importance scores alone, in two steps:
#
# 1. **The pool.** Protect the largest bases holding a share
#    `rho = KeepRatio^(gamma/T)` of the layer's `|sigma|` mass; the rest is the
#    candidate pool (`bsi.method.scores.candidate_pool`).
# 2. **The mass rule.** Sort the pool by importance and keep the fewest, most
#    important bases whose importance adds up to `KeepRatio^(1/T)` times the
#    pool's total **positive** importance; prune the rest
#    (`mass_rule_keep_count`, `select_pruned`). A basis with negative
#    importance (removing it is predicted to *lower* the loss) is always
#    pruned, and if every score in the pool is negative, the whole pool goes.
#
# Below, the rule applied by the library's own functions to the real scores one
# layer had at the end of round 1 of this run, with two versions of the score:
# the run's (`gradient_z` test on) and the paper's plain estimate, which keeps
# every first-order term (`gradient_z = 0`, computed here from the same measured
# `sigma`, `g` and `h`). Move the slider: a larger KeepRatio protects more and
# keeps more of the pool's mass. The run scored only its own pool; where the
# rule's pool would be larger (a small KeepRatio), the run's pool is used and
# the line above the plots says so.

# %%
down = [layer for layer in rounds[0].layers if layer.name.endswith("mlp.down_proj")]
example = (down or list(rounds[0].layers))[len(down or rounds[0].layers) // 2]  # a middle block's down-projection
sigma = example.sigma  # (r,) the round's measured coefficients
scores = {f"as run (gradient_z {c.gradient_z:g})": example.importance,  # (r,) what the run ranked with
          "paper's plain estimate (gradient_z 0)": get_score(c.score)(example.sigma, example.grad, example.hessian)}  # (r,)
measured_pool = set(example.pool.tolist())
T, gamma = c.rounds, c.gamma


def rule(keep_ratio: float, importance: torch.Tensor):
    """(pool, pruned positions, keep fraction, whether the rule's own pool was used) of the KeepRatio rule."""
    pool = candidate_pool(sigma, pool_rho(keep_ratio, gamma, T))  # (p,) positions, small |sigma|
    own = set(pool.tolist()) <= measured_pool
    pool = pool if own else example.pool
    fraction = keep_ratio ** (1 / T)
    return pool, select_pruned(importance, pool, fraction), fraction, own


keep_slider = widgets.SelectionSlider(options=[round(0.05 * k, 2) for k in range(1, 20)],
                                      value=min((round(0.05 * k, 2) for k in range(1, 20)),
                                                key=lambda k: abs(k - c.size.ratio)),  # the run's own pool
                                      description="KeepRatio")
score_pick = widgets.ToggleButtons(options=list(scores), value=list(scores)[1], description="score")
rule_info = widgets.HTML()
rule_bases = go.FigureWidget(
    [go.Scatter(mode="markers", name=n, marker={"size": 5, "color": color})
     for n, color in (("protected", "#999"), ("pool, pruned", "#d62728"), ("pool, kept", "#1f77b4"))],  # kept on top
    layout={"height": 320, "xaxis_title": "original basis index", "yaxis_title": "|sigma_i|", "yaxis_type": "log",
            "yaxis_exponentformat": "power", "showlegend": True, "margin": {"t": 40}, "template": "plotly_white",
            "title": "step 1: the pool (the small |sigma|)"})
rule_mass = go.FigureWidget(
    [go.Scatter(mode="markers", name=n, marker={"size": 5, "color": color})
     for n, color in (("kept", "#1f77b4"), ("pruned, positive importance", "#ff7f0e"),
                      ("pruned, negative importance", "#d62728"))]
    + [go.Scatter(mode="lines", name="KeepRatio^(1/T)", line={"dash": "dash", "color": "black"})],
    layout={"height": 340, "xaxis_title": "pool bases, most important first",
            "yaxis_title": "running share of positive importance", "yaxis_range": [0, 1.05], "margin": {"t": 40},
            "showlegend": True, "template": "plotly_white", "title": "step 2: the mass rule"})


def show_rule(*_):
    importance = scores[score_pick.value]
    pool, pruned, fraction, own = rule(keep_slider.value, importance)
    in_pool = torch.zeros(sigma.numel(), dtype=torch.bool)  # (r,)
    in_pool[pool] = True
    cut = torch.zeros(sigma.numel(), dtype=torch.bool)  # (r,)
    cut[pruned] = True
    drawn = {"protected": ~in_pool, "pool, kept": in_pool & ~cut, "pool, pruned": cut}
    with rule_bases.batch_update():
        for trace in rule_bases.data:
            mask = drawn[trace.name]
            trace.x, trace.y = example.basis_ids[mask].tolist(), sigma[mask].abs().tolist()
    values = importance[pool].sort(descending=True).values  # (p,)
    positive = values.clamp(min=0)
    running = positive.cumsum(0) / positive.sum() if positive.sum() > 0 else torch.zeros_like(values)  # (p,)
    kept = mass_rule_keep_count(importance[pool], fraction)
    x = torch.arange(1, values.numel() + 1)
    groups = (x <= kept, (x > kept) & (values >= 0), (x > kept) & (values < 0))
    with rule_mass.batch_update():
        for trace, mask in zip(rule_mass.data, groups):
            trace.x, trace.y = x[mask].tolist(), running[mask].tolist()
        rule_mass.data[3].x, rule_mass.data[3].y = [1, max(values.numel(), 1)], [fraction, fraction]
    rule_info.value = (
        f"<b>{example.name}</b>, scores of round 1, {score_pick.value}. KeepRatio {keep_slider.value:g} over T = {T} "
        + (f"rounds: protect {pool_rho(keep_slider.value, gamma, T):.1%} of the |sigma| mass, "
           if own else "rounds: its pool would reach bases the run never scored, so this is the run's pool, ")
        + f"{pool.numel()} bases, {int((values < 0).sum())} with negative importance. Keep {fraction:.1%} of the "
        f"pool's positive importance: keeps {kept}, prunes {pool.numel() - kept}. (The run, under its budget, "
        f"pruned {example.pruned.numel()} of its pool of {example.pool.numel()}.)")


keep_slider.observe(show_rule, "value")
score_pick.observe(show_rule, "value")
show_rule()
display(widgets.VBox([widgets.HBox([keep_slider]), score_pick, rule_info, rule_bases, rule_mass]))

# %%
ratios = (0.3, 0.5, 0.7, 0.9)
table = []
for label, importance in scores.items():
    row = {"score": label, "negative in the run's pool": f"{int((importance[example.pool] < 0).sum())} of "
                                                          f"{example.pool.numel()}"}
    for k in ratios:
        pool, pruned, _, own = rule(k, importance)
        row[f"KeepRatio {k}: pruned"] = f"{pruned.numel()} of {pool.numel()}" + ("" if own else " *")
    table.append(row)
display(markdown_table(table))
display(Markdown("\\* the rule's own pool would reach bases the run never scored: the run's pool is used."))

# %%
plain, run_score = scores["paper's plain estimate (gradient_z 0)"], next(iter(scores.values()))
_, pruned_plain, _, _ = rule(0.7, plain)
display(Markdown(
    f"What to see: the pool is the long tail of small coefficients. With the paper's plain estimate, "
    f"{int((plain[example.pool] < 0).sum())} of the {example.pool.numel()} pool bases have negative importance (their "
    "measured first-order term, mostly batch noise, outweighs the curvature term), and the rule prunes every one of "
    f"them at any KeepRatio: at 0.7 it prunes {pruned_plain.numel()} in this one round, where the run's budget took "
    f"{example.pruned.numel()}. With the run's score {int((run_score[example.pool] < 0).sum())} are negative, and the "
    "KeepRatio alone sets how much of the pool's importance is kept. A KeepRatio of `q^T` keeps `q` of the mass in "
    "each of the `T` rounds."))

# %% [markdown]
# ## 9. What if the whole model were cut at once?
#
# Every round scores every basis, so one round's scores already say, for any
# size, which bases a cut of that size would take and what it is predicted to
# cost: the sum of their importance. The run kept each round's model before its
# cut (`RoundSnapshots`, set up in section 1), so such a cut can also be
# *measured*: the bases' coefficients set to zero, the held-out loss scored,
# no retraining. `bsi.analysis.whatif` plans, `bsi.pipeline.whatif` measures; the dashboard's *What if* tab
# is the same code.

# %%
display(Markdown(doc_markdown(WhatIf, title=False, paragraphs=2)))
whatif = WhatIf(rounds, snapshots, pipeline.task.test[: config.eval_examples], tokenizer, answered=0)
first = rounds[0].round

# %% [markdown]
# **A static series** (measured when this notebook ran, so the page reads
# without running anything): from round 1's scores, one cut straight to the
# run's own final size and one deeper, each filled by bsi's importance, by
# `|sigma|` and at random (the same size: only *which* bases go differs),
# beside the run's own model after each of its cuts (its gradual schedule
# and the tuning between rounds, no recovery).

# %%
own_size = rounds[-1].compressible_ratio
series = []
for size in (round(own_size, 2), round(own_size * 0.75, 2)):
    for rank_by in ("bsi", "magnitude", "random"):
        series.append(whatif.measure(whatif.plan(first, "target", size, rank_by), first))
path = [whatif.path_point(r.round) for r in rounds]
def rise_text(estimate) -> str:
    """A measured rise with its paired 95% interval over the held-out problems."""
    return f"{estimate.estimate:+.4f} [{estimate.low:+.4f}, {estimate.high:+.4f}]"


start_loss = whatif.uncut(first)
display(markdown_table(
    [{"cut": f"one shot from round {first}: {RANK_LABELS[p.cut.rank_by]}", "whole model": f"{p.cut.compression:.2f}x",
      "compressible layers": f"{p.cut.compressible_ratio:.1%}", "predicted rise": f"{p.cut.predicted:.4f}",
      "measured rise [95%]": rise_text(p.rise()), "held-out loss": f"{p.measurement.loss:.4f}"} for p in series]
    + [{"cut": f"the run after round {q.round} (rounds + tuning)", "whole model": f"{q.compression:.2f}x",
        "compressible layers": f"{q.compressible_ratio:.1%}", "predicted rise": f"{q.predicted:.4f}",
        "measured rise [95%]": rise_text(q.measurement.loss_minus(start_loss)),
        "held-out loss": f"{q.measurement.loss:.4f}"} for q in path]))
whatif_curve_figure(series, path).show()

# %% [markdown]
# **Your own what-if.** Move the size and change the ranking: the kept share
# of every layer and the predicted loss rise follow at once (a pure function
# of the scores); *Measure* scores the held-out problems with that cut (a few
# seconds on the embedded model) and adds the point to the table below it.

# %%
size_slider = widgets.FloatSlider(value=round(own_size, 2), min=0.05, max=1.0, step=0.01, description="target",
                                  continuous_update=False)
rank_pick = widgets.ToggleButtons(options=[(RANK_LABELS[r], r) for r in ("bsi", "magnitude", "gradient", "random")],
                                  value="bsi", description="rank by")
measure_button = widgets.Button(description="Measure")
plan_info, measured_info = widgets.HTML(), widgets.HTML()
kept_share = go.FigureWidget([go.Bar(name=kind_label[kind]) for kind in kind_label],
                             layout={"height": 320, "barmode": "group", "template": "plotly_white",
                                     "xaxis_title": "block", "yaxis_title": "share of the layer's bases kept",
                                     "yaxis_range": [0, 1.02], "margin": {"t": 30}})


def show_plan(*_):
    cut = whatif.plan(first, "target", size_slider.value, rank_pick.value)
    with kept_share.batch_update():
        for trace, kind in zip(kept_share.data, kind_label):
            names = [n for n in cut.ranks if n.endswith(kind)]
            trace.x = [str(block_index(n)) for n in names]
            trace.y = [cut.kept[n] / max(cut.ranks[n], 1) for n in names]
    plan_info.value = (f"{cut.compression:.2f}x smaller whole model (compressible layers at "
                       f"{cut.compressible_ratio:.1%}), {cut.removed:,} bases removed, <b>predicted loss rise "
                       f"{cut.predicted:.4f}</b>")
    return cut


def on_measure(_):
    point = whatif.measure(show_plan(), first)
    measured_info.value += (f"<br>{point.label}: held-out loss {point.measurement.loss:.4f}, measured rise "
                            f"{point.measured:+.4f} against the predicted {point.cut.predicted:.4f}")


size_slider.observe(show_plan, "value")
rank_pick.observe(show_plan, "value")
measure_button.on_click(on_measure)
show_plan()
display(widgets.VBox([widgets.HBox([size_slider, measure_button]), rank_pick, plan_info, kept_share, measured_info]))

# %% [markdown]
# ## 10. After: the same questions
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
# ## What the data say
#
# *The code that writes this reading from the run's numbers is folded in the
# notebook (open it there); the rendered pages show only what it wrote.*

# %% tags=["hide-input"]
def whatif_reading(series, path) -> str:
    """Section 9's static series in words: the one-shot cuts at the run's size against the run's own model."""
    own = {p.cut.rank_by: p for p in series[:3]}
    last = path[-1]
    gap = own["bsi"].measurement.loss_minus(last.measurement)  # one shot minus the run's own, paired
    order = sorted(own.values(), key=lambda p: p.measurement.loss)
    held = "; ".join(f"{RANK_LABELS[p.cut.rank_by]} predicted {p.cut.predicted:.4f}, measured {rise_text(p.rise())}"
                     for p in own.values())
    verdict = ("the rounds bought" if gap.estimate > 0 else "the rounds cost") + (
        "" if gap.excludes_zero else " (within noise:")
    return (f"* **One cut or rounds** (section 9, {len(whatif.examples)} held-out problems, one run, paired 95% "
            f"intervals over the problems): at the run's own size ({last.compressible_ratio:.0%} of the compressible "
            f"layers), cutting round {first}'s model at once by bsi's scores gave a held-out loss of "
            f"{own['bsi'].measurement.loss:.4f}, the run's own model after its {len(path)} rounds "
            f"{last.measurement.loss:.4f} (no recovery in either): {verdict} {abs(gap.estimate):.4f} of loss, "
            f"[{gap.low:+.4f}, {gap.high:+.4f}]" + ("" if gap.excludes_zero else ")") + ". At that size the "
            f"rankings order as {', '.join(RANK_LABELS[p.cut.rank_by] for p in order)} (lowest loss first); {held}. "
            "Where a measured rise is far above its prediction, the cut is too large for the second-order, "
            "one-basis-at-a-time estimate: the removed bases interact.")


cuts = [r.loss_after - r.loss_before for r in rounds]
won_back = [rounds[t].loss_before - rounds[t - 1].loss_after for t in range(1, len(rounds))]
versus_dense = {stat: paired_difference([outcomes("recovered")], [outcomes(history[0]["when"])], stat)
                for stat in ("accuracy", "loss")}
supported = [stat for stat, iv in versus_dense.items() if iv.excludes_zero]
said = [
    (f"* **Compressed against dense, on these {config.eval_examples} problems:** accuracy {before['accuracy']:.0%} -> "
     f"{after['accuracy']:.0%}, test loss {before['loss']:.4f} -> {after['loss']:.4f}; the paired difference is "
     f"{interval(versus_dense['accuracy'])} in accuracy and {interval(versus_dense['loss'], 1, '', 4)} in loss. "
     + (f"The data support a change in {' and '.join(supported)}; " if supported else
        "Neither difference stands out from the noise of so few problems; ")
     + "one run, one seed, so this says what the test set can show, not what the method does in general."),
    (f"* **Recovery, {len(recover_losses)} steps:** {interval(loss_change, 1, '', 4)} in loss against the end of the "
     "last round (section 5). Section 5 also reads the shipped run where recovery, and an equal-budget dense copy, "
     "had a real budget."),
    f"* **What each cut cost on the fixed batch**: {', '.join(f'{x:+.4f}' for x in cuts)} in loss, round by round "
    f"(from {rounds[0].loss_before:.4f} before the first cut to {rounds[-1].loss_after:.4f} after the last); the "
    "tuning steps between cuts changed it by "
    + (", ".join(f"{x:+.4f}" for x in won_back) if won_back else "nothing (one round)")
    + " (negative: won back). One batch, so these are indications, not measurements of the model.",
    f"* **The chat**: {sum(extract_answer(a) == extract_answer(b) for a, b in zip(answers_before, answers_after))} of "
    f"{len(answers_before)} answers end with the same number after compression as before.",
    "* **Where the bases went**: the kinds kept, on average, "
    + ", ".join(f"{kind_label[k]} {v:.0%}" for k, v in by_kind.items())
    + f" of their rank; {dense_after} layers stayed above their break-even rank and are stored dense.",
    f"* **The first-order term did not count**: {', '.join('n/a' if p != p else f'{p:.1%}' for p in passing)} of "
    "the pool bases passed the gradient test, round by round, so the ranking is the curvature term's (section 7).",
    whatif_reading(series, path),
]
display(Markdown("\n".join(said)))

# %% [markdown]
# ## Recap
#
# * The engine prunes in rounds: each round tunes `sigma` and the auxiliary
#   vectors, profiles the score's statistics, then removes a parameter budget's
#   worth of bases. The budgets shrink evenly in factor parameters (a layer
#   saves nothing until it is below its break-even rank) and only the last one
#   is the stored-size target, which the run lands on.
# * A cut moves the loss on the fixed batch and the next round's tuning steps
#   move it again; in a run this short both moves are of the size of one
#   batch's noise (the numbers are in "What the data say" above). What the
#   gradual schedule buys is measured instead in section 9: the run's own model
#   against one cut of the same size, on held-out problems.
# * One round's scores plan a cut of any size at once (section 9): the sum of
#   the removed bases' importance predicts its loss, well for small cuts and
#   less well for large ones, where the removed bases interact.
# * One budget is shared by every layer, so layers shrink at different speeds:
#   the heat map and the by-kind bars show which ones the task needs least.
# * The default score keeps a first-order term only where the gradient stands
#   out from its noise; the paper's KeepRatio rule keeps a share of each pool's
#   positive importance and always prunes negative scores.
# * Recovery exports each layer to two factors (or dense, where that is
#   smaller) and fine-tunes them; the compressed model is an ordinary
#   transformers model that answers the same questions.

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
