"""How much a model loses when every layer drops its smallest singular values.

    python bench/magnitude_drop.py --model DIR --shares 0.13 0.23 0.32 0.5

Re-writes every compressible linear layer in the Basel form (no auxiliary
vectors), then, for each share ``s``, zeroes the smallest ``s`` of each
layer's sigmas (counted in bases, smallest singular values first) and
measures the answer-token loss on the first test examples of the embedded
task. This is what "keep the large singular values" does with no re-training.
Compare it with the ``mean tuning loss`` that ``bsi compress`` prints for the
round after one that removed the same share of bases by importance.

``--model`` is any model spec bsi loads; the task-fine-tuned model of the
``default`` preset is cached under ``$BSI_CACHE/finetuned/<hash>``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's bsi first
from bsi.data import load_task
from bsi.method.surgery import to_basis_form
from bsi.models import load_model_and_tokenizer
from bsi.pipeline.evaluate import dataset_loss


def drop_smallest(sigma: torch.Tensor, share: float) -> torch.Tensor:
    """A copy of ``sigma`` (r,), sorted descending, with its smallest ``round(share * r)`` entries zeroed."""
    out = sigma.detach().clone()
    count = int(round(share * out.numel()))
    if count:
        out[out.numel() - count :] = 0
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model spec (the task-fine-tuned model, ideally)")
    p.add_argument("--shares", type=float, nargs="+", default=[0.13, 0.23, 0.32, 0.5])
    p.add_argument("--examples", type=int, default=32, help="test examples of the embedded task")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model_and_tokenizer(args.model, dtype=torch.float32)
    examples = load_task("embedded-math", test_size=100, seed=0).test[: args.examples]

    def loss() -> float:
        return dataset_loss(model, tokenizer, examples, batch_size=16)

    rows = [{"share": 0.0, "loss": loss()}]
    layers = to_basis_form(model, aux_rank=0)
    singular_values = {name: layer.sigma.detach().clone() for name, layer in layers.items()}
    for share in args.shares:
        with torch.no_grad():
            for name, layer in layers.items():
                layer.sigma.copy_(drop_smallest(singular_values[name], share))
        rows.append({"share": share, "loss": loss()})
    print("| smallest bases dropped per layer | answer-token loss |\n|---|---|")
    for row in rows:
        print(f"| {row['share']:.0%} | {row['loss']:.4f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "rows": rows}, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
