"""Perplexity with and without the context token a model was trained to start from (Gemma's ``<bos>``).

    python bench/context_token.py --model gemma3-270m --windows 16 --json runs/context-token.json

Measures the dense model on the text task's held-out stream (WikiText-2's
``test.txt`` by default) twice, the same first ``--windows`` windows of
``--window`` tokens: as bsi scores it now (:func:`bsi.data.text.context_token`
in front of every window, which then holds ``window - 1`` tokens of the
stream) and as it did before, windows of the stream alone, whose first token
is context only. Prints both with their protocols; both are deterministic
(no sampling), one run each.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's bsi first

from bsi.data import WIKITEXT_2, load_text_task
from bsi.files import atomic_write_json
from bsi.models import load_model_and_tokenizer
from bsi.pipeline.perplexity import measure_perplexity, model_context


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--data", default=WIKITEXT_2)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--windows", type=int, default=16, help="windows scored, from the start of the stream")
    parser.add_argument("--json", help="write the two results here")
    args = parser.parse_args(argv)
    model, tokenizer = load_model_and_tokenizer(args.model)
    task = load_text_task(args.data, tokenizer, window=args.window, max_context=model_context(model))
    print(f"{args.model}: context token {task.context_token} ({tokenizer.bos_token!r} when not None)")
    results = {}
    for name, token in (("with the context token", task.context_token), ("stream alone", None)):
        result = measure_perplexity(model, task.held_out_tokens, window=args.window, max_windows=args.windows,
                                    batch_size=4, source=task.held_out_source, context_token=token)
        results[name] = result.to_dict(per_window=False)
        print(f"{name}: {result.summary_line()}")
    if args.json:
        atomic_write_json(args.json, {"model": args.model, "data": args.data, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
