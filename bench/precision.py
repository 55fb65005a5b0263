"""Two saved runs of one configuration side by side: did a change of precision (or of anything) move the results?

    python bench/precision.py runs/autocast runs/float32
    python bench/precision.py runs/autocast data/runs/default --models recovered

Reads each folder's ``outcomes.jsonl`` (every evaluated model's per-problem
answers, marks and answer-token losses) and ``summary.json``, and prints for
every model the two folders both evaluated: accuracy and loss on each side,
how many answers and marks differ, and the paired difference (first folder
minus second) with its bootstrap 95% interval over the same test problems
(:func:`bsi.analysis.stats.paired_difference`). "within noise" when the
interval holds zero. Also each run's wall time as its summary records it.

The interval is over test problems for one training run on each side: it
says whether these two models differ on these problems, not how much two
seeds of either setting would.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's bsi first


def read_outcomes(folder: Path) -> dict[str, list[dict]]:
    """``outcomes.jsonl`` grouped by model name, each list in problem order."""
    path = folder / "outcomes.jsonl"
    if not path.is_file():
        raise SystemExit(f"error: '{folder}' has no outcomes.jsonl: give a `bsi compress` output folder")
    models: dict[str, list[dict]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        models.setdefault(row["model"], []).append(row)
    return {name: sorted(rows, key=lambda r: r["index"]) for name, rows in models.items()}


def compare(a: dict[str, list[dict]], b: dict[str, list[dict]], models: list[str] | None = None) -> list[dict]:
    """One record per model evaluated in both: accuracies, losses, differing answers and paired intervals (a - b)."""
    from bsi.analysis.stats import Outcomes, paired_difference

    out = []
    for name in models or [m for m in a if m in b]:
        if name not in a or name not in b:
            raise SystemExit(f"error: model '{name}' is not evaluated in both folders ({', '.join(sorted(a))} / "
                             f"{', '.join(sorted(b))})")
        rows_a, rows_b = a[name], b[name]
        if [r["question"] for r in rows_a] != [r["question"] for r in rows_b]:
            raise SystemExit(f"error: '{name}' was evaluated on other problems in the two folders: not comparable")
        sides = [Outcomes.from_columns({"correct": [r["correct"] for r in rows],
                                        "loss_sum": [r["loss_sum"] for r in rows],
                                        "tokens": [r["tokens"] for r in rows]}) for rows in (rows_a, rows_b)]
        record = {"model": name, "problems": len(rows_a),
                  "answers_differ": sum(x["prediction"] != y["prediction"] for x, y in zip(rows_a, rows_b)),
                  "marks_differ": sum(x["correct"] != y["correct"] for x, y in zip(rows_a, rows_b))}
        for statistic in ("accuracy", "loss"):
            interval = paired_difference([sides[0]], [sides[1]], statistic)
            record[statistic] = {"a": _mean(rows_a, statistic), "b": _mean(rows_b, statistic),
                                 "difference": interval.to_dict()}
        out.append(record)
    return out


def _mean(rows: list[dict], statistic: str) -> float:
    if statistic == "accuracy":
        answered = [r["correct"] for r in rows if r["correct"] is not None]
        return sum(answered) / len(answered)
    return sum(r["loss_sum"] for r in rows) / sum(r["tokens"] for r in rows)


def table(records: list[dict], label_a: str, label_b: str) -> str:
    lines = [f"| model | problems | accuracy {label_a} | accuracy {label_b} | difference [95%] | loss {label_a} | "
             f"loss {label_b} | difference [95%] | answers differing |", "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        acc, loss = r["accuracy"], r["loss"]
        lines.append(f"| {r['model']} | {r['problems']} | {acc['a']:.0%} | {acc['b']:.0%} | {_span(acc, 100, '{:+.0f}')}"
                     f" pt | {loss['a']:.4f} | {loss['b']:.4f} | {_span(loss, 1, '{:+.4f}')} | {r['answers_differ']} |")
    return "\n".join(lines)


def _span(stat: dict, scale: float, fmt: str) -> str:
    d = stat["difference"]
    text = f"{fmt.format(d['estimate'] * scale)} [{fmt.format(d['low'] * scale)}, {fmt.format(d['high'] * scale)}]"
    return text + (" within noise" if d["low"] <= 0 <= d["high"] else "")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path, help="a run folder (the candidate)")
    parser.add_argument("b", type=Path, help="another run folder of the same configuration (the baseline)")
    parser.add_argument("--labels", nargs=2, default=None, metavar=("A", "B"), help="column labels (default: folder names)")
    parser.add_argument("--models", nargs="+", default=None, help="models to compare (default: all in both)")
    parser.add_argument("--json", type=Path, default=None, help="also write the records here")
    args = parser.parse_args(argv)
    label_a, label_b = args.labels or (args.a.name, args.b.name)
    records = compare(read_outcomes(args.a), read_outcomes(args.b), args.models)
    print(table(records, label_a, label_b))
    for label, folder in ((label_a, args.a), (label_b, args.b)):
        summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        print(f"{label}: {summary.get('seconds', float('nan')):.0f} s in the pipeline, {summary.get('dtype')}"
              f"{' with ' + summary['autocast'] + ' autocast' if summary.get('autocast') else ''}, "
              f"{summary.get('compression_ratio', float('nan')):.2f}x")
    if args.json:
        args.json.write_text(json.dumps(records, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
