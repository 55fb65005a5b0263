"""A compressed run against its dense model, from the run's own per-problem outcomes, with paired intervals.

    python bench/against_dense.py runs/default [more run folders ...]

Reads ``summary.json`` and ``outcomes.jsonl`` of each ``bsi compress`` folder:
the dense (fine-tuned) and the recovered model answered the same test
problems, so the difference is paired (:func:`bsi.analysis.stats.paired_difference`,
95% bootstrap over the problems). Prints one line per run: whole-model
compression, both accuracies, the difference in points and the share of the
dense accuracy kept, with their intervals, the losses, and the run's time.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's bsi first
from bsi.analysis.stats import Outcomes, paired_difference


def outcomes_of(folder: Path) -> dict[str, Outcomes]:
    columns: dict[str, dict[str, list]] = {}
    for line in (folder / "outcomes.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        column = columns.setdefault(row["model"], {"correct": [], "loss_sum": [], "tokens": []})
        for key in column:
            column[key].append(row[key])
    return {model: Outcomes.from_columns(c) for model, c in columns.items()}


def line(folder: Path) -> str:
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    runs = outcomes_of(folder)
    dense, after = runs["finetuned"], runs["recovered"]
    diff = paired_difference([after], [dense], "accuracy")
    kept = after.accuracy() / dense.accuracy()
    # the kept share's interval: the difference's interval over the dense accuracy (the dense set is fixed)
    low, high = 1 + diff.low / dense.accuracy(), 1 + diff.high / dense.accuracy()
    return (f"{folder}: {summary['compression_ratio']:.2f}x whole model; accuracy {100 * dense.accuracy():.1f}% -> "
            f"{100 * after.accuracy():.1f}% ({100 * diff.estimate:+.1f} points [{100 * diff.low:+.1f}, {100 * diff.high:+.1f}], "
            f"{100 * kept:.0f}% of dense [{100 * low:.0f}, {100 * high:.0f}]) on {len(dense.correct)} problems; loss "
            f"{dense.loss():.4f} -> {after.loss():.4f}; {summary['seconds']:.0f} s")


if __name__ == "__main__":
    for arg in sys.argv[1:] or ["runs/default"]:
        print(line(Path(arg)))
