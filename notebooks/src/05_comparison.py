# Source of notebooks/05_comparison.ipynb (build: python notebooks/build.py).

# %% [markdown]
# # 05 · Comparison: BSI against the other ways to choose bases
#
# Every method here goes through the *same* three stages (task fine-tune,
# compress to a target size, recovery fine-tune), so differences come from
# which bases each keeps and nothing else:

# %%
import time

import pandas as pd
import torch
from IPython.display import Markdown, display
from transformers.utils import logging as hf_logging

import bsi.pipeline.methods
from bsi import Pipeline, make_config
from bsi.analysis.compare import comparison_markdown
from bsi.pipeline.evaluate import generate_answers
from bsi.pipeline.methods import MethodPipeline
from bsi.method.surgery import compressible_parameters, model_parameters
from bsi.reports import DoneReport, EvalReport, RoundReport, StageReport
from bsi.pipeline.sweep import results_figure, results_table
from bsi.teaching import notebook_settings, summary_row

display(Markdown(bsi.pipeline.methods.__doc__.split("Add a method")[0]))

# %% [markdown]
# ## 1. The reference: the fine-tuned dense model
#
# A small grid, sized for a CPU: a few methods at a few target sizes (the share
# of the compressible layers' parameters left), with a short schedule. The same
# settings as notebook 03, so the cached task fine-tune is shared. For the full
# grid of all six methods and five sizes, with generation speeds, run
# `bsi sweep --preset sweep-cpu --out runs/sweep` (it resumes if interrupted).

# %%
hf_logging.disable_progress_bar()  # no loading bars between the results
settings = notebook_settings()
start = time.perf_counter()
torch.manual_seed(0)
overrides = settings.pipeline_overrides()
overrides["compress"] = {**overrides["compress"], **settings.sweep_compress}
config = make_config(None, overrides)
print(f"methods {settings.sweep_methods} at targets {settings.sweep_targets}; "
      f"{config.compress.rounds} rounds x {config.compress.round_length} iterations for the engine methods")

reference = Pipeline(config)
reference.load()
for report in reference.finetune_stage():
    if isinstance(report, StageReport) and report.event == "end":
        print(f"fine-tune: {'cached ' if report.cached else ''}{report.detail}")
for report in reference.evaluate_stage("finetuned"):
    if isinstance(report, EvalReport):
        finetuned = reference.metrics["finetuned"]
params = model_parameters(reference.model)
now, dense = compressible_parameters(reference.model)
rows = [summary_row("dense", 1.0, {
    "params_before": params, "params_after": params, "compressible_ratio": now / dense,
    "metrics_after": finetuned.to_dict(), "seconds": 0.0})]
questions = [e.question for e in reference.task.test[:3]]
generations = {"fine-tuned dense": (params, generate_answers(reference.model, reference.tokenizer, questions,
                                                             max_new_tokens=settings.max_new_tokens))}
print(f"dense: {params:,} parameters, accuracy {finetuned.accuracy:.0%}, loss {finetuned.loss:.3f}")
del reference

# %% [markdown]
# ## 2. The sweep
#
# Each cell is one `bsi.pipeline.methods.MethodPipeline` run (what `bsi sweep` runs per
# cell), reusing the dense model's metrics. After the smallest target, each
# method's model also answers a few test questions for section 4.

# %%
smallest = min(settings.sweep_targets)
for target in settings.sweep_targets:
    for method in settings.sweep_methods:
        cell = make_config(None, {**overrides, "compress": {**overrides["compress"], "target_ratio": target,
                                                         "keep_ratio": None}})
        pipeline = MethodPipeline(cell, method, finetuned_metrics=finetuned)
        rounds = 0
        for report in pipeline.run():
            rounds += isinstance(report, RoundReport)
            if isinstance(report, DoneReport):
                rows.append(summary_row(method, target, report.summary))
        row = rows[-1]
        print(f"{method:>8} @ {target:g}: {row['params_total']:,} params ({row['compressible_ratio']:.0%} of the "
              f"compressible layers), accuracy {row['accuracy']:.0%}, loss {row['loss']:.3f}, {row['seconds']:.0f} s")
        if target == smallest:
            generations[f"{method} @ {target:g}"] = (
                row["params_total"],
                generate_answers(pipeline.model, pipeline.tokenizer, questions, max_new_tokens=settings.max_new_tokens))
        del pipeline

# %% [markdown]
# ## 3. Accuracy against size
#
# Each line starts at the fine-tuned dense model and moves right to left as the
# model shrinks. (`bsi.pipeline.sweep.results_figure` draws the same figure `bsi sweep`
# writes to `figure.html`; the dashboard's Compare tab reads the same rows.)
# With a short schedule and a few dozen test questions, differences of a few
# points are noise; the method's claims are about strong compression with full
# schedules.

# %%
results_figure(rows).show()
display(Markdown(results_table(rows, list(settings.sweep_methods))))

# %% [markdown]
# ## 4. Side by side
#
# The same questions, answered greedily by the dense model and by every method at
# the smallest target. Numbers say *how much* each lost; the answers show *how*.

# %%
result = {"prompts": questions, "models": [{"name": name, "params": p, "outputs": outputs}
                                           for name, (p, outputs) in generations.items()]}
display(Markdown(comparison_markdown(result)))

# %%
table = pd.DataFrame(rows)
at_small = table[table["target"] == smallest].sort_values(["accuracy", "loss"], ascending=[False, True])
best = at_small.iloc[0]
print(f"Result: {len(rows) - 1} cells ({len(settings.sweep_methods)} methods x {len(settings.sweep_targets)} sizes); "
      f"at target {smallest:g} the best is {best['method']} with accuracy {best['accuracy']:.0%} "
      f"(dense {finetuned.accuracy:.0%}), losses "
      + ", ".join(f"{m} {l:.3f}" for m, l in zip(at_small["method"], at_small["loss"]))
      + f"; ran in {time.perf_counter() - start:.0f} s")
