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
import math
import time

import plotly.graph_objects as go
import torch
from IPython.display import Markdown, display
from transformers.utils import logging as hf_logging

import bsi.data.text
import bsi.pipeline.perplexity
from bsi.method.surgery import compressible_parameters, model_parameters
from bsi.pipeline.runner import Pipeline
from bsi.reports import EvalReport, RoundReport, StepReport
from bsi.teaching import doc_markdown, notebook_settings

display(Markdown(doc_markdown(bsi.data.text, title=False)))

# %% [markdown]
# ## 1. The text as windows
#
# `Pipeline.load()` reads the text, tokenizes it with the model's tokenizer
# and cuts the training part into windows. A training batch has the keys of a
# question/answer batch, with labels equal to the inputs: bsi's loss then is
# the mean next-token loss over every token of a window after its first.

# %%
hf_logging.disable_progress_bar()
settings = notebook_settings()
start = time.perf_counter()
torch.manual_seed(0)
config = settings.text_config()
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
# whether they overlap, which tokens are scored and how many. bsi states it
# beside every figure:

# %%
display(Markdown(doc_markdown(bsi.pipeline.perplexity, title=False)))

# %% [markdown]
# ## 3. The three stages on text
#
# Stage 1 fine-tunes the dense model on the training windows (cached), then
# the engine prunes in rounds and the recovery trains the factors, all with
# the mean next-token loss. The evaluation before and after is the perplexity
# on the held-out windows, one outcome per window.

# %%
finetune, rounds, evaluations = [], [], {}
for report in pipeline.reference_stage():
    if isinstance(report, StepReport):
        finetune.append(report.loss)
    elif isinstance(report, EvalReport):
        evaluations[report.when] = report
for report in pipeline.compress():
    if isinstance(report, RoundReport):
        rounds.append(report)
        print(f"round {report.round}/{report.total_rounds}: compressible layers at {report.compressible_ratio:.1%}, "
              f"mean training loss {report.mean_loss:.3f}")
recover = [r.loss for r in pipeline.recover_stage() if isinstance(r, StepReport)]
evaluations.update({r.when: r for r in pipeline.evaluate_stage("recovered") if isinstance(r, EvalReport)})
before, after = evaluations["finetuned"], evaluations["recovered"]
protocol = pipeline.perplexities["recovered"]
if finetune:
    print(f"stage 1: {len(finetune)} steps, loss {finetune[0]:.3f} -> {finetune[-1]:.3f}")
print(f"perplexity before {before.perplexity:.2f} (mean next-token loss {before.loss:.4f}) -> after "
      f"{after.perplexity:.2f} ({after.loss:.4f}), {before.params_total:,} -> {after.params_total:,} parameters")
print(f"protocol: {protocol['source']}; {protocol['description']}")

# %% [markdown]
# Each held-out window is an outcome, like a test problem. What the library
# keeps per window (`ProblemOutcome`) is its next-token loss *summed* over its
# scored tokens (`loss_sum`) and the number of those tokens (`tokens`). The
# plot shows each window's *mean*, `loss_sum / tokens` (`ProblemOutcome.loss`),
# so that windows of different lengths compare. The perplexity pools the
# windows weighted by their tokens, `exp(sum loss_sum / sum tokens)`, and the
# paired bootstrap of `bsi sweep` resamples the windows' `(loss_sum, tokens)`
# pairs the same way. The windows the compressed model finds harder lie above
# the diagonal.

# %%
per_window = {when: [o.loss for o in pipeline.evaluations[when].outcomes]  # each window's mean: loss_sum / tokens
              for when in ("finetuned", "recovered")}
pooled = {when: sum(o.loss_sum for o in pipeline.evaluations[when].outcomes)  # token-weighted, as the perplexity
                / sum(o.tokens for o in pipeline.evaluations[when].outcomes) for when in per_window}
print("pooled over the windows, sum(loss_sum) / sum(tokens): "
      + ", ".join(f"{when} {loss:.4f} (perplexity {math.exp(loss):.2f})" for when, loss in pooled.items()))
top = max(max(v) for v in per_window.values())
fig = go.Figure([go.Scatter(x=per_window["finetuned"], y=per_window["recovered"], mode="markers", name="window"),
                 go.Scatter(x=[0, top], y=[0, top], mode="lines", line={"dash": "dot"}, name="no change")])
fig.update_layout(height=380, title="Mean next-token loss of each held-out window",
                  xaxis_title="before compression", yaxis_title="after compression and recovery")
fig.show()

# %%
now, dense = compressible_parameters(pipeline.model)
outcome = {"perplexity": [before.perplexity, after.perplexity], "loss": [before.loss, after.loss],
           "windows": before.examples, "tokens_scored": protocol["tokens_scored"], "window": config.window,
           "params": [before.params_total, model_parameters(pipeline.model)], "compressible_share": now / dense,
           "target": config.compress.size.ratio, "finetune": [finetune[0], finetune[-1]] if finetune else [],
           "rounds": len(rounds), "recover_steps": len(recover),
           "pooled_loss": [pooled["finetuned"], pooled["recovered"]]}
print(f"Result: perplexity {before.perplexity:.2f} -> {after.perplexity:.2f} on {protocol['source']} "
      f"({protocol['description']}); {outcome['params'][0]:,} -> {outcome['params'][1]:,} parameters "
      f"(compressible layers at {now / dense:.0%}); ran in {time.perf_counter() - start:.0f} s")

# %% [markdown]
# ## Recap
#
# * A text task trains on every token of a text and is measured by
#   perplexity on a held-out part; the engine, the loss and the stages are the
#   ones of the question/answer task.
# * A perplexity is meaningless without its protocol: the window, the stride,
#   which tokens are scored (each window's first token is context only) and
#   how many; bsi prints it beside every figure.
# * Each held-out window is one outcome, kept as its summed loss and its token
#   count; the perplexity is `exp` of the token-weighted mean loss, and the
#   plot shows each window's own mean.
#
# In numbers, this run:

# %%
display(Markdown(
    f"* perplexity {before.perplexity:.2f} -> {after.perplexity:.2f} (mean next-token loss {before.loss:.4f} -> "
    f"{after.loss:.4f}) on {before.examples} held-out windows, {protocol['tokens_scored']:,} tokens scored\n"
    f"* parameters {outcome['params'][0]:,} -> {outcome['params'][1]:,}; compressible layers at {now / dense:.0%}"))

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
#   perplexity); [docs/benchmarks.md](../docs/benchmarks.md), the measured
#   perplexities of the embedded model.
