"""The ranking tested apart from recovery: predicted against measured loss changes, every round of a real run.

    python bench/ranking.py --out runs/ranking                      # sweep-cpu at target 0.25, 4 rounds (about 30 min)
    python bench/ranking.py --preset smoke --out /tmp/r             # seconds, on the tiny model

Runs ``bsi compress`` with score ``bsi`` (whose round statistics give every
ranking: ``bsi``, ``bsi-grad``, ``magnitude``, ``random``) and, at the end of
every round, before the cut, measures on held-out problems (the validation
set, carved from the training data) what :mod:`bsi.analysis.ranking`
describes: single candidates of a few layers removed one at a time (Spearman
of predicted against measured), each layer's k lowest-ranked candidates, and
whole cuts of the round's size crossing "how many per layer" and "which
inside a layer" between bsi and magnitude. Writes ``ranking.json`` and prints
the tables that docs/benchmarks.md quotes. One seed: a diagnostic, not a
finding with an interval (the study, ``bsi sweep --preset study``, gives those).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's bsi first
from bsi.analysis.ranking import RANKINGS, measure_round
from bsi.config import make_config
from bsi.files import atomic_write_json
from bsi.pipeline.evaluate import dataset_loss
from bsi.pipeline.runner import Pipeline
from bsi.reports import RoundReport
from bsi.runtime import keep_freed_memory

DEFAULT_LAYERS = ("model.layers.4.self_attn.q_proj", "model.layers.15.mlp.down_proj")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="sweep-cpu", help="pipeline preset (default: sweep-cpu)")
    p.add_argument("--target", type=float, default=0.25, help="target ratio of the run (default: 0.25)")
    p.add_argument("--rounds", type=int, default=4, help="pruning rounds (default: 4)")
    p.add_argument("--held-out", type=int, default=48, help="validation problems the loss is measured on (default: 48)")
    p.add_argument("--layers", default=",".join(DEFAULT_LAYERS),
                   help="layers whose candidates are measured one by one (default: an attention and an MLP layer)")
    p.add_argument("--singles", type=int, default=12, help="candidates per layer measured one by one (default: 12)")
    p.add_argument("--shares", default="0.25,0.5", help="k of 'the k lowest' as shares of the pool (default: 0.25,0.5)")
    p.add_argument("--seed", type=int, default=0, help="run seed (default: 0)")
    p.add_argument("--out", required=True, help="folder for ranking.json")
    args = p.parse_args(argv)
    keep_freed_memory()

    config = make_config(args.preset, {"seed": args.seed, "validation_size": args.held_out, "eval_examples": 0,
                                       "recover": {"steps": 0},
                                       "compress": {"score": "bsi", "target_ratio": args.target, "rounds": args.rounds}})
    pipeline = Pipeline(config)
    layers = [name for name in args.layers.split(",") if name]
    shares = tuple(float(x) for x in args.shares.split(","))
    rounds: list[dict] = []
    start = time.perf_counter()

    def measure(compressor, scores, pruned):
        known = [n for n in layers if n in compressor.layers] or list(compressor.layers)[:2]

        def loss() -> float:
            return dataset_loss(compressor.model, pipeline.tokenizer, pipeline.task.validation, batch_size=16)

        result = measure_round(compressor.layers, scores, compressor.select, pruned, loss, probe_layers=known,
                               singles=args.singles, shares=shares, seed=args.seed)
        result["round"] = compressor.round_index
        rounds.append(result)
        print(f"round {result['round']}: held-out loss {result['loss']:.4f}; cuts " +
              ", ".join(f"{k} {v['loss']:.4f}" for k, v in result["cuts"].items()) +
              f" ({time.perf_counter() - start:.0f} s)", flush=True)

    pipeline.before_cut = measure
    for report in pipeline.run():
        if isinstance(report, RoundReport):
            print(f"  round {report.round} done: {report.compressible_ratio:.3f} of the linear layers", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "ranking.json", {"config": config.to_dict(), "layers": layers, "rounds": rounds,
                                             "seconds": time.perf_counter() - start})
    print(tables(rounds))
    print(f"wrote {out / 'ranking.json'} ({time.perf_counter() - start:.0f} s)")
    return 0


def tables(rounds: list[dict]) -> str:
    """The three markdown tables: whole cuts, Spearman per ranking, the k lowest."""
    cuts = list(rounds[0]["cuts"])
    lines = ["Held-out loss after removing the round's whole budget (no training in between):", "",
             "| round | before | " + " | ".join(cuts) + " |", "|---|---|" + "---|" * len(cuts)]
    for r in rounds:
        lines.append(f"| {r['round']} | {r['loss']:.4f} | " + " | ".join(f"{r['cuts'][c]['loss']:.4f}" for c in cuts) + " |")
    present = [name for name in RANKINGS if any(name in e["spearman"] for r in rounds for e in r["layers"].values())]
    lines += ["", "Spearman's correlation of predicted and measured loss change, single candidates (mean over the "
                  "probed layers):", "", "| round | " + " | ".join(present) + " |", "|---|" + "---|" * len(present)]
    for r in rounds:
        values = [statistics.fmean(e["spearman"][k] for e in r["layers"].values()) if r["layers"] else float("nan")
                  for k in present]
        lines.append(f"| {r['round']} | " + " | ".join(f"{v:+.2f}" for v in values) + " |")
    lines += ["", "Loss change from removing a layer's k lowest-ranked candidates:", "",
              "| round | layer | k | " + " | ".join(present) + " |", "|---|---|---|" + "---|" * len(present)]
    for r in rounds:
        for name, e in r["layers"].items():
            for share, row in e["k_lowest"].items():
                lines.append(f"| {r['round']} | `{name}` | {row['k']} ({share} of {e['pool']}) | " +
                             " | ".join(f"{row[k]:+.4f}" for k in present) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
