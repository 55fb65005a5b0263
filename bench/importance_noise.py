"""Which score ranks bases reproducibly at a given profiling budget, with which curvature source?

    python bench/importance_noise.py --model $BSI_CACHE/finetuned/<hash> --preset default

Opens round 1 of a compression exactly as the engine does (bases, candidate
pools and their widening from the preset's configuration), then profiles two
*independent* halves A and B, each of ``--batches-per-half`` mini-batches of
the task (by default the preset's profiling budget per round), with every
curvature source asked for (``fisher``, ``mc-fisher``, ``hutchinson``; each
half draws its own batches and probes). Every score is computed from each
half, and the Spearman correlation of the pool's importance between A and B
(per layer, median over layers) says how reproducible the ranking that decides
the pruning is: 1 is pure signal, 0 pure noise. ``basel`` reads only sigma,
so its ranking is the same on both halves by construction (shown for
completeness).

``bsi`` is scored twice: with the method's plain estimate (gradient z 0) and
with the significance test of its first-order term (``--gradient-z``, by
default the preset's), which keeps ``-sigma_i g_i`` only where ``|g_i|``
exceeds z standard errors of the per-example gradients.

Also printed per row: the share of pool bases with negative importance (the
mass rule prunes those first), the median ``|curvature term| / |gradient
term|`` (the untested gradient term), the share of first-order terms that
passed the test, and the cost of one profiling batch relative to one training
step, both timed in this run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # this checkout's bsi first
from common import open_first_round, real_batches

from bsi.method.curvature import GradientOnly, curvature_source, evaluation_mode
from bsi.method.scores import SCORES
from bsi.pipeline.losses import answer_token_loss


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Rank correlation of two (n,) vectors (ties broken by position)."""
    ra = torch.argsort(torch.argsort(a)).float()
    rb = torch.argsort(torch.argsort(b)).float()
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = (ra.norm() * rb.norm()).item()
    return float((ra @ rb).item() / denom) if denom > 0 else float("nan")


def profile_half(compressor, layers, pools, batches, source, generator) -> tuple[list, list | None, list | None, float]:
    """Mean gradient, curvature and the gradient's standard error per layer over ``batches``; seconds per batch."""
    grads = [torch.zeros(layer.rank) for layer in layers]
    curvatures = [torch.zeros(layer.rank) for layer in layers]
    variances = [torch.zeros(layer.rank) for layer in layers]
    start = time.perf_counter()
    for batch in batches:
        with evaluation_mode(compressor.model):
            result = source.profile(compressor.model, layers, pools, batch, answer_token_loss, generator)
        for g, r in zip(grads, result.grads):
            g += r.cpu() / len(batches)
        if result.curvatures is not None:
            for c, r in zip(curvatures, result.curvatures):
                c += r.cpu() / len(batches)
        if result.grad_squares is not None:
            for v, r in zip(variances, result.grad_squares):
                v += r.cpu() / len(batches) ** 2  # variance of the mean over the batches
    seconds = (time.perf_counter() - start) / len(batches)
    se = [v.sqrt() for v in variances] if result.grad_squares is not None else None
    return grads, (curvatures if result.curvatures is not None else None), se, seconds


def compare(sigmas, pools, half_a, half_b, score: str, gradient_z: float = 0.0) -> dict:
    """Spearman of the pool ranking between the halves (median over layers), and the terms' shape."""
    corr, negative, ratio, kept = [], [], [], []
    s = SCORES[score]
    for i, (sigma, pool) in enumerate(zip(sigmas, pools)):
        if pool.numel() < 3:
            continue
        scores = []
        for grads, curvatures, se in (half_a, half_b):
            c = curvatures[i] if curvatures is not None and s.needs_curvature else None
            e = se[i] if se is not None else None
            scores.append(s(sigma, grads[i], c, grad_se=e, gradient_z=gradient_z)[pool] if s.needs_gradient
                          else s(sigma)[pool])
        corr.append(spearman(*scores))
        negative.append(float((scores[0] < 0).float().mean()))
        if s.needs_curvature:
            se_a = half_a[2][i] if half_a[2] is not None else None
            terms = s.terms(sigma, half_a[0][i], half_a[1][i], grad_se=se_a, gradient_z=gradient_z)
            full = -sigma * half_a[0][i]  # the untested first-order term
            ratio.append(float((terms["curvature"][pool].abs() / full[pool].abs().clamp(min=1e-30)).median()))
            kept.append(float((terms["gradient"][pool] != 0).float().mean()))
    return {"spearman_median": statistics.median(corr), "negative_share_median": statistics.median(negative),
            "curvature_over_gradient_median": statistics.median(ratio) if ratio else None,
            "significant_gradient_median": statistics.median(kept) if kept else None, "layers": len(corr)}


def training_step_seconds(compressor, batches) -> float:
    start = time.perf_counter()
    for batch in batches:
        compressor._train_step(batch, 1)
    return (time.perf_counter() - start) / len(batches)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model spec (the task-fine-tuned model, ideally)")
    p.add_argument("--preset", default="default", help="configuration whose bases, pools and budget are used")
    p.add_argument("--batches-per-half", type=int, default=None,
                   help="profiling batches per half (default: the preset's per round)")
    p.add_argument("--curvatures", default="fisher,mc-fisher,hutchinson")
    p.add_argument("--probe-scope", default=None, help="hutchinson scope (default: the preset's)")
    p.add_argument("--probes", type=int, default=1, help="hutchinson probes per batch")
    p.add_argument("--gradient-z", type=float, default=None,
                   help="bsi rows: also with this significance test of the gradient (default: the preset's)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    first = open_first_round(args.model, args.preset)
    config, compressor, model = first.config, first.compressor, first.compressor.model
    comp = config.compress
    per_half = args.batches_per_half or comp.profiling_iters
    if args.gradient_z is None:
        args.gradient_z = comp.gradient_z
    profiling = real_batches(first.tokenizer, config.batch_size, config.max_length, 4 * per_half + 2, seed=123)
    layers, pools = first.layers, first.pools
    sigmas = [layer.sigma.detach().float().clone() for layer in layers]
    print(f"{len(layers)} layers ({comp.bases} bases), {sum(p.numel() for p in pools):,} pool bases of "
          f"{sum(layer.rank for layer in layers):,}; {per_half} batch(es) per half", file=sys.stderr)

    rows = []
    train_seconds = None
    for name in [c.strip() for c in args.curvatures.split(",") if c.strip()]:
        source = curvature_source(name, eps=compressor.eps, scope=args.probe_scope or comp.hutchinson.probe_scope,
                                  method=comp.hutchinson.hessian_method, probes=args.probes)
        generator = torch.Generator().manual_seed(0)
        half_a = profile_half(compressor, layers, pools, profiling[:per_half], source, generator)
        half_b = profile_half(compressor, layers, pools, profiling[per_half:2 * per_half], source, generator)
        for score in ("bsi", "bsi-grad", "basel"):
            if not SCORES[score].needs_curvature and name != "fisher":
                continue  # curvature-free scores: once is enough
            for z in ((0.0, args.gradient_z) if SCORES[score].tests_gradient and args.gradient_z > 0 else (0.0,)):
                row = {"score": score, "curvature": name if SCORES[score].needs_curvature else "-",
                       "gradient_z": z if SCORES[score].tests_gradient else None,
                       **compare(sigmas, pools, half_a[:3], half_b[:3], score, z),
                       "profile_seconds": (half_a[3] + half_b[3]) / 2}
                rows.append(row)
        print(f"  {name} done ({row['profile_seconds']:.1f} s per batch)", file=sys.stderr, flush=True)
    gradient_only = GradientOnly()
    start = time.perf_counter()
    for batch in profiling[2 * per_half: 3 * per_half]:
        with evaluation_mode(model):
            gradient_only.profile(model, layers, pools, batch, answer_token_loss, None)
    gradient_seconds = (time.perf_counter() - start) / per_half
    train_seconds = training_step_seconds(compressor, profiling[3 * per_half: 4 * per_half])
    for row in rows:
        if row["score"] == "bsi-grad":
            row["profile_seconds"] = gradient_seconds
        if row["score"] == "basel":
            row["profile_seconds"] = 0.0
        row["profile_over_train_step"] = row["profile_seconds"] / train_seconds

    print(f"\nProfiling budget: {per_half} batch(es) of {config.batch_size} per half; training step "
          f"{train_seconds:.2f} s.\n")
    print("| score | curvature | gradient z | Spearman A vs B (median over layers) | negative share | "
          "curvature term / gradient term | first-order terms kept | profiling batch / training step |\n"
          "|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = "-" if r["curvature_over_gradient_median"] is None else f"{r['curvature_over_gradient_median']:.3g}"
        kept = "-" if r.get("significant_gradient_median") is None else f"{r['significant_gradient_median']:.0%}"
        z = "-" if r["gradient_z"] is None else f"{r['gradient_z']:g}"
        print(f"| {r['score']} | {r['curvature']} | {z} | {r['spearman_median']:.2f} | {r['negative_share_median']:.0%} | "
              f"{ratio} | {kept} | {r['profile_over_train_step']:.2f}x |")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "args": vars(args),
                                               "compress": comp.to_dict(), "rows": rows,
                                               "train_step_seconds": train_seconds}, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
