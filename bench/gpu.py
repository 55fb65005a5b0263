"""GPU benchmark: a Llama-2-7B-shaped model (random weights, bf16) in Basel form on one CUDA GPU.

    python bench/gpu.py                       # 7B shape, batch 4 x 512, gradient checkpointing
    python bench/gpu.py --layers 4 --json bench/gpu-small.json   # a quick check on a shallower model

Nothing is downloaded: the model is built from a config with random weights,
directly on the GPU in bf16. The bases (U, V) are bf16, sigma fp32; the loss
runs under bf16 autocast; gradient checkpointing is on (the finite-difference
estimator needs first-order gradients only, so it works through checkpointing).

Reports, with the device named: seconds per training step and per profiling
step (model scope, exact and averaged centre gradient), their ratio,
training tokens/s, and peak GPU memory after conversion, training and
profiling. Needs a CUDA GPU with about 40 GB for the full 7B shape.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.nn import functional as F
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's bsi first

from bsi.config import CompressConfig
from bsi.engine import Compressor
from bsi.estimator import profile_batch


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default="bench/gpu-results.json")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench/gpu.py needs a CUDA GPU; none is available here", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    device = torch.device("cuda")
    start = time.perf_counter()
    with device:
        torch.set_default_dtype(torch.bfloat16)
        model = LlamaForCausalLM(llama2_7b_config(args.layers))
        torch.set_default_dtype(torch.float32)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    build_s = time.perf_counter() - start
    dense_params = sum(p.numel() for p in model.parameters())
    gen = torch.Generator(device="cpu").manual_seed(1)

    def batches():
        while True:
            yield {"input_ids": torch.randint(0, 32000, (args.batch_size, args.seq_len), generator=gen).to(device)}

    stream = batches()
    start = time.perf_counter()
    config = CompressConfig(keep_ratio=0.5, rounds=4, iters_per_epoch=40, aux_rank=8)
    compressor = Compressor(model, stream, config, lm_loss, compute_dtype=torch.bfloat16)
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
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "layers": args.layers,
        "dense_params": dense_params, "batch": [args.batch_size, args.seq_len], "eps": compressor.eps,
        "build_s": build_s, "convert_s": convert_s, "median_s": med,
        "profile_over_train": {n: med[n] / med["train_step"] for n in med if n != "train_step"},
        "train_tokens_per_s": tokens / med["train_step"], "memory": memory, "runs_s": times,
    }
    print(json.dumps(result, indent=2))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
