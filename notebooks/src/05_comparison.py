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
from bsi.analysis.compare import comparison_markdown
from bsi.config import PRESETS, make_config
from bsi.pipeline.evaluate import generate_answers
from bsi.pipeline.runner import Pipeline
from bsi.pipeline.sweep import results_figure, results_table
from bsi.reports import DoneReport, StageReport
from bsi.teaching import notebook_settings, summary_row

display(Markdown(bsi.pipeline.methods.__doc__.split("Add a method")[0]))

# %% [markdown]
# ## 1. The reference: the fine-tuned dense model
#
# A small grid, sized for a CPU: a few methods at a few target sizes (the share
# of the compressible layers' parameters left), from the library's `sweep-cpu`
# preset with fewer test questions. Its stage 1 is the `default` preset's, as in
# notebook 03, so the cached task fine-tune is shared. For the full grid (all
# seven methods at 0.6, 0.4 and 0.25, the one-shot truncations with a longer
# recovery of their own, generation speeds; about an hour on 2 cores), run
# `bsi sweep --preset sweep-cpu --out runs/sweep` (it resumes if interrupted).
# Here every method gets the preset's short shared recovery, so a one-shot
# truncation of the plain SVD (`svd`), which starts its recovery far from the
# task, answers almost nothing; the engine methods prune gradually and start
# close.
#
# `Pipeline.reference_stage()` loads the model, fine-tunes it (or reads the cache)
# and evaluates it once; every method's pipeline below is given these metrics
# instead of measuring them again, as `bsi sweep` does.

# %%
hf_logging.disable_progress_bar()  # no loading bars between the results
settings = notebook_settings()
start = time.perf_counter()
torch.manual_seed(0)
config = settings.sweep_config()
print(f"preset '{settings.sweep_preset}' = {PRESETS[settings.sweep_preset]}\nwith less work: {settings.sweep_work}")
print(f"methods {settings.sweep_methods} at targets {settings.sweep_targets}; "
      f"{config.compress.rounds} rounds x {config.compress.round_length} iterations for the engine methods")

reference = Pipeline(config)
for report in reference.reference_stage():
    if isinstance(report, StageReport) and report.stage == "finetune" and report.event == "end":
        print(f"fine-tune: {'cached ' if report.cached else ''}{report.detail}")
finetuned = reference.reference  # Metrics of the fine-tuned dense model
summary = {"params_before": reference.params_before, "params_after": reference.params_before,
           "compressible_ratio": 1.0, "metrics_after": finetuned.to_dict()}
rows = [summary_row("dense", 1.0, summary)]
questions = [e.question for e in reference.task.test[:3]]
generations = {"fine-tuned dense": (reference.params_before,
                                    generate_answers(reference.model, reference.tokenizer, questions,
                                                     max_new_tokens=config.max_new_tokens))}
print(f"dense: {reference.params_before:,} parameters, accuracy {finetuned.accuracy:.0%}, loss {finetuned.loss:.3f}")
del reference

# %% [markdown]
# ## 2. The sweep
#
# Each cell is one `Pipeline(cell_config, method=name, reference=finetuned)` run,
# what `bsi sweep` runs per cell: stage 1 comes from the cache, the dense model is
# not evaluated again. After the smallest target, each method's model also
# answers a few test questions for section 4.

# %%
smallest = min(settings.sweep_targets)
for target in settings.sweep_targets:
    cell = make_config(base=config, overrides={"compress": {"target_ratio": target}})  # size mode target
    for method in settings.sweep_methods:
        pipeline = Pipeline(cell, method=method, reference=finetuned)
        for report in pipeline.run():
            if isinstance(report, DoneReport):
                rows.append(summary_row(method, target, report.summary))
        row = rows[-1]
        print(f"{method:>8} @ {target:g}: {row['params_total']:,} params ({row['compressible_ratio']:.0%} of the "
              f"compressible layers), accuracy {row['accuracy']:.0%}, loss {row['loss']:.3f}, {row['seconds']:.0f} s")
        if target == smallest:
            generations[f"{method} @ {target:g}"] = (
                row["params_total"],
                generate_answers(pipeline.model, pipeline.tokenizer, questions, max_new_tokens=config.max_new_tokens))
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
outcome = {"rows": table[["method", "target", "compressible_ratio", "accuracy", "loss"]].to_dict("records")}
print(f"Result: {len(rows) - 1} cells ({len(settings.sweep_methods)} methods x {len(settings.sweep_targets)} sizes); "
      f"at target {smallest:g} the best is {best['method']} with accuracy {best['accuracy']:.0%} "
      f"(dense {finetuned.accuracy:.0%}), losses "
      + ", ".join(f"{m} {l:.3f}" for m, l in zip(at_small["method"], at_small["loss"]))
      + f"; ran in {time.perf_counter() - start:.0f} s")
