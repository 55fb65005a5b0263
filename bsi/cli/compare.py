"""``bsi compare``: the command line of :mod:`bsi.analysis.compare`."""

from __future__ import annotations

import argparse

from bsi.errors import BSIError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", required=True, help="comma-separated: model names, folders or bsi output folders")
    p.add_argument("--prompts", required=True, help=".jsonl (question/prompt field) or text file, one prompt a line")
    p.add_argument("--out", help="folder for compare.md and compare.json (default: print only)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="new-token budget of every answer")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    p.add_argument("--dtype", default="auto", help="auto (bfloat16 on CUDA, float32 on CPU) | float32 | bfloat16 | float16")


def run(args: argparse.Namespace) -> int:
    from bsi.analysis.compare import compare_models, comparison_markdown, read_prompts
    from bsi.files import atomic_write_json, atomic_write_text, check_output_dir

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models:
        raise BSIError("--models must name at least one model")
    if args.max_new_tokens < 1:
        raise BSIError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    prompts = read_prompts(args.prompts)
    out = check_output_dir(args.out) if args.out else None
    result = compare_models(models, prompts, max_new_tokens=args.max_new_tokens, device=args.device, dtype=args.dtype)
    table = comparison_markdown(result)
    if out is not None:
        atomic_write_json(out / "compare.json", result)
        atomic_write_text(out / "compare.md", table)
    print(table)
    return 0
