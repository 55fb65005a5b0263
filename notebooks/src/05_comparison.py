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
from bsi.teaching import notebook_settings

display(Markdown(bsi.pipeline.methods.__doc__.split("Add a method")[0]))

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
display(Markdown(bsi.analysis.stats.__doc__))
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
