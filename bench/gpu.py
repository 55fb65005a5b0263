"""GPU benchmark: a Llama-2-7B-shaped model (random weights, bf16) in Basel form on one CUDA GPU.

    python bench/gpu.py                       # 7B shape, batch 4 x 512, gradient checkpointing
    python bench/gpu.py --layers 4 --json bench/gpu-small.json   # a quick check on a shallower model
    python bench/gpu.py --sections e2e svd --json $OUT/e2e.json  # the engine end to end, stage by stage (issue 43)
    python bench/gpu.py --sections e2e svd --shape tiny --device cpu --json /tmp/e2e.json   # its CPU dry run

Nothing is downloaded: the model is built from a config with random weights,
directly on the GPU in bf16. The bases (U, V) are bf16, sigma fp32; the loss
runs under bf16 autocast; gradient checkpointing is on (the finite-difference
estimator needs first-order gradients only, so it works through checkpointing).

Reports, with the device named:

* ``train``: seconds per training step and per profiling step (model scope,
  exact and averaged centre gradient), their ratio, training tokens/s, and
  peak GPU memory after conversion, training and profiling. Needs about 40 GB
  for the full 7B shape.
* ``throughput``: training tokens/s of the Basel form at full rank and with
  half of every layer's bases removed, each against dense fine-tuning (all
  bf16 parameters, AdamW) timed interleaved with it, on a shallower model of
  the same width (``--throughput-layers``, 8 by default: dense AdamW on the
  whole 7B shape does not fit one 80 GB GPU).
* ``inference``: greedy generation tokens/s of the original model against the
  same shape with every linear layer (lm_head included: it is untied in
  Llama-2) exported as a :class:`~bsi.method.layers.LowRankLinear` holding 1/2 and 1/4
  of the dense parameters, at batch 1 and a larger batch, timed interleaved.
  The factors are random (only their shapes matter for speed), so no SVD is
  needed. Peaks at about 35 GB (three models held at once).
* ``e2e``: the engine from start to export on the 7B shape in bf16, as
  ``bsi compress`` runs it (Fisher curvature, the tuned defaults, SVD bases
  unless ``--bases whitened``), each stage timed with its peak GPU memory
  (the peak is reset before each stage): building the model, conversion to
  the Basel form, two pruning rounds (the whole run: half the linear layers' parameters after
  the second, so the export holds low-rank factors),
  ``--recover-steps`` recovery steps of the exported factors (AdamW), the
  export (``write_model_files``, as the pipeline saves) and its reload, whose logits must match the
  model in memory (``reload_max_logit_diff``). ``--budget`` seconds bound it:
  stages past the budget are not started, and the JSON file is rewritten
  after every stage.
* ``svd``: the conversion's factorisation alone, per distinct weight shape
  of the model: seconds per matrix of ``torch.linalg.svd`` in float32 one at
  a time (what the conversion does now), batched over the layers of one
  shape, with each CUDA driver (``gesvd``, ``gesvdj``, ``gesvda``), and in
  float64, each with its relative reconstruction error: what a conversion
  under 60 s could use.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # this checkout's bsi first
from common import interleave

from bsi.config import CompressConfig, HutchinsonConfig, SizeRule
from bsi.files import atomic_write_json
from bsi.method.bases import thin_svd
from bsi.method.curvature import profile_batch
from bsi.method.engine import Compressor
from bsi.method.layers import LowRankLinear
from bsi.method.surgery import model_parameters, to_exported_form
from bsi.models import enable_checkpointing
from bsi.pipeline.export import load_compressed, write_model_files
from bsi.pipeline.stages import recovery_parameters
from bsi.pipeline.training import finetune
from bsi.reports import RoundReport

SECTIONS = ("train", "throughput", "inference", "e2e", "svd")
#: the sections that run on any device (--device); the others need CUDA
ANY_DEVICE = ("e2e", "svd")
#: model shapes: Llama-2-7B's, and a tiny one with the same structure for a CPU dry run
SHAPES = {"7b": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
                 "num_key_value_heads": 32, "max_position_embeddings": 4096},
          "tiny": {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 160, "num_attention_heads": 4,
                   "num_key_value_heads": 4, "max_position_embeddings": 256}}


def llama2_7b_config(layers: int, shape: str = "7b") -> LlamaConfig:
    return LlamaConfig(**SHAPES[shape], num_hidden_layers=layers, tie_word_embeddings=False,
                       attn_implementation="sdpa")


def lm_loss(model, batch):
    """Next-token cross-entropy under bf16 autocast (fp32 logits for the loss)."""
    ids = batch["input_ids"]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1]  # (B, T-1, V)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


class NextTokenLoss:
    """Next-token cross-entropy on ``device`` under bf16 autocast; counts its terms (the Fisher curvature needs it)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __call__(self, model, batch):
        ids = batch["input_ids"]
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            logits = model(input_ids=ids, use_cache=False).logits[:, :-1]  # (B, T-1, V)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))

    @staticmethod
    def count(batch) -> int:
        ids = batch["input_ids"]
        return ids.shape[0] * (ids.shape[1] - 1)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def synchronized(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def random_llama(layers: int, shape: str = "7b", device: str = "cuda") -> LlamaForCausalLM:
    """A Llama-2-7B-shaped model (or ``shape``) with random weights, built directly on ``device`` in bf16."""
    with torch.device(device):
        torch.set_default_dtype(torch.bfloat16)
        try:
            return LlamaForCausalLM(llama2_7b_config(layers, shape))
        finally:
            torch.set_default_dtype(torch.float32)


def random_low_rank_llama(layers: int, ratio: float) -> LlamaForCausalLM:
    """The same architecture with every linear layer a random ``LowRankLinear``.

    Each layer keeps ``k = in*out / (ratio * (in + out))`` ranks, i.e. ``1/ratio``
    of its dense parameters; the embedding stays dense. Only shapes matter for speed.
    """
    model = random_llama(layers)
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear):
            k = max(1, int(module.in_features * module.out_features / (ratio * (module.in_features + module.out_features))))
            low = LowRankLinear(module.in_features, module.out_features, k, module.bias is not None,
                                dtype=torch.bfloat16, device="cuda")
            with torch.no_grad():
                low.A.normal_(std=k ** -0.5)
                low.B.normal_(std=module.in_features ** -0.5)
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent), attr, low)
    torch.cuda.empty_cache()
    return model.eval()


def bench_inference(args) -> dict:
    """Generation tokens/s of 2x and 4x low-rank exports against the dense original, interleaved."""
    torch.manual_seed(0)
    models = {"original": random_llama(args.layers).eval(),
              "compressed_2x": random_low_rank_llama(args.layers, 2.0),
              "compressed_4x": random_low_rank_llama(args.layers, 4.0)}
    sizes = {n: model_parameters(m) for n, m in models.items()}
    out: dict = {"params": sizes, "new_tokens": args.gen_tokens, "prompt_tokens": 32, "cache": args.cache,
                 "batches": {}}
    for batch_size in args.gen_batches:
        ids = torch.randint(3, 32000, (batch_size, 32), device="cuda")

        def gen(model):
            def run(i):
                with torch.inference_mode():
                    model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                   max_new_tokens=args.gen_tokens, min_new_tokens=args.gen_tokens, pad_token_id=0,
                                   cache_implementation=args.cache)
                torch.cuda.synchronize()
            return run

        t = interleave({n: gen(m) for n, m in models.items()}, args.repeats)
        tps = {n: batch_size * args.gen_tokens / t.median(n) for n in models}
        out["batches"][str(batch_size)] = {
            "tokens_per_s": tps, "speedup_vs_original": {n: v / tps["original"] for n, v in tps.items()},
            "runs_s": t.to_dict(),
        }
    out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    del models
    torch.cuda.empty_cache()
    return out


def bench_train(args) -> dict:
    """Training and profiling steps of the Basel-form model (bf16 bases, fp32 sigma, checkpointing)."""
    device = torch.device("cuda")
    torch.manual_seed(0)
    start = time.perf_counter()
    model = random_llama(args.layers)
    enable_checkpointing(model)
    build_s = time.perf_counter() - start
    dense_params = sum(p.numel() for p in model.parameters())
    gen = torch.Generator(device="cpu").manual_seed(1)

    def batches():
        while True:
            yield {"input_ids": torch.randint(0, 32000, (args.batch_size, args.seq_len), generator=gen).to(device)}

    stream = batches()
    start = time.perf_counter()
    config = CompressConfig(size=SizeRule.keep(0.5), rounds=4, iters_per_epoch=40, aux_rank=8, bases="svd",
                            curvature="hutchinson", hutchinson=HutchinsonConfig(probe_scope="model"))
    compressor = Compressor(model, stream, config, lm_loss, compute_dtype=torch.bfloat16)
    for _ in compressor.convert():
        pass
    convert_s = time.perf_counter() - start
    torch.cuda.reset_peak_memory_stats()
    memory = {"after_conversion_gib": torch.cuda.memory_allocated() / 2**30}
    stats = compressor._open_round()
    layers = [compressor.layers[n] for n in compressor.names]
    pools = [stats[n].pool for n in compressor.names]
    probe_gen = torch.Generator().manual_seed(0)
    times: dict[str, list[float]] = {"train_step": [], "profile_model_fd": [], "profile_model_fd_avg_center": []}
    for i in range(args.repeats + 1):  # the first round warms up (kernels, optimizer state)
        batch = next(stream)
        run = {
            "train_step": lambda: compressor._train_step(batch, 1),
            "profile_model_fd": lambda: profile_batch(model, layers, pools, batch, lm_loss, eps=compressor.eps,
                                                      scope="model", generator=probe_gen),
            "profile_model_fd_avg_center": lambda: profile_batch(model, layers, pools, batch, lm_loss,
                                                                 eps=compressor.eps, scope="model",
                                                                 generator=probe_gen, center="average"),
        }
        for name, fn in run.items():
            seconds = synchronized(fn)
            if i:
                times[name].append(seconds)
    memory["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    med = {n: statistics.median(v) for n, v in times.items()}
    tokens = args.batch_size * args.seq_len
    result = {
        "dense_params": dense_params, "batch": [args.batch_size, args.seq_len], "eps": compressor.eps,
        "build_s": build_s, "convert_s": convert_s, "median_s": med,
        "profile_over_train": {n: med[n] / med["train_step"] for n in med if n != "train_step"},
        "train_tokens_per_s": tokens / med["train_step"], "memory": memory, "runs_s": times,
    }
    compressor = model = layers = stats = None  # freed before empty_cache (the closures above keep the names)
    torch.cuda.empty_cache()
    return result


def dense_train_step(model: LlamaForCausalLM):
    """One dense fine-tuning step: every parameter trained, clipping, AdamW (bf16 states)."""
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-5)

    def step(batch: dict) -> None:
        model.train()
        lm_loss(model, batch).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def bench_throughput(args) -> dict:
    """Basel-form training steps (full rank, then 50% pruned) against dense fine-tuning, interleaved."""
    torch.manual_seed(0)
    batch = {"input_ids": torch.randint(0, 32000, (args.batch_size, args.seq_len), device="cuda")}
    dense = random_llama(args.throughput_layers)
    basel = random_llama(args.throughput_layers)
    for model in (dense, basel):
        enable_checkpointing(model)
    dense_step = dense_train_step(dense)
    config = CompressConfig(size=SizeRule.keep(0.5), rounds=4, iters_per_epoch=40, aux_rank=8, bases="svd")
    compressor = Compressor(basel, iter(()), config, lm_loss, compute_dtype=torch.bfloat16)
    for _ in compressor.convert():
        pass

    def pair() -> dict:
        t = interleave({"dense_finetune": lambda i: synchronized(lambda: dense_step(batch)),
                        "basel": lambda i: synchronized(lambda: compressor._train_step(batch, 1))}, args.repeats)
        return {"dense_s": t.median("dense_finetune"), "basel_s": t.median("basel"),
                "ratio_vs_dense": t.median("dense_finetune") / t.median("basel")}

    full = pair()
    for layer in compressor.layers.values():
        layer.keep(torch.arange(layer.rank // 2))
    compressor.optimizer = compressor._make_optimizer()
    half = pair()
    tokens = args.batch_size * args.seq_len
    result = {"layers": args.throughput_layers, "batch": [args.batch_size, args.seq_len],
              "tokens_per_s": {"dense_finetune": tokens / full["dense_s"], "basel_full_rank": tokens / full["basel_s"],
                               "basel_50pct_pruned": tokens / half["basel_s"]},
              "ratio_vs_dense": {"basel_full_rank": full["ratio_vs_dense"], "basel_50pct_pruned": half["ratio_vs_dense"]},
              "pairs": {"full_rank": full, "pruned_50pct": half},
              "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
    compressor = basel = dense = dense_step = None  # freed before empty_cache (the closures above keep the names)
    torch.cuda.empty_cache()
    return result


def bench_e2e(args, progress=lambda result: None) -> dict:
    """The engine from the random model to its export, stage by stage: seconds and peak memory of each."""
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    vocab = SHAPES[args.shape]["vocab_size"]
    gen = torch.Generator().manual_seed(1)

    def batches():
        while True:
            yield {"input_ids": torch.randint(0, vocab, (args.batch_size, args.seq_len), generator=gen).to(device)}

    stream = batches()
    loss = NextTokenLoss(device)
    deadline = args.deadline
    result: dict = {"shape": f"{args.shape}, {args.layers} layers", "dtype": "bfloat16", "device": str(device),
                    "batch": [args.batch_size, args.seq_len], "bases": args.bases, "stages": {}, "order": []}
    state: dict = {}

    def stage(name: str, fn) -> None:
        if time.monotonic() > deadline:
            result["stages"][name] = {"note": "not run: the budget was spent"}
            result["order"].append(name)
            progress(result)
            return
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        sync(device)
        start = time.perf_counter()
        note = fn()
        sync(device)
        entry = {"seconds": time.perf_counter() - start, "note": note or ""}
        result["order"].append(name)
        if cuda:
            entry |= {"peak_gib": torch.cuda.max_memory_allocated(device) / 2**30,
                      "allocated_after_gib": torch.cuda.memory_allocated(device) / 2**30}
        result["stages"][name] = entry
        print(json.dumps({name: entry}), flush=True)
        progress(result)

    def build():
        state["model"] = random_llama(args.layers, args.shape, args.device)
        enable_checkpointing(state["model"])
        result["dense_params"] = model_parameters(state["model"])
        return f"{result['dense_params'] / 1e6:,.1f} M parameters"

    def convert():
        config = CompressConfig(size=SizeRule.target(0.5), rounds=2, iters_per_epoch=2 * args.round_length, sampling_ratio=0.25,
                                aux_rank=8, bases=args.bases, calibration_batches=args.calibration_batches)
        state["compressor"] = Compressor(state["model"], stream, config, loss, compute_dtype=torch.bfloat16)
        for _ in state["compressor"].convert():
            pass
        return f"{len(state['compressor'].layers)} layers, {args.bases} bases"

    def one_round():
        for report in state["rounds"]:
            if isinstance(report, RoundReport):
                return (f"removed {report.removed} bases; compressible layers at {report.compressible_ratio:.3f}; "
                        f"monitor loss {report.loss_before:.3f} -> {report.loss_after:.3f}")
        return "the run ended"

    def recover():
        model = state["model"]
        del state["rounds"], state["compressor"]
        state["table"] = to_exported_form(model)
        params = recovery_parameters(model)
        for p in model.parameters():
            p.requires_grad_(False)
        for p in params:
            p.requires_grad_(True)
        steps = list(finetune(model, stream, steps=args.recover_steps, lr=1e-5, stage="recover", parameters=params,
                              loss_fn=loss))
        result["params_after"] = model_parameters(model)
        return f"{args.recover_steps} steps, loss {steps[0].loss:.3f} -> {steps[-1].loss:.3f}" if steps else "0 steps"

    def export():
        state["folder"] = Path(tempfile.mkdtemp(prefix="bsi-e2e-")) / "model"
        state["folder"].mkdir()
        write_model_files(state["model"], None, state["folder"], {"method": "bsi", "source_model": "random"},
                          table=state["table"])
        size = sum(f.stat().st_size for f in state["folder"].iterdir())
        result["bytes_on_disk"] = size
        return f"{size / 2**20:,.1f} MiB written"

    def reload():
        ids = next(stream)["input_ids"][:1]
        model = state["model"].eval()
        with torch.no_grad():
            before = model(input_ids=ids, use_cache=False).logits.float()
        del state["model"], model
        if cuda:
            torch.cuda.empty_cache()
        loaded, _ = load_compressed(state["folder"], device=str(device))
        with torch.no_grad():
            after = loaded(input_ids=ids, use_cache=False).logits.float()
        result["reload_max_logit_diff"] = float((after - before).abs().max())
        del loaded
        return f"max |logit difference| {result['reload_max_logit_diff']:.3g}"

    try:
        stage("build", build)
        stage("conversion", convert)
        if "compressor" in state:
            state["rounds"] = state["compressor"].run()
        for number in (1, 2):
            stage(f"round_{number}", one_round if "rounds" in state else lambda: "no conversion")
        for name, fn in (("recovery", recover), ("export", export), ("reload", reload)):
            stage(name, fn if "model" in state or name == "reload" and "folder" in state else lambda: "skipped")
    finally:
        if "folder" in state:
            shutil.rmtree(state["folder"].parent, ignore_errors=True)
        state.clear()
        if cuda:
            torch.cuda.empty_cache()
    return result


def bench_svd(args, deadline: float) -> dict:
    """Seconds per matrix and relative reconstruction error of the conversion's SVD, several ways, per weight shape.

    Each way is warmed up on one matrix, then timed on ``--svd-batch`` of the
    same shape; ways left when the budget is spent are not run.
    """
    device = torch.device(args.device)
    config = llama2_7b_config(args.layers, args.shape)
    h, m = config.hidden_size, config.intermediate_size
    shapes = {"attention (h x h)": (h, h), "mlp up/gate (m x h)": (m, h), "mlp down (h x m)": (h, m)}
    batch = max(1, min(args.svd_batch, args.layers))
    gen = torch.Generator().manual_seed(0)
    out: dict = {"device": str(device), "batch": batch, "shapes": {}}

    def error(w, u, s, vh) -> float:
        return float(torch.linalg.matrix_norm((u * s.unsqueeze(-2)) @ vh - w).max() / torch.linalg.matrix_norm(w).max())

    ways = {"float32, one at a time": lambda x: [torch.linalg.svd(w, full_matrices=False) for w in x],
            "float32, batched": lambda x: torch.linalg.svd(x, full_matrices=False),
            "float64, one at a time": lambda x: [torch.linalg.svd(w.double(), full_matrices=False) for w in x],
            "bsi's thin_svd, one at a time": lambda x: [thin_svd(w) for w in x]}  # what the conversion runs
    if device.type == "cuda":
        for driver in ("gesvd", "gesvdj", "gesvda"):
            ways[f"float32, batched, {driver}"] = lambda x, d=driver: torch.linalg.svd(x, full_matrices=False, driver=d)
    for name, (rows, cols) in shapes.items():
        weights = (torch.randn(batch, rows, cols, generator=gen) * 0.02).to(device)  # (b, out, in) fp32
        rows_out = {}
        for way, fn in ways.items():
            if time.monotonic() > deadline:
                rows_out[way] = {"error": "not run: the budget was spent"}
                continue
            try:
                fn(weights[:1])  # warm-up (kernels, workspace)
                sync(device)
                start = time.perf_counter()
                got = fn(weights)
                sync(device)
                seconds = (time.perf_counter() - start) / batch
            except RuntimeError as err:  # a driver that refuses the shape
                rows_out[way] = {"error": str(err).splitlines()[0][:200]}
                continue
            u, s, vh = (torch.stack(t) for t in zip(*got)) if isinstance(got, list) else got
            rows_out[way] = {"seconds_per_matrix": seconds, "relative_error": error(weights.to(u.dtype), u, s, vh)}
            del got, u, s, vh
        out["shapes"][name] = {"shape": [rows, cols], "per_model": config.num_hidden_layers, "ways": rows_out}
        print(json.dumps({name: rows_out}), flush=True)
        del weights
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--throughput-layers", type=int, default=8, help="decoder layers of the throughput model")
    p.add_argument("--gen-tokens", type=int, default=64, help="new tokens per generation (inference)")
    p.add_argument("--gen-batches", type=int, nargs="+", default=[1, 16], help="generation batch sizes (inference)")
    p.add_argument("--cache", choices=["dynamic", "static"], default="dynamic",
                   help="KV cache of generate (inference); 'static' lets transformers compile the decoding "
                        "step into CUDA graphs, removing the per-kernel launch cost that dominates at batch 1")
    p.add_argument("--device", default="cuda", help="device of the e2e and svd sections (default: cuda)")
    p.add_argument("--shape", choices=list(SHAPES), default="7b", help="model shape of the e2e and svd sections")
    p.add_argument("--bases", choices=("svd", "whitened"), default="svd", help="bases of the e2e section")
    p.add_argument("--calibration-batches", type=int, default=4, help="e2e, whitened bases: calibration batches")
    p.add_argument("--round-length", type=int, default=4, help="e2e: iterations per round (1 profiling)")
    p.add_argument("--recover-steps", type=int, default=8, help="e2e: recovery steps")
    p.add_argument("--svd-batch", type=int, default=4, help="svd: matrices of one shape factorised per timing")
    p.add_argument("--budget", type=float, default=540.0,
                   help="e2e and svd: seconds from the start after which no stage or way starts (default: 540)")
    p.add_argument("--json", default="bench/gpu-results.json")
    args = p.parse_args(argv)
    args.deadline = time.monotonic() + args.budget
    needs_cuda = [s for s in args.sections if s not in ANY_DEVICE] or args.device.startswith("cuda")
    if needs_cuda and not torch.cuda.is_available():
        print("bench/gpu.py needs a CUDA GPU; none is available here (the sections e2e and svd also run with "
              "--device cpu --shape tiny)", file=sys.stderr)
        return 2
    result: dict = {"kind": "gpu", "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                    "torch": torch.__version__, "layers": args.layers}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)

    def save(section: str, value: dict) -> None:  # after every section (and every e2e stage): partial results stay
        result[section] = value
        atomic_write_json(args.json, result)

    for section in args.sections:
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        if section == "e2e":
            save(section, bench_e2e(args, progress=lambda r: save("e2e", r)))
        else:
            save(section, bench_svd(args, args.deadline) if section == "svd" else
                 {"train": bench_train, "throughput": bench_throughput, "inference": bench_inference}[section](args))
        print(json.dumps({section: result[section]}, indent=2), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
