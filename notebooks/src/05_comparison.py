# Source of notebooks/05_comparison.ipynb (build: python notebooks/build.py).

# %% [markdown]
# # 05 · Comparison: BSI against the other ways to choose bases
#
# Every method here goes through the *same* three stages (task fine-tune,
# compress to a target size, recovery fine-tune of the same length), so
# differences come from which bases each keeps and nothing else:

# %%
import json
import tempfile
import time
from pathlib import Path

import torch
from IPython.display import Markdown, display
from transformers.utils import logging as hf_logging

import bsi.analysis.stats
import bsi.pipeline.methods
from bsi.analysis.compare import comparison_markdown
from bsi.analysis.figures import study_figure
from bsi.cli.sweep import describe
from bsi.config import PRESETS
from bsi.data import load_task
from bsi.pipeline.sweep import CellReport, LearningRateReport, Sweep
from bsi.teaching import doc_markdown, notebook_settings

display(Markdown(doc_markdown(bsi.pipeline.methods, title=False).split("Add a method")[0]))

# %% [markdown]
# ## 1. A small study
#
# `bsi sweep` is the study: a grid of methods × sizes × seeds × protocols,
# where each method runs *once* per seed through all its sizes (the engine
# prunes along one path and every size is the state at the end of the round
# that reaches it; a truncation method truncates one set of bases at each
# size), and every size is then recovered and evaluated on its own. Here the
# grid is sized for a CPU: a few methods, two sizes, one seed, the `tuned`
# protocol, the library's `sweep-cpu` preset with fewer test questions. The
# full study (all seven methods, seven sizes down to 2% of the linear layers,
# three seeds, both protocols, the learning rate chosen on validation data) is
# `bsi sweep --preset study --out runs/study`; it resumes if interrupted.

# %%
hf_logging.disable_progress_bar()  # no loading bars between the results
settings = notebook_settings()
start = time.perf_counter()
torch.manual_seed(0)
config, grid = settings.sweep_config(), settings.study()
print(f"preset '{settings.sweep_preset}' = {PRESETS[settings.sweep_preset]}\nwith less work: {settings.sweep_work}")
print(f"methods {grid.methods} at targets {grid.targets}, seed {grid.seeds[0]}; engine: "
      f"{config.compress.rounds} rounds x {config.compress.round_length} iterations through both sizes")

folder = Path(tempfile.mkdtemp(prefix="bsi-notebook-05-"))
sweep = Sweep(config, grid, folder)
for report in sweep.run():
    if isinstance(report, (CellReport, LearningRateReport)):
        print(describe(report))

# %% [markdown]
# ## 2. Accuracy against size, with intervals
#
# Each line starts at the fine-tuned dense model and moves right to left as the
# model shrinks. The band around a line is its 95% interval from the test
# problems: how far the accuracy could move with another draw of problems. How
# it is computed, from the library's docstring:

# %%
display(Markdown(doc_markdown(bsi.analysis.stats, title=False)))
stats = json.loads((folder / "stats.json").read_text())
study_figure(stats).show()
display(Markdown((folder / "results.md").read_text()))

# %% [markdown]
# ## 3. Side by side
#
# Every evaluated model's answers are kept with its outcomes (`outcomes/*.json`
# in the sweep folder), so the same questions can be read across methods: the
# dense model and every method at the smallest size. Numbers say *how much*
# each lost; the answers show *how*.

# %%
rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
smallest = min(grid.targets)
shown = [r for r in rows if r["method"] == "dense" or r["target"] == smallest]
outputs = {r["method"]: json.loads((folder / r["outcomes"]).read_text())["prediction"][:3] for r in shown}
questions = [e.question for e in load_task(config.data, test_size=config.test_size, seed=grid.seeds[0]).test[:3]]
result = {"prompts": questions,
          "models": [{"name": f"{r['method']} @ {r['target']:g}", "params": r["params_total"], "outputs": outputs[r["method"]]}
                     for r in shown]}
display(Markdown(comparison_markdown(result)))

# %%
at_small = sorted((r for r in rows if r["target"] == smallest), key=lambda r: (-r["accuracy"], r["loss"]))
best = at_small[0]
print(f"Result: {len(rows) - 1} cells ({len(grid.methods)} methods x {len(grid.targets)} sizes); at target "
      f"{smallest:g} the best is {best['method']} with accuracy {best['accuracy']:.0%} "
      f"(dense {rows[0]['accuracy']:.0%}), losses " + ", ".join(f"{r['method']} {r['loss']:.3f}" for r in at_small)
      + f"; ran in {time.perf_counter() - start:.0f} s")
outcome = {
    "rows": [{k: r[k] for k in ("method", "target", "compressible_ratio", "accuracy", "loss")} for r in rows],
    "intervals": [(e["accuracy"]["low"], e["accuracy"]["estimate"], e["accuracy"]["high"])
                  for cells in stats["protocols"]["tuned"]["methods"].values() for e in cells.values()],
    "answers": {name: len(out) for name, out in outputs.items()},
}

# %% [markdown]
# ## Recap
#
# * A fair comparison gives every method the same three stages and the same
#   recovery budget, so differences come from which bases each keeps.
# * `bsi sweep` runs each engine method once per seed along one path through
#   every size; each size is recovered and evaluated on its own.
# * Every figure comes with a 95% interval from the test problems (a paired
#   bootstrap for differences); a difference is a finding only when its
#   interval excludes 0, and with one seed the interval leaves out the
#   run-to-run spread.
# * The answers themselves are kept, so the same questions can be read across
#   methods.
#
# In numbers, this run (one seed, few problems: read the intervals before the
# estimates):

# %%
display(Markdown("\n".join(
    f"* {r['method']} at {r['target']:g}: accuracy {r['accuracy']:.0%}, loss {r['loss']:.3f}"
    for r in sorted(rows, key=lambda r: (-r["target"], r["method"])))))

# %% [markdown]
# ## What to try
#
# Each exercise runs after the notebook, in the same kernel (it uses the
# variables above). Predict the outcome first, then open the solution.
#
# **1. Is the difference a finding?** At the smallest size, compute the paired
# bootstrap interval of `bsi` minus each other method, for the accuracy and for
# the loss (`bsi.analysis.stats.paired_difference` on the saved outcomes).
#
# <details><summary>Solution</summary>
#
# ```python
# from bsi.analysis.stats import Outcomes, paired_difference
#
#
# def outcomes_of(method, target):
#     """One cell's per-problem outcomes, from the sweep folder."""
#     row = next(r for r in rows if r["method"] == method and r["target"] == target)
#     return Outcomes.from_columns(json.loads((folder / row["outcomes"]).read_text()))
#
#
# for other in (m for m in grid.methods if m != "bsi"):
#     for statistic in ("accuracy", "loss"):
#         d = paired_difference([outcomes_of("bsi", smallest)], [outcomes_of(other, smallest)], statistic)
#         print(f"bsi - {other:>7} at {smallest:g}, {statistic:>8}: {d.estimate:+.3f} [{d.low:+.3f}, {d.high:+.3f}]"
#               f"{'  <- excludes 0' if d.excludes_zero else ''} ({d.samples} problems)")
# ```
#
# What you should see: with this notebook's few test problems most accuracy
# intervals are wide and include 0 (within noise); the loss, which uses every
# answer token of every problem, separates methods more often. The full study
# (`bsi sweep --preset study`) uses 100 problems and three seeds for this
# reason.
#
# </details>
#
# **2. Where the difference comes from.** A paired accuracy difference only
# counts the problems the two models answer differently. Count, at the
# smallest size, the problems both get right, only `bsi`, only `basel`, and
# neither.
#
# <details><summary>Solution</summary>
#
# ```python
# a, b = outcomes_of("bsi", smallest), outcomes_of("basel", smallest)  # the helper of exercise 1
# pairs = [(x, y) for x, y in zip(a.correct, b.correct) if x is not None]
# counts = {"both right": sum(x and y for x, y in pairs), "only bsi": sum(x and not y for x, y in pairs),
#           "only basel": sum(y and not x for x, y in pairs), "both wrong": sum(not x and not y for x, y in pairs)}
# print(counts)
# print(f"accuracy difference = (only bsi - only basel) / answered = "
#       f"{(counts['only bsi'] - counts['only basel']) / len(pairs):+.3f} = {a.accuracy() - b.accuracy():+.3f}")
# ```
#
# What you should see: the two ways of computing the difference agree
# exactly. Only the discordant problems (only one model right) move it, which
# is why pairing narrows the interval: the problems both get right or both get
# wrong add no variation.
#
# </details>
#
# **3. The paper's protocol.** Run `bsi` once more under `protocols=("paper",)`
# (plain SVD bases, each layer's mass rule, Hutchinson curvature: the table in
# notebook 02), at the same sizes and schedule, and compare it with the
# `tuned` row.
#
# <details><summary>Solution</summary>
#
# ```python
# from dataclasses import replace
#
# paper_folder = Path(tempfile.mkdtemp(prefix="bsi-notebook-05-paper-"))
# for report in Sweep(config, replace(grid, methods=("bsi",), protocols=("paper",)), paper_folder).run():
#     if isinstance(report, CellReport):
#         print(describe(report))
# paper_rows = [json.loads(line) for line in (paper_folder / "results.jsonl").read_text().splitlines()]
# for r in paper_rows + [r for r in rows if r["method"] == "bsi"]:
#     print(f"{r['method']:>5} {r.get('protocol', '')}: target {r['target']:g}, accuracy {r['accuracy']:.0%}, "
#           f"loss {r['loss']:.3f}")
# ```
#
# What you should see: on the embedded model, at this short schedule, the
# paper's settings do much worse than the tuned ones, mostly because plain SVD
# bases collapse when cut this fast (docs/method.md, section 14, measures each
# setting on its own). On the tiny random model both rows are noise.
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
# * [docs/method.md](../docs/method.md), sections 11 (the methods), 14 (the
#   protocols) and 15 (evaluation and statistics);
#   [docs/benchmarks.md](../docs/benchmarks.md), the full study's results.
# * Next: [06 · Text and perplexity](06_text.ipynb), the same method on plain text.
