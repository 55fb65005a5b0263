# Source of notebooks/06_text.ipynb (build: python notebooks/build.py).

# %% [markdown]
# # 06 · Text and perplexity: compressing for general text
#
# Notebooks 03 and 05 compress for one question/answer task and measure
# accuracy. Here the task is plain text, WikiText-2 (shipped inside bsi, no
# download): every token of the text trains, and the model is measured by its
# perplexity on text it never saw. Nothing else changes: the same three stages,
# the same engine, the same loss. What a text task is, in the words of its
# module:

# %%
import json
import math
import time

import plotly.graph_objects as go
import torch
from IPython.display import Markdown, display
from transformers.utils import logging as hf_logging

import bsi.data.text
import bsi.pipeline.perplexity
from bsi.analysis.stats import Outcomes, value_interval
from bsi.config import make_config
from bsi.method.surgery import compressible_parameters, model_parameters
from bsi.pipeline.perplexity import text_task_perplexity
from bsi.pipeline.runner import Pipeline
from bsi.reports import EvalReport, RoundReport, StepReport
from bsi.results import read_study_rows
from bsi.shipped import general_text_costs, shipped_sweep
from bsi.teaching import doc_markdown, notebook_settings

display(Markdown(doc_markdown(bsi.data.text, title=False, paragraphs=1)))

# %% [markdown]
# This notebook's run is **shorter than the `text` preset's**, so that it
# runs in about five minutes on two CPU cores: a shorter fine-tune, fewer
# pruning iterations and recovery steps, and a quarter of the held-out
# windows. The method's settings are the preset's. The preset's own results,
# at full length, ship in `data/sweeps/text/`; section 4 reads them on the
# same held-out windows as this run, as the reference for its numbers. What
# was cut:

# %%
hf_logging.disable_progress_bar()
settings = notebook_settings()
start = time.perf_counter()
torch.manual_seed(0)
config = settings.text_config()
preset = make_config(settings.text_preset, {"model": settings.model})
work = [("fine-tune steps", lambda c: c.finetune.steps), ("calibration batches", lambda c: c.compress.calibration_batches),
        ("pruning iterations (all rounds)", lambda c: c.compress.iters_per_epoch),
        ("pruning rounds", lambda c: c.compress.rounds), ("recovery steps", lambda c: c.recover.steps),
        ("held-out windows scored", lambda c: c.eval_windows), ("window (tokens)", lambda c: c.window),
        ("target: share of the linear layers kept", lambda c: c.compress.size.ratio)]
display(Markdown(f"| | this notebook | preset `{settings.text_preset}` |\n|---|---|---|\n" + "\n".join(
    f"| {name} | {get(config)} | {get(preset)} |" for name, get in work)))

# %% [markdown]
# ## 1. The text as windows
#
# `Pipeline.load()` reads the text, tokenizes it with the model's tokenizer
# and cuts the training part into windows. A training batch has the keys of a
# question/answer batch, with labels equal to the inputs: bsi's loss then is
# the mean next-token loss over every token of a window after its first.

# %%
pipeline = Pipeline(config)  # no out_dir: everything stays in memory
pipeline.load()
task = pipeline.text
print(f"{task.name}: {task.release}")
print(f"trains on {task.train_part}: {task.train_tokens.numel():,} tokens, {pipeline.train_windows.shape[0]:,} "
      f"windows of {config.window}; perplexity on {task.held_out_part}: {task.held_out_tokens.numel():,} tokens")
batch = next(pipeline.stream(1))
print(f"a batch: {tuple(batch['input_ids'].shape)} windows x tokens; labels equal the inputs: "
      f"{torch.equal(batch['labels'], batch['input_ids'])}")
print("the start of one window:", repr(pipeline.tokenizer.decode(batch["input_ids"][0, :48])))

# %% [markdown]
# ## 2. Perplexity, and the protocol it is measured by
#
# A perplexity means nothing without its protocol: how long the windows are,
# whether they overlap, which tokens are scored and how many. The definition,
# from the library:

# %%
display(Markdown(doc_markdown(bsi.pipeline.perplexity, title=False, paragraphs=2)))

# %% [markdown]
# Here the held-out stream is cut into windows of 128 tokens that do not
# overlap; each window is read on its own, and its first token is context
# only, so a full window scores 127 tokens. bsi prints this protocol beside
# every perplexity (below, after "protocol:").
#
# Perplexity reads as an average branching factor: a perplexity of 20 means the
# model's probability for the right next token is, in the geometric mean over
# the scored tokens, 1/20 (5%). A model that doubles its perplexity has halved that
# probability. A ratio of perplexities is `exp` of a difference of mean
# losses, so "1.5x the perplexity" means "0.41 nats more loss per token",
# whatever the starting point.
#
# ## 3. The three stages on text
#
# First, the embedded model *before* any fine-tune, on the same held-out
# windows: a reference point for everything after. Then stage 1 fine-tunes
# the dense model on the training windows (cached), the engine prunes in
# rounds and the recovery trains the factors, all with the mean next-token
# loss. The evaluation before and after is the perplexity on the held-out
# windows, one outcome per window.

# %%
untuned = text_task_perplexity(pipeline.model, task, max_windows=config.eval_windows)
print(f"the embedded model, no fine-tune: perplexity {untuned.perplexity:.2f} (mean next-token loss "
      f"{untuned.mean_nll:.4f}) on the first {config.eval_windows} held-out windows")
finetune, rounds, evaluations = [], [], {}
for report in pipeline.reference_stage():
    if isinstance(report, StepReport):
        finetune.append(report.loss)
    elif isinstance(report, EvalReport):
        evaluations[report.when] = report
if finetune:
    print(f"stage 1: {len(finetune)} fine-tune steps, training loss {finetune[0]:.3f} -> {finetune[-1]:.3f}")
for report in pipeline.compress():
    if isinstance(report, RoundReport):
        rounds.append(report)
        print(f"round {report.round}/{report.total_rounds}: compressible layers at {report.compressible_ratio:.1%}, "
              f"mean training loss {report.mean_loss:.3f}")
recover = [r.loss for r in pipeline.recover_stage() if isinstance(r, StepReport)]
evaluations.update({r.when: r for r in pipeline.evaluate_stage("recovered") if isinstance(r, EvalReport)})
before, after = evaluations["finetuned"], evaluations["recovered"]
protocol = pipeline.perplexities["recovered"]
print(f"perplexity before compression {before.perplexity:.2f} (mean next-token loss {before.loss:.4f}) -> after "
      f"{after.perplexity:.2f} ({after.loss:.4f}), {before.params_total:,} -> {after.params_total:,} parameters")
print(f"protocol: {protocol['description']}")

# %% [markdown]
# Each held-out window is an outcome, like a test problem. What the library
# keeps per window (`ProblemOutcome`) is its next-token loss *summed* over its
# scored tokens (`loss_sum`) and the number of those tokens (`tokens`). The
# perplexity pools the windows weighted by their tokens,
# `exp(sum loss_sum / sum tokens)`, and a bootstrap that resamples the
# windows' `(loss_sum, tokens)` pairs gives its 95% interval: how far the
# figure could move with another stretch of held-out text.

# %%
own = {when: Outcomes.from_columns(pipeline.evaluations[when].columns()) for when in ("finetuned", "recovered")}
bands = {when: value_interval([outcomes], "loss") for when, outcomes in own.items()}
pooled = {when: outcomes.loss() for when, outcomes in own.items()}  # sum(loss_sum) / sum(tokens), as the perplexity
for when, band in bands.items():
    print(f"{when:>9}: perplexity {math.exp(band.estimate):.2f} [{math.exp(band.low):.2f}, {math.exp(band.high):.2f}], "
          f"mean next-token loss {band.estimate:.4f} [{band.low:.4f}, {band.high:.4f}] ({band.samples} windows)")
ratio = after.perplexity / before.perplexity
print(f"ratio after / before: {ratio:.2f}x = exp({after.loss - before.loss:.3f} nats); the geometric-mean "
      f"probability of the right next token went from {1 / before.perplexity:.1%} to {1 / after.perplexity:.1%}")

# %% [markdown]
# ## 4. Reference points: the preset's shipped sweep, on the same windows
#
# A perplexity is a number to compare, never to read alone. `bsi sweep
# --preset text` ships in `data/sweeps/text/`: the `text` preset at full length
# (its 60-step fine-tune, 48 pruning iterations, 32 recovery steps), bsi,
# Basel and SVD-LLM at 0.8, 0.6 and 0.4 of the linear layers, each model
# before and after recovery, one seed. Its outcome files keep every model's
# loss on each of its 256 held-out windows, so the perplexity of each shipped
# model can be recomputed on exactly the windows this notebook scored, the
# first ones of the same stream.

# %%
shipped = shipped_sweep("text")
shipped_rows = read_study_rows(shipped / "results.jsonl")
shipped_stats = json.loads((shipped / "stats.json").read_text())
shipped_window = shipped_rows[0].perplexity_protocol["window"]
n = before.examples  # this notebook's windows: the first n of the stream
now, dense = compressible_parameters(pipeline.model)


def on_these_windows(row):
    """A shipped model's perplexity on the first n held-out windows, with its 95% interval, from its outcome file."""
    columns = json.loads((shipped / row.outcomes).read_text())
    return value_interval([Outcomes.from_columns({k: v[:n] for k, v in columns.items()})], "loss")


def cell(band, reference=None):
    """``perplexity [low, high]`` of a loss interval, and its ratio to ``reference`` (a loss) when given."""
    text = f"{math.exp(band.estimate):.1f} [{math.exp(band.low):.1f}, {math.exp(band.high):.1f}]"
    return text if reference is None else f"{text} | {math.exp(band.estimate - reference):.2f}x"


shown = [r for r in shipped_rows if r.is_reference or (r.target >= 0.6 and r.method in ("bsi", "svd-llm", "basel")
                                                       and (r.recovered or r.method == "bsi"))]
shipped_dense = on_these_windows(shipped_rows[0]).estimate
table = [f"| model | linear layers kept | recovery steps | perplexity, first {n} windows [95%] | / its dense | "
         "all 256 windows |", "|---|---|---|---|---|---|"]
for r in sorted(shown, key=lambda r: (-r.target, r.method, r.recovered)):
    steps = "-" if r.is_reference else r.recover_steps if r.recovered else 0
    table.append(f"| shipped `{r.method}` | {r.target:.0%} | {steps} | {cell(on_these_windows(r), shipped_dense)} | "
                 f"{r.metrics.perplexity:.1f} |")
table.append(f"| **this notebook**, dense | 100% | - | {cell(bands['finetuned'], bands['finetuned'].estimate)} | |")
table.append(f"| **this notebook**, `bsi` | {now / dense:.0%} | {len(recover)} | "
             f"{cell(bands['recovered'], bands['finetuned'].estimate)} | |")
table.append(f"| the embedded model, no fine-tune | 100% | - | {untuned.perplexity:.1f} | | |")
same = config.window == shipped_window and config.data == shipped_rows[0].perplexity_protocol["data"]
display(Markdown("\n".join(table) + "\n\n" + (
    f"Every row on the same first {n} windows of {config.window} tokens, except the last column (the shipped "
    "sweep's own 256 windows). " if same else
    f"**Not comparable here**: this run's windows are {config.window} tokens, the shipped sweep's {shipped_window} "
    "(and it is another model); the rows show the layout only. ")
    + "The intervals resample the windows; with one seed they do not cover the spread between training runs."))

# %% [markdown]
# The windows the compressed model finds harder lie above the diagonal. Each
# window's *mean* loss, `loss_sum / tokens`, is plotted so that windows of
# different lengths compare (here all are full).

# %%
per_window = {when: [o.loss for o in pipeline.evaluations[when].outcomes]  # each window's mean: loss_sum / tokens
              for when in ("finetuned", "recovered")}
worse = sum(b < a for b, a in zip(per_window["finetuned"], per_window["recovered"]))
low_end = min(min(v) for v in per_window.values()) - 0.1
top = max(max(v) for v in per_window.values()) + 0.1
fig = go.Figure([go.Scatter(x=per_window["finetuned"], y=per_window["recovered"], mode="markers", name="a window"),
                 go.Scatter(x=[low_end, top], y=[low_end, top], mode="lines", line={"dash": "dot"},
                            name="no change")])
fig.update_layout(height=460, width=560, template="plotly_white", margin={"t": 90},
                  title={"text": f"Each held-out window's mean loss (nats/token)<br><sup>{worse} of {n} windows "
                                 "above the diagonal: worse after compression</sup>"},
                  xaxis={"title": "fine-tuned dense model", "range": [low_end, top]},
                  yaxis={"title": "compressed and recovered", "range": [low_end, top], "scaleanchor": "x"},
                  legend={"x": 0.98, "xanchor": "right", "y": 0.02, "yanchor": "bottom"})
fig.show()

# %% [markdown]
# *Figure: one point per held-out window, its mean next-token loss before
# (x) and after (y) compression and recovery; on the dotted line nothing
# changed. How far the cloud sits above the line is the whole-text loss
# increase; how tight it is shows whether compression hurt every kind of text
# alike or some windows far more.*

# %%
outcome = {"perplexity": [before.perplexity, after.perplexity], "loss": [before.loss, after.loss],
           "windows": before.examples, "tokens_scored": protocol["tokens_scored"], "window": config.window,
           "params": [before.params_total, model_parameters(pipeline.model)], "compressible_share": now / dense,
           "target": config.compress.size.ratio, "finetune": [finetune[0], finetune[-1]] if finetune else [],
           "rounds": len(rounds), "recover_steps": len(recover), "untuned_perplexity": untuned.perplexity,
           "pooled_loss": [pooled["finetuned"], pooled["recovered"]], "windows_worse": worse}
print(f"Result: perplexity {before.perplexity:.2f} -> {after.perplexity:.2f} ({ratio:.2f}x) on {n} held-out "
      f"windows; {outcome['params'][0]:,} -> {outcome['params'][1]:,} parameters (compressible layers at "
      f"{now / dense:.0%}); ran in {time.perf_counter() - start:.0f} s")

# %% [markdown]
# ## What the data say
#
# Computed from this run and the shipped files, so they stay true after a new
# render:
#
# *The code that writes this reading from the run's numbers is folded in the
# notebook (open it there); the rendered pages show only what it wrote.*

# %% tags=["hide-input"]
def shipped_row(method, target, recovered=True):
    """The shipped sweep's row of ``method`` at ``target``, after recovery or before."""
    return next(r for r in shipped_rows if r.method == method and r.target == target and r.recovered == recovered)


def shipped_ratio(method, target, recovered=True):
    """A shipped model's perplexity over the shipped dense model's, on the sweep's own 256 windows."""
    return shipped_row(method, target, recovered).metrics.perplexity / shipped_rows[0].metrics.perplexity


def ratio_here(method, target, recovered=True):
    """The same ratio on this notebook's windows."""
    return math.exp(on_these_windows(shipped_row(method, target, recovered)).estimate - shipped_dense)


low, high = ratio_here("bsi", 0.8), ratio_here("bsi", 0.6)
where = "above" if ratio > high else "between" if ratio >= low else "below"
at_60 = math.exp(on_these_windows(shipped_row("bsi", 0.6)).estimate)
separated = all(entry["vs_anchor"]["loss"]["excludes_zero"]
                for method in ("svd-llm", "basel") for entry in shipped_stats["protocols"]["tuned"]["methods"][method].values())
qa = general_text_costs().get("tour")
lines = [
    f"* **{'Compression costs text quality' if ratio > 1 else 'No cost measured here (a random model)'}.** "
    f"Keeping {now / dense:.0%} of the linear layers "
    f"({before.params_total / after.params_total:.2f}x fewer parameters in all) took the perplexity from "
    f"{before.perplexity:.1f} to {after.perplexity:.1f}: {ratio:.2f}x, or {after.loss - before.loss:+.2f} nats of loss "
    f"per token; {worse} of the {n} windows got worse. On the same windows the preset at full length costs "
    f"{low:.2f}x at 80% and {high:.2f}x at 60%; this run's {ratio:.2f}x at {now / dense:.0%} lies {where} those. In "
    f"absolute terms it ends {'worse' if after.perplexity > at_60 else 'better'} than the preset's `bsi` at 60% "
    f"({after.perplexity:.1f} against {at_60:.1f}){' although it keeps more of the layers' if now / dense > 0.61 else ''}: "
    f"its {len(finetune)}-step "
    f"fine-tune leaves a {'weaker' if before.perplexity > math.exp(shipped_dense) else 'stronger'} dense model "
    f"({before.perplexity:.1f} against the preset's {math.exp(shipped_dense):.1f}), and its pruning and recovery are "
    "shorter too (the table at the top); one run cannot say which of these costs what.",
    f"* **Recovery matters.** In the shipped sweep, on the same windows, `bsi` at 60% is "
    f"{ratio_here('bsi', 0.6, False):.2f}x the dense perplexity straight after pruning and {high:.2f}x after its 32 "
    f"recovery steps; this run recovers for {len(recover)} steps.",
    f"* **`bsi` against the other methods** (the shipped sweep on its 256 windows, not this run): at 60% with "
    f"recovery, SVD-LLM is {shipped_ratio('svd-llm', 0.6):.2f}x the dense perplexity and Basel "
    f"{shipped_ratio('basel', 0.6):.2f}x, against `bsi`'s {shipped_ratio('bsi', 0.6):.2f}x; the paired intervals on "
    "the loss difference "
    f"{'exclude 0 at every size, for both' if separated else 'do not all exclude 0'} "
    "([docs/results/text.md](../docs/results/text.md)). That is one seed and 256 windows: the intervals cover which "
    "text was scored, not the spread between training runs.",
    f"* **The fine-tune {'moves the perplexity more than compression does' if untuned.perplexity / before.perplexity > ratio else 'moves the perplexity too'}.** "
    f"Before any fine-tune the embedded model scores {untuned.perplexity:.1f} on these windows, {untuned.perplexity / before.perplexity:.1f}x its fine-tuned "
    f"perplexity after {len(finetune)} steps (the preset's 60 steps reach {math.exp(shipped_dense):.1f}). The text is "
    "in a form the model has likely not seen written this way (`<unk>` for rare words, spaced punctuation), and the "
    "fine-tune adapts it. None of these figures compares with published WikiText-2 "
    "perplexities: another tokenizer, windows of 128 tokens, `<unk>` in the text.",
]
if qa:
    lines.append(
        f"* **Compressing for one task does not keep general text.** The `tour` run, compressed for the math task at "
        f"{qa['compression_ratio']:.2f}x, keeps {qa['after']['accuracy']:.0%} on its own task (from "
        f"{qa['before']['accuracy']:.0%}, {qa['after']['examples']} problems) but takes lm-eval's WikiText-2 word "
        f"perplexity ({qa['articles']} articles, another protocol) from {qa['dense']['word_perplexity']:.1f} to "
        f"{qa['compressed']['word_perplexity']:,.0f} (`data/general-text.json`). A compression keeps what its "
        "calibration and recovery exercise: to keep text, compress on text, as here.")
gained = untuned.mean_nll - before.loss  # nats per token the fine-tune bought
if gained > 0:
    lost_share = (after.loss - before.loss) / gained
    lines.append(
        f"* **Compression gave back {'most' if lost_share > 0.5 else 'part'} of what the fine-tune bought.** The "
        f"fine-tune took these windows from {untuned.perplexity:.1f} (the model as loaded) to {before.perplexity:.1f}; "
        f"compressed and recovered, the model scores {after.perplexity:.1f}, "
        + ("back near the model before any fine-tune" if after.perplexity >= 0.85 * untuned.perplexity else
           "between the two")
        + f": {lost_share:.0%} of the fine-tune's gain in loss ({gained:.3f} nats per token) is lost again. One run.")
lines.append(f"* **n and noise:** {n} windows, {protocol['tokens_scored']:,} tokens scored, one seed. The 95% interval "
             f"after compression, {math.exp(bands['recovered'].low):.1f} to {math.exp(bands['recovered'].high):.1f}, "
             "comes from the windows alone; a second seed could move the figure further.")
display(Markdown("\n".join(lines)))

# %% [markdown]
# ## Recap
#
# * A text task trains on every token of a text and is measured by
#   perplexity on a held-out part; the engine, the loss and the stages are the
#   ones of the question/answer task.
# * A perplexity is meaningless without its protocol (the window, the stride,
#   which tokens are scored and how many) and without a reference point: the
#   dense model on the same windows, the model before its fine-tune, and
#   other methods at the same size.
# * A ratio of perplexities is `exp` of a difference of mean losses; each
#   held-out window is one outcome, kept as its summed loss and token count,
#   so intervals and comparisons on any subset of windows can be recomputed.

# %% [markdown]
# ## What to try
#
# Each exercise runs after the notebook, in the same kernel (it uses the
# variables above). Predict the outcome first, then open the solution.
#
# **1. Sliding windows.** Measure the compressed model's perplexity on the
# same stretch of held-out text with windows that overlap by half
# (`stride = window / 2`): how many tokens are scored, and does the
# perplexity go up or down?
#
# <details><summary>Solution</summary>
#
# ```python
# from bsi.pipeline.perplexity import measure_perplexity, text_task_perplexity
#
# n = before.examples  # the windows the evaluation scored
# plain = text_task_perplexity(pipeline.model, task, max_windows=n)
# sliding = text_task_perplexity(pipeline.model, task, stride=config.window // 2, max_windows=2 * n - 1)
# for label, r in (("non-overlapping", plain), ("stride window/2", sliding)):
#     print(f"{label:>15}: {r.summary_line()}")
# ```
#
# What you should see: the non-overlapping figure is the notebook's own
# ("after"). The sliding windows cover the same stretch of text and score
# about as many tokens, but every token after the first window now has at
# least half a window of context, so a trained model's perplexity usually
# comes out lower. On the tiny random model the context helps nothing and
# the two are close.
#
# </details>
#
# **2. Shorter windows.** Measure with windows a quarter as long (the same
# tokens, four times as many windows). Predict the direction first.
#
# <details><summary>Solution</summary>
#
# ```python
# short = text_task_perplexity(pipeline.model, task, window=config.window // 4, max_windows=4 * n)
# print(f"window {config.window}: perplexity {plain.perplexity:.2f}; window {config.window // 4}: "
#       f"{short.perplexity:.2f} ({short.tokens_scored:,} tokens scored)")
# ```
#
# What you should see: shorter windows give each token less context, so a
# trained model's perplexity rises; a perplexity quoted without its window
# cannot be compared with another. (On the tiny random model the change is
# small either way.)
#
# </details>
#
# **3. The mean of the window means is not the perplexity's loss.** Score a
# stream of three full windows and a short fourth one, then compare the
# token-weighted loss with the plain mean of the per-window means.
#
# <details><summary>Solution</summary>
#
# ```python
# w = config.window
# r = measure_perplexity(pipeline.model, task.held_out_tokens[: 3 * w + 6], window=w)
# pooled_loss = sum(r.window_nll_sums) / sum(r.window_token_counts)
# means = [s / t for s, t in zip(r.window_nll_sums, r.window_token_counts)]
# print(f"tokens per window {r.window_token_counts}")
# print(f"token-weighted {pooled_loss:.4f} (= mean_nll {r.mean_nll:.4f}, exp = perplexity {r.perplexity:.3f}); "
#       f"mean of the window means {sum(means) / len(means):.4f}")
# ```
#
# What you should see: the windows score `w - 1`, `w - 1`, `w - 1` and 5
# tokens. The token-weighted loss equals `mean_nll` exactly, and its `exp` is
# the perplexity; the plain mean of means differs, because it gives the
# 5-token window as much weight as a full one. That is why outcomes keep the
# summed loss and the token count, not the mean.
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
# * [docs/method.md](../docs/method.md), section 16 (text tasks, windows,
#   perplexity); [docs/results/text.md](../docs/results/text.md), the `text`
#   preset's sweep; [docs/benchmarks.md](../docs/benchmarks.md), the measured
#   perplexities of the embedded model.
