"""How much of each score's ranking of the candidate pool is signal, and how much is probe noise?

    python bench/importance_noise.py --model $BSI_CACHE/finetuned/<hash> --target-ratio 0.25

Opens round 1 of a target-size compression (the candidate pools exactly as the
engine builds and widens them), then, on ``--batches`` real mini-batches of the
embedded task, takes the exact gradient with respect to sigma and ``--probes``
model-scope finite-difference Hessian probes per batch (the engine's default
estimator). The batches are split into two independent halves A and B (A:
even batches, B: odd ones, each with its own probes). Each score is computed
from each half, and the Spearman correlation of the pool's importance between
A and B (per layer, median over layers) says how reproducible its ranking
is: 1 is pure signal, 0 pure noise. Only the ranking inside a pool matters to
the pruning rule, so this is what decides which bases go.

Also printed, per score and probe count: the share of pool bases whose
importance is negative (the mass rule prunes those first), and the median
ratio |Hessian term| / |gradient term|. With ``--layer-scope N``, N layers
are probed one at a time as well (METHOD's per-layer probes: no cross-layer
terms in the estimate), to show how much of the noise comes from the other
layers' bases in a joint probe.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # this checkout's bsi first
from common import real_batches  # noqa: E402

from bsi.config import CompressConfig  # noqa: E402
from bsi.method.engine import Compressor  # noqa: E402
from bsi.method.curvature import evaluation_mode, profile_batch, sigma_gradients  # noqa: E402
from bsi.pipeline.losses import answer_token_loss  # noqa: E402
from bsi.method.scores import importance_scores  # noqa: E402
from bsi.models import load_model_and_tokenizer  # noqa: E402


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Rank correlation of two (n,) vectors (ties broken by position)."""
    ra = torch.argsort(torch.argsort(a)).float()
    rb = torch.argsort(torch.argsort(b)).float()
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = (ra.norm() * rb.norm()).item()
    return float((ra @ rb).item() / denom) if denom > 0 else float("nan")


def half_statistics(grads: list[list[torch.Tensor]], hessians: list[list[list[torch.Tensor]]],
                    batches: list[int], probes: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Mean gradient and Hessian diagonal per layer over ``batches``, using the first ``probes`` probes of each."""
    layers = len(grads[0])
    g = [torch.stack([grads[b][i] for b in batches]).mean(0) for i in range(layers)]
    h = [torch.stack([hessians[b][p][i] for b in batches for p in range(probes)]).mean(0) for i in range(layers)]
    return g, h


def compare_halves(sigmas, pools, grads, hessians, probes: int, score: str, per_half: int | None = None) -> dict:
    """Spearman A-vs-B per layer, negative share and term ratio for one score, probe and batch count.

    Half A takes the even batches, half B the odd ones; ``per_half`` limits each to its first ones.
    """
    n = len(grads)
    per_half = per_half or n // 2
    halves = [half_statistics(grads, hessians, list(range(start, n, 2))[:per_half], probes) for start in (0, 1)]
    corr, negative, ratio = [], [], []
    for i, (sigma, pool) in enumerate(zip(sigmas, pools)):
        if pool.numel() < 3:
            continue
        scores = [importance_scores(sigma, g[i], h[i], score)[pool] for g, h in halves]
        corr.append(spearman(*scores))
        negative.append(float((scores[0] < 0).float().mean()))
        grad_term = (sigma[pool] * halves[0][0][i][pool]).abs()
        hess_term = (0.5 * sigma[pool].square() * halves[0][1][i][pool]).abs()
        ratio.append(float((hess_term / grad_term.clamp(min=1e-30)).median()))
    return {"score": score, "probes_per_batch": probes, "batches_per_half": per_half, "layers": len(corr),
            "spearman_median": statistics.median(corr), "negative_share_median": statistics.median(negative),
            "hessian_over_gradient_term_median": statistics.median(ratio)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model spec (the task-fine-tuned model, ideally)")
    p.add_argument("--target-ratio", type=float, default=0.25)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batches", type=int, default=16, help="even number: half A and half B")
    p.add_argument("--probes", type=int, default=1, help="model-scope probes per batch")
    p.add_argument("--layer-scope", type=int, default=0, help="layers also probed one at a time")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-length", type=int, default=160)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)
    if args.batches < 2 or args.batches % 2:
        p.error("--batches must be an even number >= 2")

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model_and_tokenizer(args.model, dtype=torch.float32)
    batches = real_batches(tokenizer, args.batch_size, args.max_length, args.batches, seed=123)
    config = CompressConfig(target_ratio=args.target_ratio, keep_ratio=None, rounds=args.rounds,
                            iters_per_epoch=8 * args.rounds)
    compressor = Compressor(model, iter(()), config, answer_token_loss)
    stats = compressor._open_round()
    names = compressor.names
    layers = [compressor.layers[n] for n in names]
    pools = [stats[n].pool for n in names]
    sigmas = [layer.sigma.detach().float().clone() for layer in layers]
    generator = torch.Generator().manual_seed(0)
    print(f"{len(layers)} layers, {sum(p.numel() for p in pools):,} pool bases of "
          f"{sum(layer.rank for layer in layers):,}; eps {compressor.eps:.3g}", file=sys.stderr)

    grads, hessians = [], []
    for b, batch in enumerate(batches):
        with evaluation_mode(model):
            _, g = sigma_gradients(model, layers, batch, answer_token_loss)
        grads.append([x.detach().clone() for x in g])
        per_probe = []
        for _ in range(args.probes):
            result = profile_batch(model, layers, pools, batch, answer_token_loss, eps=compressor.eps,
                                   scope="model", generator=generator)
            per_probe.append([h.clone() for h in result.hessians])
        hessians.append(per_probe)
        print(f"  batch {b + 1}/{len(batches)} done", file=sys.stderr, flush=True)

    half = args.batches // 2
    counts = sorted({min(2 ** i, half) for i in range(half.bit_length() + 1)})  # 1, 2, 4, ... batches per half
    rows = [compare_halves(sigmas, pools, grads, hessians, 1, "bsi-grad", k) for k in counts]
    rows += [compare_halves(sigmas, pools, grads, hessians, 1, "bsi", k) for k in counts]
    rows += [compare_halves(sigmas, pools, grads, hessians, k, "bsi") for k in range(2, args.probes + 1)]

    layer_rows = []
    if args.layer_scope:
        step = max(1, len(layers) // args.layer_scope)
        picked = [i for i in range(step // 2, len(layers), step) if pools[i].numel() >= 3][: args.layer_scope]
        for i in picked:
            single = []
            for batch in batches:
                per_probe = []
                for _ in range(args.probes):
                    r = profile_batch(model, [layers[i]], [pools[i]], batch, answer_token_loss, eps=compressor.eps,
                                      scope="layer", generator=generator)
                    per_probe.append([r.hessians[0].clone()])
                single.append(per_probe)
            joint = [[[probe[i]] for probe in batch_probes] for batch_probes in hessians]
            g_single = [[g[i]] for g in grads]
            for label, h in (("model scope", joint), ("layer scope", single)):
                row = compare_halves([sigmas[i]], [pools[i]], g_single, h, args.probes, "bsi")
                layer_rows.append({"layer": names[i], "probe": label, **row})
            print(f"  layer {names[i]} done", file=sys.stderr, flush=True)

    print("| score | batches per half | probes per batch | Spearman A vs B (median over layers) | "
          "negative share | abs(Hessian term) / abs(gradient term) |\n|---|---|---|---|---|---|")
    for r in rows:
        probes = "-" if r["score"] == "bsi-grad" else r["probes_per_batch"]
        print(f"| {r['score']} | {r['batches_per_half']} | {probes} | {r['spearman_median']:.2f} | "
              f"{r['negative_share_median']:.0%} | {r['hessian_over_gradient_term_median']:.3g} |")
    if layer_rows:
        print("\n| layer | probe | Spearman A vs B (bsi) | negative share |\n|---|---|---|---|")
        for r in layer_rows:
            print(f"| {r['layer']} | {r['probe']} | {r['spearman_median']:.2f} | {r['negative_share_median']:.0%} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "args": vars(args), "rows": rows,
                                               "layer_rows": layer_rows}, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
