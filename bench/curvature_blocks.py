"""How close is each curvature source to the exact diagonal, over whole transformer blocks? (issue 16)

    python bench/curvature_blocks.py --model $BSI_CACHE/finetuned/<hash> --blocks 10,20 --json runs/blocks.json

Opens round 1 of a compression exactly as the engine does (the preset's
bases and candidate pools), picks *every* compressible layer of the given
blocks (7 per block in a Llama model) and, in each, ``--per-layer``
coefficients of its candidate pool at evenly spaced ranks. On one fixed
mini-batch it then computes, for those coefficients:

* the **exact Hessian diagonal** ``d2 l / d sigma_i^2``: one second-order
  backward per coefficient (:func:`bsi.method.curvature.exact_hessian_diagonal`);
* the **exact Gauss-Newton diagonal** of the answer-token cross-entropy:
  one forward-mode pass per coefficient
  (:func:`bsi.method.curvature.exact_gauss_newton_diagonal`). It is what
  ``mc-fisher`` estimates and what ``fisher`` approximates;

and compares every curvature source the engine offers, each run exactly as a
profiling step runs it (the probes of ``hutchinson`` perturb every layer's
pool at ``model`` scope; at ``layer`` scope only the chosen layers are probed,
one at a time):

* ``hutchinson`` (``fd``, scopes ``model`` and ``layer``), ``--probes``
  single-probe estimates each;
* ``fisher`` (one estimate: it has no probes, it is what the batch gives);
* ``mc-fisher``, ``--probes`` single-sample estimates.

Per source it prints the relative error ``||estimate - exact|| / ||exact||``
against both exact diagonals after 1 and after all estimates averaged, the
Spearman correlation of the averaged estimate with both exact diagonals
(the ranking is what pruning uses), the seconds per estimate, and
the error per unit of time (error after one estimate times the square root of
its seconds: lower is better, comparable across sources whose error falls as
``1/sqrt(estimates)``). Errors are also split by block, so a dependence on
depth shows.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # this checkout's bsi first
from common import machine, open_first_round, real_batches

from bsi.errors import BSIError
from bsi.method.curvature import (
    curvature_source,
    evaluation_mode,
    exact_gauss_newton_diagonal,
    exact_hessian_diagonal,
)
from bsi.method.names import layer_block
from bsi.method.theory import relative_error_by_probes
from bsi.pipeline.losses import answer_logits, answer_token_loss


def spread_positions(pool: torch.Tensor, sigma: torch.Tensor, count: int) -> torch.Tensor:
    """``count`` positions of ``pool`` at evenly spaced ranks of sigma (largest to smallest), sorted."""
    ranked = pool[torch.argsort(sigma[pool], descending=True)]  # (p,)
    if ranked.numel() <= count:
        return ranked.sort().values
    picks = torch.linspace(0, ranked.numel() - 1, count).round().long()  # (count,)
    return ranked[picks].sort().values


def logits_only(model, batch: dict) -> torch.Tensor:
    """The (N, V) answer-token logits the answer-token loss averages over."""
    return answer_logits(model, batch)[0]


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    ra = torch.argsort(torch.argsort(a)).double()
    rb = torch.argsort(torch.argsort(b)).double()
    return float(torch.corrcoef(torch.stack([ra, rb]))[0, 1])


def estimates_of(source, model, probed, pools, chosen, positions, batch, count, seed):
    """``count`` single estimates of ``source`` at the chosen coefficients: (count, n) and seconds per estimate.

    ``probed`` are the layers the source is run on, with their candidate
    ``pools``; ``chosen`` the indices among them whose ``positions`` are kept.
    """
    rows, seconds = [], []
    for c in range(count):
        generator = torch.Generator().manual_seed(seed + c)
        start = time.perf_counter()
        with evaluation_mode(model):
            result = source.profile(model, probed, pools, batch, answer_token_loss, generator)
        seconds.append(time.perf_counter() - start)
        if result is None:
            raise BSIError(f"{source.name}: non-finite estimate")
        rows.append(torch.cat([result.curvatures[i][positions[k]].double().cpu() for k, i in enumerate(chosen)]))
    return torch.stack(rows), statistics.median(seconds)


def errors(estimates: torch.Tensor, exact: torch.Tensor) -> dict[int, float]:
    counts = sorted({1, estimates.shape[0]})
    return relative_error_by_probes(estimates, exact, counts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model spec (the task-fine-tuned model, ideally)")
    p.add_argument("--preset", default="default", help="configuration whose bases and pools are used")
    p.add_argument("--blocks", default="10,20", help="comma-separated block indices (every layer of each)")
    p.add_argument("--per-layer", type=int, default=8, help="coefficients per layer with exact diagonals")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--probes", type=int, default=16, help="single estimates of the probe-based sources")
    p.add_argument("--layer-probes", type=int, default=4, help="single estimates of hutchinson at layer scope")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    first = open_first_round(args.model, args.preset)
    compressor, model, names, layers, pools = (first.compressor, first.compressor.model, first.names, first.layers,
                                               first.pools)
    (batch,) = real_batches(first.tokenizer, args.batch_size, first.config.max_length, 1, seed=321)
    blocks = [int(b) for b in args.blocks.split(",") if b.strip()]
    chosen = [i for i, n in enumerate(names) if layer_block(n) in blocks]
    if not chosen:
        raise BSIError(f"no compressible layer in blocks {blocks}: pick blocks between 0 and the model's depth - 1")
    block_layers = [layers[i] for i in chosen]
    positions = [spread_positions(pools[i], layers[i].sigma.detach().float(), args.per_layer) for i in chosen]
    owner_block = torch.cat([torch.full((pos.numel(),), layer_block(names[i])) for i, pos in zip(chosen, positions)])
    n = int(owner_block.numel())
    print(f"{len(chosen)} layers of blocks {blocks}, {n} coefficients; batch of {args.batch_size}, "
          f"{answer_token_loss.count(batch)} answer tokens", file=sys.stderr, flush=True)

    start = time.perf_counter()
    exact_h = torch.cat(exact_hessian_diagonal(model, block_layers, positions, batch, answer_token_loss))  # (n,)
    h_seconds = (time.perf_counter() - start) / n
    print(f"  exact Hessian diagonal: {h_seconds:.2f} s per coefficient", file=sys.stderr, flush=True)
    start = time.perf_counter()
    exact_g = torch.cat(exact_gauss_newton_diagonal(model, block_layers, positions, batch, logits_only))  # (n,)
    g_seconds = (time.perf_counter() - start) / n
    print(f"  exact Gauss-Newton diagonal: {g_seconds:.2f} s per coefficient", file=sys.stderr, flush=True)

    every_layer, block_only = (layers, pools, chosen), (block_layers, [pools[i] for i in chosen], range(len(chosen)))
    sources = [  # (source, scope, estimator, (layers probed, their pools, chosen among them), estimates)
        ("hutchinson", "model", curvature_source("hutchinson", eps=compressor.eps, scope="model"), every_layer,
         args.probes),
        ("hutchinson", "layer", curvature_source("hutchinson", eps=compressor.eps, scope="layer"), block_only,
         args.layer_probes),
        ("fisher", "-", curvature_source("fisher", eps=compressor.eps), every_layer, 1),
        ("mc-fisher", "-", curvature_source("mc-fisher", eps=compressor.eps), every_layer, args.probes),
    ]
    rows = []
    for name, scope, source, (probed, probed_pools, keep), count in sources:
        est, seconds = estimates_of(source, model, probed, probed_pools, list(keep), positions, batch, count, seed=11)
        mean = est.mean(dim=0)
        row = {"source": name, "scope": scope, "estimates": count, "seconds_per_estimate": seconds,
               "error_vs_hessian": errors(est, exact_h), "error_vs_gauss_newton": errors(est, exact_g),
               "spearman_vs_hessian": spearman(mean, exact_h), "spearman_vs_gauss_newton": spearman(mean, exact_g),
               "by_block": {}}
        for b in blocks:
            mask = owner_block == b
            row["by_block"][b] = {"error_vs_hessian": errors(est[:, mask], exact_h[mask])[count],
                                  "error_vs_gauss_newton": errors(est[:, mask], exact_g[mask])[count]}
        row["error_per_time"] = row["error_vs_hessian"][1] * math.sqrt(seconds)
        rows.append(row)
        print(f"  {name}/{scope}: {count} estimate(s), {seconds:.2f} s each", file=sys.stderr, flush=True)

    negative = float((exact_h < 0).double().mean())
    gap = float((exact_h - exact_g).norm() / exact_h.norm())
    print(f"\nExact diagonals over {n} coefficients of {len(chosen)} layers (blocks {blocks}): Hessian "
          f"{h_seconds:.2f} s and Gauss-Newton {g_seconds:.2f} s per coefficient; {negative:.0%} of the Hessian "
          f"entries negative; ||H - G|| / ||H|| = {gap:.2f}; Spearman(H, G) = {spearman(exact_h, exact_g):.2f}.\n")
    print("| source | scope | estimates | error vs Hessian (1 / all) | error vs Gauss-Newton (1 / all) | "
          "Spearman vs Hessian / Gauss-Newton | s per estimate | error x sqrt(s) | " +
          " | ".join(f"block {b}: error vs H / G (all)" for b in blocks) + " |")
    print("|---|---|---|---|---|---|---|---|" + "---|" * len(blocks))
    for r in rows:
        c = r["estimates"]
        eh, eg = r["error_vs_hessian"], r["error_vs_gauss_newton"]
        per_block = " | ".join(f"{r['by_block'][b]['error_vs_hessian']:.2f} / {r['by_block'][b]['error_vs_gauss_newton']:.2f}"
                               for b in blocks)
        print(f"| {r['source']} | {r['scope']} | {c} | {eh[1]:.2f} / {eh[c]:.2f} | {eg[1]:.2f} / {eg[c]:.2f} | "
              f"{r['spearman_vs_hessian']:.2f} / {r['spearman_vs_gauss_newton']:.2f} | "
              f"{r['seconds_per_estimate']:.2f} | {r['error_per_time']:.2f} | {per_block} |")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "model": args.model, "args": vars(args), "machine": machine(), "coefficients": n,
            "layers": [names[i] for i in chosen], "exact_hessian": exact_h.tolist(),
            "exact_gauss_newton": exact_g.tolist(), "hessian_seconds_per_coefficient": h_seconds,
            "gauss_newton_seconds_per_coefficient": g_seconds, "negative_share": negative,
            "hessian_gauss_newton_gap": gap, "rows": rows}, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
