"""GPU benchmark: a Llama-2-7B-shaped model (random weights, bf16) in Basel form on one CUDA GPU.

    python bench/gpu.py                       # 7B shape, batch 4 x 512, gradient checkpointing
    python bench/gpu.py --layers 4 --json bench/gpu-small.json   # a quick check on a shallower model

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
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # this checkout's bsi first
from common import interleave  # noqa: E402

from bsi.config import CompressConfig  # noqa: E402
from bsi.method.engine import Compressor  # noqa: E402
from bsi.method.curvature import profile_batch  # noqa: E402
from bsi.method.layers import LowRankLinear  # noqa: E402
from bsi.method.surgery import model_parameters  # noqa: E402

SECTIONS = ("train", "throughput", "inference")


def llama2_7b_config(layers: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=layers,
        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
        tie_word_embeddings=False, attn_implementation="sdpa",
    )


def lm_loss(model, batch):
    """Next-token cross-entropy under bf16 autocast (fp32 logits for the loss)."""
    ids = batch["input_ids"]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1]  # (B, T-1, V)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def synchronized(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def random_llama(layers: int) -> LlamaForCausalLM:
    """A Llama-2-7B-shaped model with random weights, built directly on the GPU in bf16."""
    with torch.device("cuda"):
        torch.set_default_dtype(torch.bfloat16)
        try:
            return LlamaForCausalLM(llama2_7b_config(layers))
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
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    build_s = time.perf_counter() - start
    dense_params = sum(p.numel() for p in model.parameters())
    gen = torch.Generator(device="cpu").manual_seed(1)

    def batches():
        while True:
            yield {"input_ids": torch.randint(0, 32000, (args.batch_size, args.seq_len), generator=gen).to(device)}

    stream = batches()
    start = time.perf_counter()
    config = CompressConfig(size_mode="keep", keep_ratio=0.5, rounds=4, iters_per_epoch=40, aux_rank=8, bases="svd",
                            curvature="hutchinson", probe_scope="model")
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
    del compressor, model, layers, stats
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
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    dense_step = dense_train_step(dense)
    config = CompressConfig(size_mode="keep", keep_ratio=0.5, rounds=4, iters_per_epoch=40, aux_rank=8, bases="svd")
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
    del compressor, basel, dense, dense_step
    torch.cuda.empty_cache()
    return result


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
    p.add_argument("--json", default="bench/gpu-results.json")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench/gpu.py needs a CUDA GPU; none is available here", file=sys.stderr)
        return 2
    result: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "layers": args.layers}
    for section in args.sections:
        torch.cuda.reset_peak_memory_stats()
        result[section] = {"train": bench_train, "throughput": bench_throughput,
                           "inference": bench_inference}[section](args)
        print(json.dumps({section: result[section]}, indent=2), flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
