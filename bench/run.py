"""Benchmarks of bsi on the embedded model: one command, ratios measured side by side.

    python bench/run.py                      # every section, prints a table and writes JSON
    python bench/run.py --sections profiling throughput --repeats 5
    python bench/run.py --preset-run         # also time `bsi compress --preset default` end to end

Sections (each ratio's baseline is timed in the same run, interleaved with it):

* ``profiling``: one profiling iteration (gradient + Hessian-diagonal estimate
  over the candidate pools) / one training step of the same Basel-form model,
  for probe scope ``model`` (finite differences), ``model`` with the averaged
  centre gradient, ``layer`` (extrapolated from evenly spaced sampled layers)
  and the exact Hessian-vector product (``hvp``, eager attention).
* ``throughput``: training-step tokens/s of the Basel-form model at full rank
  and after 50% of each layer's bases are pruned, against dense fine-tuning
  and against rebuilding the dense weight from the bases at each forward.
* ``inference``: greedy generation tokens/s of models exported at 2x and 4x
  compression of the compressible layers, against the original.
* ``memory``: peak resident memory of a compression run against dense
  fine-tuning, each in its own subprocess (``VmHWM``, the peak RSS of its own address space).
* ``preset``: wall time of the ``default`` preset, estimated from the measured
  step costs (and measured end to end with ``--preset-run``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # this checkout's bsi first
from common import interleave, load_embedded, machine, peak_rss_mib, real_batches, tokens_in

from bsi.config import CompressConfig, HutchinsonConfig, SizeRule, make_config
from bsi.method.curvature import profile_batch
from bsi.method.engine import Compressor
from bsi.method.layers import BasisLinear
from bsi.method.surgery import basis_layers, compressible_parameters, model_parameters, to_basis_form, to_exported_form
from bsi.pipeline.losses import answer_token_loss

SECTIONS = ("profiling", "throughput", "inference", "memory", "preset")


# ------------------------------------------------------------------ helpers
def basel_model(dense: nn.Module, aux_rank: int = 8) -> tuple[nn.Module, Compressor, list[dict]]:
    """A Basel-form copy of ``dense`` with a Compressor (optimizer, pools) around it."""
    import copy

    model = copy.deepcopy(dense)
    config = CompressConfig(aux_rank=aux_rank, size=SizeRule.keep(0.6), rounds=4, iters_per_epoch=48,
                            bases="svd", curvature="hutchinson", hutchinson=HutchinsonConfig(probe_scope="model"))
    compressor = Compressor(model, iter(()), config, answer_token_loss)
    for _ in compressor.convert():  # plain SVD bases: no calibration batches needed
        pass
    return model, compressor, []


def train_step(compressor: Compressor, batch: dict) -> None:
    compressor._train_step(batch, 1)  # the engine's own training step (forward, backward, AdamW)


class RebuildLinear(nn.Module):
    """The prior method's layer: rebuild ``W = U diag(sigma) V^T + U_aux V_aux^T`` at every forward.

    Shares its tensors with a `BasisLinear`; used only to compare throughput.
    """

    def __init__(self, layer: BasisLinear) -> None:
        super().__init__()
        self.U, self.V, self.bias = layer.U, layer.V, layer.bias
        self.sigma, self.aux_u, self.aux_v = layer.sigma, layer.aux_u, layer.aux_v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = (self.U * self.sigma.to(self.U.dtype)) @ self.V.T  # (out, in)
        if self.aux_u.shape[1]:
            weight = weight + self.aux_u @ self.aux_v.T
        return F.linear(x, weight, self.bias)


def swap_layers(model: nn.Module, make) -> None:
    for name, layer in list(basis_layers(model).items()):
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, make(layer))


def dense_step_fn(model: nn.Module):
    """One step of dense fine-tuning as bsi.pipeline.training does it: loss, backward, clip, AdamW."""
    params = [p for p in model.parameters()]
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(params, lr=1e-5)

    def step(batch: dict) -> None:
        model.train()
        loss = answer_token_loss(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


# --------------------------------------------------------------- sections
def bench_profiling(dense, batches, repeats: int, layer_samples: int) -> dict:
    model, compressor, _ = basel_model(dense)
    stats = compressor._open_round()
    layers = [compressor.layers[n] for n in compressor.names]
    pools = [stats[n].pool for n in compressor.names]
    gen = torch.Generator().manual_seed(0)
    n_layers = len(layers)
    step = max(1, n_layers // layer_samples)
    sampled = list(range(step // 2, n_layers, step))[:layer_samples]
    sampled_pools = [p if i in sampled else p[:0] for i, p in enumerate(pools)]

    def prof(scope, method="fd", center="exact", pools_=pools):
        def run(i):
            kwargs = {"center": center} if center != "exact" else {}
            return profile_batch(model, layers, pools_, batches[i % len(batches)], answer_token_loss,
                                 eps=compressor.eps, scope=scope, method=method, generator=gen, **kwargs)
        return run

    variants = {
        "train_step": lambda i: train_step(compressor, batches[i % len(batches)]),
        "profile_model_fd": prof("model"),
        "profile_layer_fd_sampled": prof("layer", pools_=sampled_pools),
        "grad_only": lambda i: profile_batch(model, layers, [p[:0] for p in pools], batches[i % len(batches)],
                                             answer_token_loss, eps=compressor.eps, scope="layer", generator=gen),
    }
    if _supports_center():
        variants["profile_model_fd_avg_center"] = prof("model", center="average")
    t = interleave(variants, repeats)
    # Exact HVP needs eager attention: time it (with its own train-step baseline) after switching.
    model.set_attn_implementation("eager")
    t_hvp = interleave({
        "train_step_eager": lambda i: train_step(compressor, batches[i % len(batches)]),
        "profile_model_hvp": prof("model", method="hvp"),
    }, max(1, repeats - 1), warmup=0)
    model.set_attn_implementation("sdpa")
    train = t.median("train_step")
    per_layer = (t.median("profile_layer_fd_sampled") - t.median("grad_only")) / len(sampled)
    layer_total = t.median("grad_only") + per_layer * n_layers
    ratios = {
        "model_fd": t.median("profile_model_fd") / train,
        "layer_fd_extrapolated": layer_total / train,
        "hvp_model_eager": t_hvp.median("profile_model_hvp") / t_hvp.median("train_step_eager"),
    }
    if "profile_model_fd_avg_center" in t.seconds:
        ratios["model_fd_avg_center"] = t.median("profile_model_fd_avg_center") / train
    return {
        "ratios_over_train_step": ratios,
        "train_step_s": train,
        "layer_scope": {"layers": n_layers, "sampled": len(sampled), "seconds_per_layer_probe": per_layer,
                        "extrapolated_s": layer_total},
        "timings": t.to_dict() | t_hvp.to_dict(),
    }


def _supports_center() -> bool:
    import inspect

    return "center" in inspect.signature(profile_batch).parameters


def bench_throughput(dense, batches, repeats: int) -> dict:
    import copy

    dense_model = copy.deepcopy(dense)
    dense_step = dense_step_fn(dense_model)
    full, full_c, _ = basel_model(dense)
    half, half_c, _ = basel_model(dense)
    for layer in half_c.layers.values():
        keep = torch.arange(layer.rank // 2)
        layer.keep(keep)
    half_c.optimizer = half_c._make_optimizer()
    rebuild, rebuild_c, _ = basel_model(dense)
    swap_layers(rebuild, RebuildLinear)
    pick = lambda i: batches[i % len(batches)]  # noqa: E731
    t = interleave({
        "dense_finetune": lambda i: dense_step(pick(i)),
        "basel_full_rank": lambda i: train_step(full_c, pick(i)),
        "basel_50pct_pruned": lambda i: train_step(half_c, pick(i)),
        "rebuild_dense_weight": lambda i: train_step(rebuild_c, pick(i)),
    }, repeats)
    tokens = sorted(tokens_in(b) for b in batches)[len(batches) // 2]
    tps = {n: tokens / t.median(n) for n in t.seconds}
    base = tps["dense_finetune"]
    return {
        "tokens_per_step_median": tokens,
        "tokens_per_s": tps,
        "ratio_vs_dense": {n: v / base for n, v in tps.items()},
        "timings": t.to_dict(),
    }


def low_rank_copy(dense: nn.Module, ratio: float, aux_rank: int = 8) -> nn.Module:
    """Export ``dense`` with each compressible layer cut to ``1/ratio`` of its parameters (top bases)."""
    import copy

    model = copy.deepcopy(dense)
    to_basis_form(model, aux_rank=aux_rank)
    for layer in basis_layers(model).values():
        k = int(layer.dense_parameters() / (ratio * (layer.in_features + layer.out_features))) - aux_rank
        layer.keep(torch.arange(max(1, min(k, layer.rank))))
    to_exported_form(model)
    return model.eval()


def bench_inference(dense, tokenizer, repeats: int, new_tokens: int, batch_size: int) -> dict:
    from bsi.data import build_prompt, load_task

    task = load_task("embedded-math", test_size=100, seed=0)
    prompts = [build_prompt(tokenizer, e.question) for e in task.test[:batch_size]]
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, add_special_tokens=not tokenizer.chat_template, padding=True, return_tensors="pt")
    models = {"original": dense.eval(), "compressed_2x": low_rank_copy(dense, 2.0), "compressed_4x": low_rank_copy(dense, 4.0)}

    def gen(model):
        def run(i):
            with torch.inference_mode():
                model.generate(**enc, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                               pad_token_id=tokenizer.pad_token_id)
        return run

    t = interleave({n: gen(m) for n, m in models.items()}, repeats)
    tps = {n: batch_size * new_tokens / t.median(n) for n in models}
    sizes = {n: {"params_total": model_parameters(m), "compressible": compressible_parameters(m)[0]} for n, m in models.items()}
    return {
        "batch_size": batch_size, "new_tokens": new_tokens, "tokens_per_s": tps,
        "speedup_vs_original": {n: v / tps["original"] for n, v in tps.items()},
        "sizes": sizes, "timings": t.to_dict(),
    }


def memory_worker(kind: str, batch_size: int, max_length: int, steps: int) -> None:
    """Run in a fresh process: load, do ``kind`` for a few steps, print peak RSS (MiB) as JSON."""
    torch.set_num_threads(2)
    dense, tok = load_embedded()
    batches = real_batches(tok, batch_size, max_length, steps)
    loaded = peak_rss_mib()
    if kind == "dense_finetune":
        step = dense_step_fn(dense)
        for b in batches:
            step(b)
    elif kind == "compress":  # training steps then profiling steps and one pruning, as a round does
        config = CompressConfig(aux_rank=8, size=SizeRule.keep(0.6), rounds=1, iters_per_epoch=steps,
                                sampling_ratio=0.5, bases="svd")
        # the engine also draws a fixed monitor batch, so the steps' batches come round again
        for _ in Compressor(dense, itertools.cycle(batches), config, answer_token_loss).run():
            pass
    peak = peak_rss_mib()
    print(json.dumps({"kind": kind, "peak_mib": peak, "after_load_mib": loaded}))


def bench_memory(batch_size: int, max_length: int, steps: int) -> dict:
    out = {}
    for kind in ("dense_finetune", "compress"):
        proc = subprocess.run(
            [sys.executable, __file__, "--memory-worker", kind, "--batch-size", str(batch_size),
             "--max-length", str(max_length), "--memory-steps", str(steps)],
            capture_output=True, text=True, check=True,
        )
        out[kind] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["ratio_compress_vs_dense_peak"] = out["compress"]["peak_mib"] / out["dense_finetune"]["peak_mib"]
    return out


def estimate_preset(results: dict, batch_size: int, max_length: int) -> dict:
    """Wall time of the ``default`` preset from measured per-step costs (eval excluded unless measured)."""
    cfg = make_config("default")
    c = cfg.compress
    scale = (cfg.batch_size * cfg.max_length) / (batch_size * max_length)  # rough: cost ~ tokens
    thr = results.get("throughput", {}).get("timings", {})
    prof = results.get("profiling", {})
    if not thr or not prof:
        return {"note": "needs the profiling and throughput sections"}
    dense_s = thr["dense_finetune"]["median_s"] * scale
    train_s = thr["basel_full_rank"]["median_s"] * scale
    profile_s = prof["ratios_over_train_step"]["model_fd"] * prof["train_step_s"] * scale
    n_prof = c.profiling_iters * c.rounds
    n_train = c.total_iters - n_prof
    seconds = {
        "finetune": cfg.finetune.steps * dense_s,
        "compress_train": n_train * train_s,
        "compress_profile": n_prof * profile_s,
        "recover": cfg.recover.steps * train_s,
    }
    return {"estimated_s_without_eval_and_load": sum(seconds.values()), "parts_s": seconds,
            "scaled_from_tokens": scale}


def run_preset(out: Path) -> dict:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bsi", "compress", "--preset", "default", "--out", str(out), "--quiet"],
                   check=True)
    wall = time.perf_counter() - start
    summary = json.loads((out / "summary.json").read_text())
    return {"wall_s": wall, "pipeline_s": summary["seconds"], "accuracy_before": (summary["metrics_before"] or {}).get("accuracy"),
            "accuracy_after": (summary["metrics_after"] or {}).get("accuracy"), "compression_ratio": summary["compression_ratio"]}


# -------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per variant (median reported)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--max-length", type=int, default=192)
    p.add_argument("--layer-samples", type=int, default=6, help="layers probed to extrapolate layer scope")
    p.add_argument("--gen-tokens", type=int, default=32)
    p.add_argument("--gen-batch", type=int, default=1)
    p.add_argument("--memory-steps", type=int, default=4)
    p.add_argument("--preset-run", action="store_true",
                   help="also run the default preset end to end (11 min 50 s with the fine-tune cached, 2026-11-25)")
    p.add_argument("--json", default="bench/results.json", help="where to write the JSON results")
    p.add_argument("--memory-worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_worker:
        memory_worker(args.memory_worker, args.batch_size, args.max_length, args.memory_steps)
        return 0
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    results: dict = {"machine": machine(), "args": {k: v for k, v in vars(args).items() if k != "memory_worker"}}
    dense, tok = load_embedded()
    batches = real_batches(tok, args.batch_size, args.max_length, max(4, args.repeats + 1))
    for section in args.sections:
        start = time.perf_counter()
        if section == "profiling":
            results[section] = bench_profiling(dense, batches, args.repeats, args.layer_samples)
        elif section == "throughput":
            results[section] = bench_throughput(dense, batches, args.repeats)
        elif section == "inference":
            results[section] = bench_inference(dense, tok, args.repeats, args.gen_tokens, args.gen_batch)
        elif section == "memory":
            results[section] = bench_memory(args.batch_size, args.max_length, args.memory_steps)
        elif section == "preset":
            results[section] = estimate_preset(results, args.batch_size, args.max_length)
            if args.preset_run:
                with tempfile.TemporaryDirectory() as tmp:
                    results[section]["measured"] = run_preset(Path(tmp) / "run")
        results.setdefault("section_seconds", {})[section] = time.perf_counter() - start
        print(report(section, results[section]), flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2))
    print(f"JSON: {args.json}")
    return 0


def report(section: str, r: dict) -> str:
    """A few readable lines per section."""
    lines = [f"== {section}"]
    if section == "profiling":
        lines.append(f"  train step: {r['train_step_s']:.2f} s")
        lines += [f"  {k:28s} {v:5.2f}x a training step" for k, v in r["ratios_over_train_step"].items()]
    elif section == "throughput":
        lines += [f"  {k:22s} {r['tokens_per_s'][k]:8.1f} tok/s  {v:5.2f}x dense" for k, v in r["ratio_vs_dense"].items()]
    elif section == "inference":
        lines += [f"  {k:14s} {r['tokens_per_s'][k]:7.1f} tok/s  {v:5.2f}x  "
                  f"({r['sizes'][k]['params_total']:,} params)" for k, v in r["speedup_vs_original"].items()]
    elif section == "memory":
        for k in ("dense_finetune", "compress"):
            lines.append(f"  {k:15s} peak {r[k]['peak_mib']:7.0f} MiB (after load {r[k]['after_load_mib']:.0f})")
        lines.append(f"  compress / dense peak: {r['ratio_compress_vs_dense_peak']:.2f}")
    else:
        lines.append("  " + json.dumps(r))
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
