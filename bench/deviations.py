"""What each of bsi's deviations from the published methods changes, measured one at a time.

    python bench/deviations.py --out runs/deviations          # 1 h 38 min on 2 cores (2026-11-25)
    python bench/deviations.py --out runs/deviations --seeds 0,1,2 --only bsi,selection,no,scores
        # the rows seed 0 questioned and bsi-mag, on seeds 1 and 2 (and bsi-mag's seed 0): 1 h 26 min
    python bench/deviations.py --out runs/deviations-015 --target 0.15 --seeds 0,1,2 --only bsi   # 44 min
    python bench/deviations.py --preset smoke --rounds 2 --out /tmp/d    # seconds, on the tiny model

The ``tuned`` protocol differs from the published BSI in several places
(:data:`bsi.config.PROTOCOLS`). Each row here runs ``bsi`` at one size with
the tuned settings except *one*, put back to the published choice, and
compares it with the tuned run on the same test problems (paired bootstrap
95% interval, :mod:`bsi.analysis.stats`). The truncation baselines' rows do
the same for the shortcuts earlier versions of the sweep took (batch-mean
Fisher for FWSVD, uniform ranks for ASVD, auxiliary vectors paid out of a
truncation's rank) against the published method. ``bsi-mag`` (the named
variant: bsi's per-layer budgets, smallest |sigma| inside each layer) is
compared with the tuned run the same way.

Each seed is its own run: its own test and validation split, fine-tune,
batches and probes. With several seeds the table pools them (the interval
resamples problems within each seed: it covers the test problems, not
training noise) and lists each seed's difference alone with a t-interval
over seeds, the run-to-run view. Writes ``deviations.json`` (finished rows
of each seed are kept and skipped) and prints the table docs/method.md
quotes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's bsi first
from bsi.analysis.stats import Outcomes, paired_difference, per_seed_differences, pooled_value, seed_interval
from bsi.analysis.study import interval_text
from bsi.config import BaselineConfig, make_config
from bsi.files import atomic_write_json
from bsi.pipeline.runner import Pipeline
from bsi.reports import DoneReport
from bsi.runtime import keep_freed_memory

#: (label, method, compress overrides, baseline overrides, the row it is compared with)
VARIANTS = [
    ("bsi, tuned", "bsi", {}, {}, None),
    ("bases: plain SVD (published) instead of whitened", "bsi", {"bases": "svd"}, {}, "bsi, tuned"),
    ("selection: each layer's mass rule (published) instead of global", "bsi", {"selection": "mass"}, {}, "bsi, tuned"),
    ("no per-round cut cap (published)", "bsi", {"max_cut_factor": 0.0}, {}, "bsi, tuned"),
    ("curvature: Hutchinson, symmetric perturbations (published) instead of Fisher", "bsi",
     {"curvature": "hutchinson", "probe_scope": "model", "eps_floor": 0.0}, {}, "bsi, tuned"),
    ("scores over the profiling batches only (published) instead of the round", "bsi",
     {"score_window": "profiling"}, {}, "bsi, tuned"),
    ("first-order terms untested (published, z = 0)", "bsi", {"gradient_z": 0.0}, {}, "bsi, tuned"),
    ("fwsvd, published (per-example Fisher)", "fwsvd", {}, {}, None),
    ("fwsvd with the batch-mean Fisher", "fwsvd", {}, {"fisher": "batch"}, "fwsvd, published (per-example Fisher)"),
    ("asvd, published (sensitivity ranks)", "asvd", {}, {}, None),
    ("asvd with uniform ranks", "asvd", {}, {"allocation": "uniform"}, "asvd, published (sensitivity ranks)"),
    ("svd-llm, published (no auxiliary vectors)", "svd-llm", {}, {}, None),
    ("svd-llm paying 8 auxiliary vectors out of its rank", "svd-llm", {}, {"aux_rank": 8},
     "svd-llm, published (no auxiliary vectors)"),
    ("bsi-mag: bsi's per-layer budgets, smallest singular values inside each layer", "bsi-mag", {}, {}, "bsi, tuned"),
]


def load_rows(path: Path) -> dict[str, dict[str, dict]]:
    """``{label: {seed: row}}`` from ``deviations.json``; a file of the one-seed format (``{label: row}``) is seed 0."""
    if not path.is_file():
        return {}
    saved = json.loads(path.read_text())
    return {label: ({"0": row} if "method" in row else row) for label, row in saved.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="study-quick", help="pipeline preset (default: study-quick)")
    p.add_argument("--target", type=float, default=0.4, help="target ratio (default: 0.4)")
    p.add_argument("--rounds", type=int, default=6, help="pruning rounds of the bsi runs (default: 6)")
    p.add_argument("--seeds", default="0", help="comma-separated run seeds (default: 0)")
    p.add_argument("--only", help="comma-separated labels' first words to run (default: every row)")
    p.add_argument("--out", required=True, help="folder for deviations.json (finished rows are kept and skipped)")
    args = p.parse_args(argv)
    try:
        seeds = [int(x) for x in args.seeds.split(",")]
    except ValueError:
        p.error(f"--seeds takes comma-separated integers, e.g. 0,1,2; got '{args.seeds}'")
    keep_freed_memory()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "deviations.json"
    rows = load_rows(saved)
    for seed in seeds:
        for label, method, compress, baseline, _ in VARIANTS:
            if str(seed) in rows.get(label, {}) or (args.only and not any(label.startswith(w) for w in args.only.split(","))):
                continue
            config = make_config(args.preset, {"seed": seed,
                                               "compress": {"target_ratio": args.target, "rounds": args.rounds, **compress}})
            pipeline = Pipeline(config, method=method, baseline=BaselineConfig(**baseline))
            start = time.perf_counter()
            summary = next(r.summary for r in pipeline.run() if isinstance(r, DoneReport))
            rows.setdefault(label, {})[str(seed)] = {
                "method": method, "compress": compress, "baseline": baseline, "seed": seed,
                "metrics": summary["metrics_after"], "params_total": summary["params_after"],
                "seconds": time.perf_counter() - start, **pipeline.evaluations["recovered"].columns()}
            atomic_write_json(saved, rows)
            print(f"{label}, seed {seed}: accuracy {summary['metrics_after']['accuracy']:.1%}, "
                  f"loss {summary['metrics_after']['loss']:.4f} ({rows[label][str(seed)]['seconds']:.0f} s)", flush=True)
    print(table(rows, args.target))
    return 0


def table(rows: dict[str, dict[str, dict]], target: float) -> str:
    """The markdown table: each row against the one it is compared with, on the seeds both have.

    Accuracy and loss are pooled over a row's seeds; the change is pooled over
    the shared seeds with a paired bootstrap 95% interval (problems resampled
    within each seed), followed by each seed's own change and, over those,
    a t-interval (:func:`bsi.analysis.stats.seed_interval`).
    """
    def outcomes(label: str, seeds: list[str]) -> list[Outcomes]:
        return [Outcomes.from_columns(rows[label][s]) for s in seeds]

    lines = [f"At target {target:g}; paired 95% bootstrap intervals over the test problems, pooled over the seeds "
             "both rows have (n problems = seeds x test set); **bold**: that interval excludes 0; then each seed's "
             "change alone and their mean with a 95% Student-t interval over seeds (the run-to-run view).", "",
             "| variant | seeds | accuracy | loss | change in accuracy (points) | change in loss |",
             "|---|---|---|---|---|---|"]
    for label, _, _, _, reference in VARIANTS:
        if label not in rows:
            continue
        seeds = sorted(rows[label], key=int)
        pooled = outcomes(label, seeds)
        cells = ["", ""]
        shared = [s for s in seeds if s in rows.get(reference, {})]
        if shared:
            mine, theirs = outcomes(label, shared), outcomes(reference, shared)
            for i, stat in enumerate(("accuracy", "loss")):
                scale, digits = (100, 1) if stat == "accuracy" else (1, 3)
                cells[i] = interval_text(paired_difference(mine, theirs, stat).to_dict(), scale, digits, signed=True)
                if len(shared) > 1:
                    values = per_seed_differences(mine, theirs, stat)
                    each = ", ".join(f"{scale * v:+.{digits}f}" for v in values)
                    runs = interval_text(seed_interval(values).to_dict(), scale, digits, signed=True)
                    cells[i] += f" (seeds: {each}; over seeds {runs})"
        lines.append(f"| {label} | {','.join(seeds)} | {100 * pooled_value(pooled, 'accuracy'):.1f}% | "
                     f"{pooled_value(pooled, 'loss'):.3f} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
