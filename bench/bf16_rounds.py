"""What bf16 changes in the engine's rounds: the same fine-tuned weights pruned in float32 and in bfloat16.

    python bench/bf16_rounds.py --preset default --rounds 2 --device cuda --json $OUT/bf16.json   # on a GPU
    python bench/bf16_rounds.py --preset smoke --device cpu --json /tmp/bf16.json                # CPU (torch runs bf16)

A `bsi compress --dtype bfloat16` run differs from a float32 one twice: its
fine-tune ran in bf16 (another model), and its engine computes in bf16. This
script separates the second: it fine-tunes once in float32 (the pipeline's
cached stage 1), then starts the compression of that same model in both
dtypes, with the same seed, batches and probes, and compares each of the
first ``--rounds`` rounds (``RoundReport``) layer by layer:

* ``spearman``: rank correlation of the two importance vectors (over the
  bases both runs still hold, matched by their original index);
* ``pruned_jaccard``: overlap of the sets of bases each run removed;
* ``sigma_rel``: relative difference of the learned coefficients;
* ``grad_rel``, ``curvature_rel``: relative difference of the gradient and
  curvature sums the score read (None when the score reads none);
* per run: ``eps`` (the rule gives bf16 eps_max: 7 fraction bits),
  ``significant_gradients`` (the share of first-order terms that pass the
  noise test), the monitor loss before and after each cut, notes and
  skipped batches, and the seconds per round.

Nothing here is a pass/fail threshold: it is what a reader needs to judge
whether a bf16 run prunes the same bases for the same reasons. One seed, one
model: a diagnostic, no interval.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # this checkout's bsi first
from common import machine

from bsi.analysis.ranking import spearman
from bsi.config import PRESETS, make_config
from bsi.files import atomic_write_json
from bsi.models import cache_root
from bsi.pipeline.runner import Pipeline, finetune_cache_key
from bsi.reports import RoundReport

DTYPES = ("float32", "bfloat16")


def relative(a: torch.Tensor | None, b: torch.Tensor | None) -> float | None:
    """``|a - b| / |a|`` (L2), None when either is missing."""
    if a is None or b is None:
        return None
    a, b = a.double(), b.double()
    return float((a - b).norm() / a.norm()) if float(a.norm()) else float("nan")


def compare_layer(x, y) -> dict:
    """Two runs' :class:`~bsi.reports.LayerRound` of one layer, matched on the bases both hold (by original index)."""
    ids_x, ids_y = x.basis_ids.tolist(), y.basis_ids.tolist()
    common = sorted(set(ids_x) & set(ids_y))
    ix = torch.tensor([ids_x.index(i) for i in common], dtype=torch.long)
    iy = torch.tensor([ids_y.index(i) for i in common], dtype=torch.long)
    pick = lambda t, i: None if t is None else t[i]  # noqa: E731
    pruned_x = {ids_x[int(i)] for i in x.pruned}
    pruned_y = {ids_y[int(i)] for i in y.pruned}
    union = pruned_x | pruned_y
    return {"bases": len(common), "spearman": spearman(x.importance[ix], y.importance[iy]),
            "pruned": [len(pruned_x), len(pruned_y)],
            "pruned_jaccard": len(pruned_x & pruned_y) / len(union) if union else 1.0,
            "sigma_rel": relative(x.sigma[ix], y.sigma[iy]),
            "grad_rel": relative(pick(x.grad, ix), pick(y.grad, iy)),
            "curvature_rel": relative(pick(x.hessian, ix), pick(y.hessian, iy))}


def rounds_in(config, cache_dir: str | None, rounds: int) -> tuple[list[RoundReport], list[float], dict]:
    """The first ``rounds`` RoundReports of ``config``'s compression, the seconds to each, and the run's notes."""
    pipeline = Pipeline(config, cache_dir=cache_dir)
    out: list[RoundReport] = []
    times: list[float] = []
    start = None
    for report in pipeline.run():
        if start is None and type(report).__name__ == "StageReport" and report.stage == "compress":
            start = time.perf_counter()
        if isinstance(report, RoundReport):
            out.append(report)
            times.append(time.perf_counter() - (start or time.perf_counter()))
            if len(out) == rounds:
                break
    info = {"notes": list(pipeline.notes), "eps": out[-1].eps if out else None,
            "skipped_batches": out[-1].skipped_batches if out else None, "device": str(pipeline.device)}
    del pipeline
    return out, times, info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="default", choices=list(PRESETS))
    p.add_argument("--protocol", choices=("tuned", "paper"), help="the engine's settings (default: the preset's)")
    p.add_argument("--rounds", type=int, default=2, help="rounds compared (default: 2)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--cache-dir", help="bsi's cache (default: $BSI_CACHE or ~/.cache/bsi)")
    p.add_argument("--json", default="bench/bf16-rounds.json")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("bench/bf16_rounds.py --device cuda needs a CUDA GPU; none is available here (--device cpu runs bf16 "
              "on the CPU)", file=sys.stderr)
        return 2
    given = {"device": args.device, "dtype": "float32", "eval_examples": 0, "eval_loss_examples": 0,
             **({"protocol": args.protocol} if args.protocol else {})}  # nothing evaluated: the rounds are compared
    base = make_config(args.preset, given)
    # stage 1 once, in float32 (cached): both runs then start from this folder, in their own dtype
    for _ in Pipeline(base, cache_dir=args.cache_dir).reference_stage():
        pass
    folder = cache_root(args.cache_dir) / "finetuned" / finetune_cache_key(base, torch.float32)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    runs, result = {}, {"kind": "bf16_rounds", "machine": machine(), "preset": args.preset,
                        "protocol": base.protocol, "fine_tuned": "float32, shared", "runs": {}, "layers": []}
    for dtype in DTYPES:
        config = make_config(args.preset, given | {"dtype": dtype, "model": str(folder), "skip_finetune": True})
        reports, times, info = rounds_in(config, args.cache_dir, args.rounds)
        runs[dtype] = reports
        result["runs"][dtype] = info | {"round_seconds": times, "rounds": [
            {"loss_before": r.loss_before, "loss_after": r.loss_after, "removed": r.removed, "mean_loss": r.mean_loss,
             "significant_gradients": None if math.isnan(r.significant_gradients) else r.significant_gradients}
            for r in reports]}
        atomic_write_json(args.json, result)  # the first dtype's rounds stay if the second is cut short
    for number, (a, b) in enumerate(zip(runs["float32"], runs["bfloat16"]), start=1):
        layers = {x.name: compare_layer(x, y) for x, y in zip(a.layers, b.layers)}
        values = lambda key: [v[key] for v in layers.values() if v[key] is not None and not math.isnan(v[key])]  # noqa: E731
        summary = {"round": number}
        for key in ("spearman", "pruned_jaccard", "sigma_rel", "grad_rel", "curvature_rel"):
            got = values(key)
            summary[key] = {"median": sorted(got)[len(got) // 2], "min": min(got), "max": max(got)} if got else None
        result["layers"].append(summary | {"per_layer": layers})
        print({k: v for k, v in summary.items()}, flush=True)
    atomic_write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
