"""Per-process memory of the Basel form with FSDP on 2 CPU processes, against 1 process.

    python bench/fsdp_memory.py                 # prints a table and the ratios
    python bench/fsdp_memory.py --layers 2 --hidden 512 --json out.json

A Llama built from a config (hidden 1024, MLP 2816, 4 blocks, fp32: 51 M
parameters in its linear layers, 196 MiB dense, 310 MiB in the Basel form at full rank) goes
through the pipeline's pruning stage with ``fsdp=True``, once under torchrun
with 1 process (FSDP does nothing there) and once with 2 (gloo). Each
process reports:

* ``basel_mib``: the bytes of parameters and buffers it holds (its shards
  only, for sharded tensors) once the Basel form is complete, at full rank:
  the memory the Basel form costs; the figure the 0.6x target is about;
* ``peak_held_mib``: the largest such count at the stage's start and its
  reports (the start holds the whole dense model, which every process loads);
* ``rss_start_mib``, ``peak_rss_mib``, ``rss_growth_mib``: the resident
  memory of the process when the stage starts (the Python, torch and
  transformers runtime, the data, the dense model), its peak during the stage
  (``VmHWM``, reset at the start) and the difference. On CPU these say little
  about the model: the allocator keeps freed pages, and the working memory
  that is not sharded (calibration statistics, float64 factorisations,
  gather buffers) is several times the model here.

The ratio printed is 2-process / 1-process, per process (rank 0).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import machine, peak_rss_mib

MIB = 2**20


def build_model(folder: Path, layers: int, hidden: int, intermediate: int) -> None:
    """Save a random Llama of this shape, with the tiny model's byte tokenizer, into ``folder``."""
    import torch
    from transformers import AutoModelForCausalLM

    from bsi.models import build_tiny_tokenizer, tiny_config

    tokenizer = build_tiny_tokenizer()
    config = tiny_config(tokenizer)
    config.update({"hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers,
                   "num_attention_heads": hidden // 64, "num_key_value_heads": hidden // 64, "head_dim": 64})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def held_bytes(model) -> int:
    """Bytes of the parameters and buffers this process holds (the local shard of a sharded one), each once."""
    from bsi.pipeline.fsdp import local_tensor

    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        local = local_tensor(t)
        seen[id(t)] = local.numel() * local.element_size()
    return sum(seen.values())


def reset_peak_rss() -> float:
    """Start ``VmHWM`` afresh from the current resident size (Linux: ``5`` into ``clear_refs``); that size in MiB."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return peak_rss_mib()


def worker(model_dir: str, out: str, bases: str) -> None:
    """One process of the measurement: the pruning stage with fsdp on, memory sampled at every report."""
    import torch

    torch.set_num_threads(1)
    from bsi.config import make_config
    from bsi.method.surgery import basis_layers, compressible_linear_names
    from bsi.pipeline.runner import Pipeline

    config = make_config("smoke", {
        "model": model_dir, "fsdp": True, "skip_finetune": True, "eval_examples": 0, "batch_size": 2,
        "max_length": 48, "compress": {"bases": bases, "rounds": 1, "iters_per_epoch": 2, "sampling_ratio": 0.5,
                                       "calibration_batches": 1, "target_ratio": 0.6},
        "recover": {"steps": 0}})
    pipeline = Pipeline(config)
    for _ in pipeline.reference_stage():
        pass
    dense = held_bytes(pipeline.model)
    rss_start = reset_peak_rss()
    basel, peak = 0, dense  # the stage starts from the whole dense model, on every process
    for _ in pipeline.compress():
        held = held_bytes(pipeline.model)
        peak = max(peak, held)
        if not basel and basis_layers(pipeline.model) and not compressible_linear_names(pipeline.model):
            basel = held  # the first report after the conversion: the whole Basel form, at full rank
    rss = peak_rss_mib()
    pipeline.unshard()
    with open(out, "w") as f:
        json.dump({"world": pipeline.dist.world_size, "rank": pipeline.dist.rank, "dense_mib": dense / MIB,
                   "basel_mib": basel / MIB, "peak_held_mib": peak / MIB, "rss_start_mib": rss_start,
                   "peak_rss_mib": rss, "rss_growth_mib": rss - rss_start}, f)


def launch(processes: int, model_dir: Path, folder: Path, bases: str) -> list[dict]:
    """Run the worker under torchrun with ``processes`` CPU processes; their reports by rank."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", BSI_CACHE=str(folder / "cache"))
    outs = [folder / f"w{processes}-rank{r}.json" for r in range(processes)]
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
                    __file__, "--bases", bases, "--worker", str(model_dir), str(folder / f"w{processes}-rank{{rank}}.json")],
                   env=env, check=True)
    return [json.loads(p.read_text()) for p in outs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=2816)
    parser.add_argument("--bases", default="whitened", choices=("whitened", "svd"),
                        help="bases of the Basel form (whitened: the default, with its calibration statistics)")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        model_dir, pattern = args.worker
        worker(model_dir, pattern.format(rank=os.environ.get("RANK", "0")), args.bases)
        return
    with tempfile.TemporaryDirectory(prefix="bsi-fsdp-memory-") as tmp:
        folder = Path(tmp)
        build_model(folder / "model", args.layers, args.hidden, args.intermediate)
        one, two = (launch(n, folder / "model", folder, args.bases) for n in (1, 2))
    keys = ("dense_mib", "basel_mib", "peak_held_mib", "rss_start_mib", "peak_rss_mib", "rss_growth_mib")
    print(f"model: Llama {args.layers} blocks, hidden {args.hidden}, MLP {args.intermediate}, fp32, {args.bases} bases; "
          f"{machine()}")
    print("| per process | 1 process | 2 processes (rank 0) | 2 processes (rank 1) | ratio (rank 0) |")
    print("|---|---|---|---|---|")
    for key in keys:
        print(f"| {key} | {one[0][key]:.1f} | {two[0][key]:.1f} | {two[1][key]:.1f} | {two[0][key] / one[0][key]:.2f}x |")
    ratio = two[0]["basel_mib"] / one[0]["basel_mib"]
    print(f"Basel form held per process, 2 processes / 1: {ratio:.2f}x (target <= 0.6x)")
    if args.json:
        Path(args.json).write_text(json.dumps({"one": one, "two": two, "ratio": ratio}, indent=1))


if __name__ == "__main__":
    main()
