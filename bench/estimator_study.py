"""How good is BSI's Hessian-diagonal estimator, really? (issue 4)

On the embedded model, restricted to a few layers and their top-k sigmas
(where the exact Hessian diagonal is affordable: k second-order backward
passes per layer, :func:`bsi.analysis.spectrum.hessian_blocks`), this script measures
on one fixed mini-batch:

1. **error vs probes and vs wall time** of the four estimator modes of
   :func:`bsi.method.curvature.profile_batch`: probe scope ``model`` (one joint probe)
   or ``layer`` (one probe per layer), Hessian-vector products by finite
   differences (``fd``, at the rule's eps) or exact double backward (``hvp``).
   The error is ``||estimate - exact|| / ||exact||`` over the probed sigmas,
   averaged over disjoint groups of single-probe estimates
   (:func:`bsi.method.theory.relative_error_by_probes`). The wall time of an
   ``s``-probe estimate is ``base + s * per_probe``, from the measured time of
   single-probe calls and of one plain gradient (the part every mode shares,
   except ``hvp``/``model``, which gets its gradient for free);
2. **bias vs eps** of finite differences, in fp32 and bf16: for the *same*
   probe ``z``, the fd estimate ``z * (g+ - g-) / eps`` against the exact
   ``z * (H z)`` of the fp32 model, so that only the finite-difference (and
   rounding) error is left, not the Hutchinson variance. The bf16 model is the
   fp32 one cast to bf16 on CPU (bases ``U``, ``V`` in bf16, ``sigma`` kept in
   fp32 as the engine does);
3. **the output layer's Hessian diagonal is non-negative** (METHOD sec. 7):
   the embedded model ties its head to the embedding, so a copy is *untied*
   (the embedding matrix cloned into a separate ``lm_head`` weight) and the
   exact diagonal of its sigma-Hessian is computed at evenly spaced ranks.

Run from the repository root (about 10 minutes on one CPU core with the defaults)::

    PYTHONPATH=. python bench/estimator_study.py --out runs/estimator_study

It writes ``estimator_study.json`` and ``estimator_study.html`` and prints the
conclusion: the mode with the lowest error at equal wall time.
"""

from __future__ import annotations

import argparse
import copy
import math
import time
from pathlib import Path

import torch
from torch import nn

from bsi.analysis.spectrum import hessian_blocks, prepare_layers, top_positions
from bsi.data import BatchStream, load_task
from bsi.errors import BSIError
from bsi.files import atomic_write_json, atomic_write_text
from bsi.method.curvature import evaluation_mode, hessian_vector_product, profile_batch, shifted_sigma, sigma_gradients
from bsi.method.scores import eps_rule, rademacher, symmetric_difference_hessian
from bsi.method.surgery import tied_output_names
from bsi.method.theory import relative_error_by_probes
from bsi.models import load_model_and_tokenizer
from bsi.pipeline.losses import answer_token_loss

MODES = (("fd", "model"), ("fd", "layer"), ("hvp", "model"), ("hvp", "layer"))
DEFAULT_LAYERS = ("model.layers.16.self_attn.v_proj", "model.layers.22.mlp.down_proj", "model.layers.28.self_attn.o_proj")


def model_sigma_max(model: nn.Module) -> float:
    """Largest singular value over every compressible linear layer (the eps rule's scale)."""
    tied = tied_output_names(model)
    return max(
        float(torch.linalg.matrix_norm(m.weight.detach().float(), ord=2))
        for n, m in model.named_modules() if isinstance(m, nn.Linear) and n not in tied
    )


def probe_errors(model, layers, positions, batch, exact, eps, probes, seed) -> dict:
    """Single-probe estimates of every mode, their errors by probe count, and their timing."""
    with evaluation_mode(model):
        start = time.perf_counter()
        for _ in range(2):
            sigma_gradients(model, layers, batch, answer_token_loss)
        t_grad = (time.perf_counter() - start) / 2
    counts = [s for s in (1, 2, 4, 8, 16, 32, 64) if s <= probes]
    out = {"gradient_seconds": t_grad, "modes": {}}
    for method, scope in MODES:
        singles, times = [], []
        for p in range(probes):
            start = time.perf_counter()
            result = profile_batch(model, layers, positions, batch, answer_token_loss, eps=eps, scope=scope,
                                   method=method, probes=1, generator=torch.Generator().manual_seed(seed + p))
            times.append(time.perf_counter() - start)
            if result is None:
                raise BSIError(f"non-finite estimate in mode {method}/{scope}")
            singles.append(torch.cat([h[pos] for h, pos in zip(result.hessians, positions)]))
        errors = relative_error_by_probes(torch.stack(singles), exact, counts)
        call = sum(times) / len(times)
        base = 0.0 if (method, scope) == ("hvp", "model") else min(t_grad, call)
        per_probe = call - base
        constant = sum(e * math.sqrt(s) for s, e in errors.items()) / len(errors)  # error ~ constant / sqrt(s)
        out["modes"][f"{method}/{scope}"] = {
            "method": method, "scope": scope, "errors": errors, "call_seconds": call, "base_seconds": base,
            "probe_seconds": per_probe, "seconds": {s: base + s * per_probe for s in counts},
            "error_constant": constant, "efficiency": constant * math.sqrt(per_probe),
        }
        print(f"  {method}/{scope}: error {errors[counts[0]]:.3f} (1 probe) -> {errors[counts[-1]]:.3f} "
              f"({counts[-1]} probes); {per_probe:.2f} s/probe + {base:.2f} s", flush=True)
    return out


def fd_bias(model, layers, positions, batch, reference_model, reference_layers, eps_values, probes, seed) -> list[dict]:
    """Relative deviation of fd estimates from the exact ``z * (H z)`` (fp32 reference) for the same probes."""
    rows = []
    zs_all = []
    g = torch.Generator().manual_seed(seed)
    for _ in range(probes):
        zs = []
        for layer, pos in zip(layers, positions):
            z = torch.zeros(layer.rank)
            z[pos] = rademacher(pos.numel(), g)
            zs.append(z)
        zs_all.append(zs)
    with evaluation_mode(reference_model):
        exact = []
        for zs in zs_all:
            _, _, hv = hessian_vector_product(reference_model, reference_layers, batch, answer_token_loss, zs)
            exact.append(torch.cat([(h * z)[pos] for h, z, pos in zip(hv, zs, positions)]))
    with evaluation_mode(model):
        for eps in eps_values:
            deviations = []
            for zs, ref in zip(zs_all, exact):
                with shifted_sigma(layers, [0.5 * eps * z for z in zs]):
                    _, plus = sigma_gradients(model, layers, batch, answer_token_loss)
                with shifted_sigma(layers, [-0.5 * eps * z for z in zs]):
                    _, minus = sigma_gradients(model, layers, batch, answer_token_loss)
                est = torch.cat([symmetric_difference_hessian(gp, gm, z, eps)[pos]
                                 for gp, gm, z, pos in zip(plus, minus, zs, positions)])
                deviations.append(float((est - ref).norm() / ref.norm()))
            rows.append({"eps": eps, "relative_deviation": sum(deviations) / len(deviations)})
            print(f"  eps {eps:.3g}: relative deviation {rows[-1]['relative_deviation']:.3g}", flush=True)
    return rows


def untie_output_layer(model: nn.Module) -> nn.Module:
    """Give a tied-head model its own ``lm_head`` matrix (a clone of the embedding), in place."""
    head = model.get_output_embeddings()
    untied = nn.Linear(head.in_features, head.out_features, bias=False, dtype=head.weight.dtype)
    with torch.no_grad():
        untied.weight.copy_(model.get_input_embeddings().weight)
    model.config.tie_word_embeddings = False
    model.set_output_embeddings(untied)
    if "lm_head" in tied_output_names(model):
        raise BSIError("untying the output layer failed")
    return model


def output_layer_check(model: nn.Module, batch: dict, count: int) -> dict:
    """Exact Hessian diagonal of the (untied) lm_head's sigmas at ``count`` evenly spaced ranks."""
    (layer,) = prepare_layers(model, ["lm_head"])
    order = top_positions(layer.sigma, layer.rank)
    positions = order[torch.linspace(0, layer.rank - 1, count).round().long()]
    with evaluation_mode(model):
        _, (block,) = hessian_blocks(model, [layer], [positions], batch, answer_token_loss)
    diag = torch.diagonal(block)
    return {"ranks": layer.rank, "positions": positions.tolist(), "diagonal": diag.tolist(),
            "min": float(diag.min()), "max": float(diag.max()), "negative": int((diag < 0).sum()), "checked": count}


def figure(report: dict):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=3, subplot_titles=(
        "relative error vs probes", "relative error vs wall time (one batch)", "fd deviation from exact z*(Hz) vs eps"))
    colors = {"fd/model": "#1f77b4", "fd/layer": "#ff7f0e", "hvp/model": "#2ca02c", "hvp/layer": "#d62728"}
    for name, mode in report["estimation"]["modes"].items():
        s = sorted(int(k) for k in mode["errors"])
        err = [mode["errors"][k] for k in s]
        secs = [mode["seconds"][k] for k in s]
        style = dict(mode="markers+lines", line=dict(color=colors[name]), legendgroup=name)
        fig.add_trace(go.Scatter(x=s, y=err, name=name, **style), row=1, col=1)
        fig.add_trace(go.Scatter(x=secs, y=err, name=name, showlegend=False, **style), row=1, col=2)
    best = min(report["estimation"]["modes"].values(), key=lambda m: m["error_constant"])
    s_max = max(int(k) for k in best["errors"])
    ideal = [best["error_constant"] / math.sqrt(s) for s in range(1, s_max + 1)]
    fig.add_trace(go.Scatter(x=list(range(1, s_max + 1)), y=ideal, name="c / sqrt(probes)", mode="lines",
                             line=dict(dash="dot", color="gray")), row=1, col=1)
    for dtype, rows, color in (("fp32", report["bias"]["fp32"], "#9467bd"), ("bf16", report["bias"]["bf16"], "#8c564b")):
        fig.add_trace(go.Scatter(x=[r["eps"] for r in rows], y=[r["relative_deviation"] for r in rows],
                                 name=f"fd {dtype}", mode="markers+lines", line=dict(color=color)), row=1, col=3)
        rule = report["bias"][f"eps_rule_{dtype}"]
        fig.add_vline(x=rule, line=dict(dash="dash", color=color), row=1, col=3)
    for col in (1, 2, 3):
        fig.update_yaxes(type="log", row=1, col=col)
        fig.update_xaxes(type="log", row=1, col=col)
    fig.update_xaxes(title_text="probes", row=1, col=1)
    fig.update_xaxes(title_text="seconds", row=1, col=2)
    fig.update_xaxes(title_text="eps (dashed: the rule's eps)", row=1, col=3)
    fig.update_yaxes(title_text="||estimate - exact|| / ||exact||", row=1, col=1)
    fig.update_layout(title=f"Hessian-diagonal estimator on {report['model']}: {len(report['layers'])} layers, "
                            f"top-{report['top_k']} sigmas each", height=520)
    return fig


def conclusion(report: dict) -> str:
    modes = report["estimation"]["modes"]
    ranked = sorted(modes, key=lambda m: modes[m]["efficiency"])
    best = modes[ranked[0]]
    lines = ["Modes ranked by error at equal wall time (error * sqrt(seconds per probe), lower is better):"]
    for name in ranked:
        m = modes[name]
        lines.append(f"  {name:10s} error ~ {m['error_constant']:.3f}/sqrt(probes), {m['probe_seconds']:.2f} s/probe, "
                     f"score {m['efficiency']:.3f}")
    fp32 = {r["eps"]: r["relative_deviation"] for r in report["bias"]["fp32"]}
    bf16 = {r["eps"]: r["relative_deviation"] for r in report["bias"]["bf16"]}
    rule32, rule16 = report["bias"]["eps_rule_fp32"], report["bias"]["eps_rule_bf16"]
    lines.append(f"Best: {ranked[0]} (method {best['method']}, scope {best['scope']}).")
    lines.append(f"fd deviation from exact HVP at the rule's eps: fp32 {fp32.get(rule32, math.nan):.2g} "
                 f"(eps {rule32:.2g}), bf16 {bf16.get(rule16, math.nan):.2g} (eps {rule16:.2g}).")
    head = report["output_layer"]
    lines.append(f"Untied lm_head: exact Hessian diagonal at {head['checked']} of {head['ranks']} ranks: "
                 f"min {head['min']:.3g}, max {head['max']:.3g}, {head['negative']} negative.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--data", default="embedded-math")
    parser.add_argument("--layers", nargs="+", default=list(DEFAULT_LAYERS))
    parser.add_argument("--top-k", type=int, default=32, help="sigmas per layer with an exact diagonal")
    parser.add_argument("--probes", type=int, default=8, help="single-probe estimates per mode")
    parser.add_argument("--bias-probes", type=int, default=2, help="probes per eps in the bias sweep")
    parser.add_argument("--head-ranks", type=int, default=48, help="lm_head ranks whose diagonal is checked")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/estimator_study")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()

    task = load_task(args.data, test_size=0, train_size=64, seed=args.seed)
    model, tokenizer = load_model_and_tokenizer(args.model, dtype=torch.float32, attn_implementation="eager")
    batch = next(BatchStream(task.train, tokenizer, batch_size=args.batch_size, max_length=args.max_length,
                             seed=args.seed))
    sigma_max = model_sigma_max(model)
    layers = prepare_layers(model, args.layers)
    positions = [top_positions(layer.sigma, args.top_k) for layer in layers]
    eps32, eps16 = eps_rule(sigma_max, torch.float32), eps_rule(sigma_max, torch.bfloat16)
    report: dict = {"model": args.model, "data": args.data, "layers": args.layers, "top_k": args.top_k,
                    "batch_tokens": list(batch["input_ids"].shape), "sigma_max": sigma_max, "threads": args.threads}

    print(f"exact diagonal: {len(layers)} layers x top-{args.top_k} ...", flush=True)
    t0 = time.perf_counter()
    with evaluation_mode(model):
        loss, blocks = hessian_blocks(model, layers, positions, batch, answer_token_loss)
    exact = torch.cat([torch.diagonal(b) for b in blocks]).float()
    report["exact"] = {"seconds": time.perf_counter() - t0, "loss": loss, "diagonal": exact.tolist(),
                       "negative_share": float((exact < 0).double().mean())}
    print(f"  {report['exact']['seconds']:.0f} s; {100 * report['exact']['negative_share']:.0f}% of the diagonal "
          f"is negative", flush=True)

    print(f"estimator modes, {args.probes} single-probe estimates each (fd at eps {eps32:.3g}) ...", flush=True)
    report["estimation"] = probe_errors(model, layers, positions, batch, exact, eps32, args.probes, args.seed)

    print("finite-difference bias vs eps ...", flush=True)
    eps_fp32 = sorted({1e-5, 1e-4, eps32, 1e-3, 1e-2, 1e-1})
    eps_bf16 = sorted({1e-3, 1e-2, eps16, 0.3})
    low = copy.deepcopy(model).to(torch.bfloat16)
    low_layers = prepare_layers(low, args.layers)
    for fp32_layer, layer in zip(layers, low_layers):
        layer.sigma.data = fp32_layer.sigma.data.float().clone()  # sigma stays fp32, as in the engine
    report["bias"] = {"eps_rule_fp32": eps32, "eps_rule_bf16": eps16}
    report["bias"]["fp32"] = fd_bias(model, layers, positions, batch, model, layers, eps_fp32, args.bias_probes, args.seed)
    print("  (bf16)", flush=True)
    report["bias"]["bf16"] = fd_bias(low, low_layers, positions, batch, model, layers, eps_bf16, args.bias_probes, args.seed)
    del low, low_layers

    print(f"output layer (untied copy): exact diagonal at {args.head_ranks} ranks ...", flush=True)
    del model, layers
    head_model, _ = load_model_and_tokenizer(args.model, dtype=torch.float32, attn_implementation="eager")
    untie_output_layer(head_model)
    report["output_layer"] = output_layer_check(head_model, batch, args.head_ranks)
    report["seconds"] = time.perf_counter() - start
    report["conclusion"] = conclusion(report)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "estimator_study.json", report)
    atomic_write_text(out / "estimator_study.html", figure(report).to_html(include_plotlyjs=True, full_html=True))
    print(report["conclusion"])
    print(f"wrote {out}/estimator_study.json and estimator_study.html ({report['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
