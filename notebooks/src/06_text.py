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
from bsi.teaching import notebook_settings

display(Markdown(bsi.data.text.__doc__.split(">>>")[0]))

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
display(Markdown(bsi.pipeline.perplexity.__doc__.split(">>>")[0]))

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
# Each held-out window is an outcome, like a test problem: its summed
# next-token loss over its scored tokens. The windows the compressed model
# finds harder lie above the diagonal; the paired bootstrap of `bsi sweep`
# resamples exactly these outcomes.

# %%
per_window = {when: [o.loss for o in pipeline.evaluations[when].outcomes] for when in ("finetuned", "recovered")}
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
           "target": config.compress.target_ratio, "finetune": [finetune[0], finetune[-1]] if finetune else [],
           "rounds": len(rounds), "recover_steps": len(recover)}
print(f"Result: perplexity {before.perplexity:.2f} -> {after.perplexity:.2f} on {protocol['source']} "
      f"({protocol['description']}); {outcome['params'][0]:,} -> {outcome['params'][1]:,} parameters "
      f"(compressible layers at {now / dense:.0%}); ran in {time.perf_counter() - start:.0f} s")
