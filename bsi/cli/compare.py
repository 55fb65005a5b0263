"""``bsi compare``: the command line of :mod:`bsi.pipeline.compare` (a run folder brings its fine-tuned dense model as the reference) and :mod:`bsi.analysis.compare` (the table)."""

from __future__ import annotations

import argparse

from bsi.cli.flags import add_model_flags
from bsi.errors import BSIError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", required=True, help="comma-separated: model names, folders or bsi output folders")
    p.add_argument("--prompts", required=True, help=".jsonl (question/prompt field, optional answer: '... #### 42' or "
                                                    "'42', marked right/wrong) or text file, one prompt a line")
    p.add_argument("--reference", metavar="RUN", help="a run folder (bsi compress --out) whose fine-tuned dense model "
                                                      "answers first as the reference (default: the first run folder "
                                                      "among --models; none when there is none)")
    p.add_argument("--out", help="folder for compare.md and compare.json (default: print only)")
    add_model_flags(p, {"max_new_tokens": 64, "device": "auto", "dtype": "auto"},
                    helps={"max_new_tokens": "new-token budget of every answer"})


def run(args: argparse.Namespace) -> int:
    from bsi.analysis.compare import comparison_markdown, read_marked_prompts
    from bsi.files import atomic_write_json, atomic_write_text, check_output_dir
    from bsi.models import check_model_spec
    from bsi.pipeline.compare import compare_models, find_reference

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models:
        raise BSIError("--models must name at least one model")
    for spec in models:  # every folder checked before the first model loads
        check_model_spec(spec)
    prompts = read_marked_prompts(args.prompts)
    reference = find_reference(models, args.reference)  # a run's fine-tuned model, checked in the cache, not loaded
    out = check_output_dir(args.out) if args.out else None
    result = compare_models(models, prompts, max_new_tokens=args.max_new_tokens, device=args.device, dtype=args.dtype,
                            reference=reference)
    table = comparison_markdown(result)
    if out is not None:
        atomic_write_json(out / "compare.json", result)
        atomic_write_text(out / "compare.md", table)
    print(table)
    return 0
