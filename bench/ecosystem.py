"""Low-rank plus int8, and the field's protocol beside bsi's: one script, every figure of docs/ecosystem.md.

    OMP_NUM_THREADS=1 python bench/ecosystem.py --compressed runs/default --out runs/ecosystem
    python bench/ecosystem.py --compressed /tmp/smoke --out /tmp/e --examples 8 --answered 4   # a smoke run: seconds

For four models, measured in the same run:

* **dense**: the fine-tuned model the compressed one started from (the
  run's, from the fine-tune cache, or ``--dense-folder``);
* **dense int8** and **bsi int8**: those two written by
  ``bsi export --model ... --quantize int8`` (optimum-quanto, weights only);
* **bsi**: the compressed folder (``--compressed``).

it reports the weights' bytes on disk, the tensors' bytes in memory, greedy
decode speed (milliseconds per new token after a 64-token prompt, batch 1,
the best of ``--repeats``; ratios against the dense model measured in the
same run), accuracy on the first ``--answered`` test problems and
answer-token loss on ``--examples`` of them, and each int8 model against its
unquantized source with paired bootstrap 95% intervals
(:func:`bsi.analysis.stats.paired_difference`). With ``--articles N`` it
also runs lm-eval's ``bsi_wikitext2`` task on the dense and the compressed
model (word perplexity over the first N WikiText-2 test articles) beside
bsi's own token perplexity (``--windows`` windows of 512 tokens). Writes
``ecosystem.json`` in ``--out`` and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's bsi first
import torch

from bsi.analysis.stats import Outcomes, paired_difference
from bsi.analysis.study import interval_text
from bsi.data import load_task
from bsi.files import atomic_write_json
from bsi.models import load_model_and_tokenizer
from bsi.pipeline.evaluate import evaluate
from bsi.pipeline.export import load_compressed
from bsi.pipeline.quantize import export_quantized, model_bytes, weights_bytes


def load_any(folder: Path):
    """A bsi folder with bsi's loader, an ordinary one with transformers'."""
    if (folder / "bsi_config.json").is_file():
        return load_compressed(folder)
    return load_model_and_tokenizer(str(folder), dtype=torch.float32)


@torch.inference_mode()
def decode_ms_per_token(model, new_tokens: int, repeats: int) -> float:
    """Greedy decode, batch 1, 64-token prompt: the best of ``repeats`` runs, milliseconds per new token."""
    ids = torch.randint(0, min(1000, model.config.vocab_size), (1, 64), generator=torch.Generator().manual_seed(0))
    model.generate(ids, max_new_tokens=2, do_sample=False)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        best = min(best, (time.perf_counter() - start) / new_tokens)
    return 1000 * best


def token_perplexity(model, tokenizer, windows: int) -> dict:
    """bsi's own perplexity on WikiText-2's test split: the first ``windows`` windows of 512 tokens."""
    from bsi.data import read_text_corpus, tokenize_corpus
    from bsi.pipeline.perplexity import text_task_perplexity

    task = tokenize_corpus(read_text_corpus("wikitext-2"), tokenizer, window=512)
    result = text_task_perplexity(model, task, batch_size=4, max_windows=windows)
    return {"perplexity": result.perplexity, "windows": windows, "protocol": result.summary_line()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--compressed", required=True, help="a bsi compressed folder")
    parser.add_argument("--dense-folder", help="the dense fine-tuned folder (default: the run's, from the fine-tune "
                                               "cache)")
    parser.add_argument("--out", required=True, help="folder for the int8 exports and ecosystem.json")
    parser.add_argument("--examples", type=int, default=100, help="test problems scored for the loss")
    parser.add_argument("--answered", type=int, default=100, help="of them, answered for accuracy")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--articles", type=int, default=0, help="lm-eval bsi_wikitext2 articles (0: skip)")
    parser.add_argument("--windows", type=int, default=16, help="bsi token-perplexity windows (0: skip)")
    args = parser.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    compressed = Path(args.compressed)
    if args.dense_folder:
        dense = Path(args.dense_folder).expanduser()
    else:  # the run's own fine-tuned model, from the fine-tune cache
        from bsi.models import ensure_embedded_model
        from bsi.pipeline.compare import run_reference

        reference = run_reference(args.compressed).model
        dense = ensure_embedded_model() if reference in ("embedded", "smollm2-135m-instruct") else Path(reference)
    folders = {"dense": dense, "dense int8": out / "dense-int8", "bsi": compressed, "bsi int8": out / "bsi-int8"}
    for name, source in (("dense int8", dense), ("bsi int8", compressed)):
        start = time.perf_counter()
        export_quantized(source, folders[name], force=True)
        print(f"{name}: exported in {time.perf_counter() - start:.1f} s", flush=True)

    seed = json.loads((compressed / "summary.json").read_text())["config"]["seed"] \
        if (compressed / "summary.json").is_file() else 0
    task = load_task("embedded-math", test_size=args.examples, seed=seed, train_size=1)
    rows, outcomes = {}, {}
    for name, folder in folders.items():
        model, tokenizer = load_any(folder)
        ms = decode_ms_per_token(model, args.new_tokens, args.repeats)
        evaluation = evaluate(model, tokenizer, task.test[: args.examples], answered=args.answered)
        outcomes[name] = Outcomes.from_columns(evaluation.columns())
        rows[name] = {"folder": str(folder), "bytes_on_disk": weights_bytes(folder), "bytes_in_memory": model_bytes(model),
                      "decode_ms_per_token": ms, "accuracy": evaluation.metrics.accuracy,
                      "loss": evaluation.metrics.loss}
        print(f"{name}: {rows[name]}", flush=True)
        del model
    base = rows["dense"]
    for row in rows.values():
        row |= {"disk_ratio": base["bytes_on_disk"] / row["bytes_on_disk"],
                "memory_ratio": base["bytes_in_memory"] / row["bytes_in_memory"],
                "speed_ratio": base["decode_ms_per_token"] / row["decode_ms_per_token"]}
    paired = {f"{q} - {s}": {stat: paired_difference([outcomes[q]], [outcomes[s]], stat).to_dict()
                             for stat in ("accuracy", "loss")}
              for q, s in (("dense int8", "dense"), ("bsi int8", "bsi"), ("bsi", "dense"), ("bsi int8", "dense"))}

    text: dict[str, dict] = {"dense": {}, "bsi": {}}
    for name in text:
        if args.articles:
            from bsi.pipeline.harness import run_lm_eval

            start = time.perf_counter()
            text[name]["lm_eval"] = run_lm_eval(str(folders[name]), ["bsi_wikitext2"], limit=args.articles).to_dict()
            text[name]["lm_eval_seconds"] = time.perf_counter() - start
        if args.windows:
            model, tokenizer = load_any(folders[name])
            text[name]["bsi"] = token_perplexity(model, tokenizer, args.windows)
            del model
        print(f"{name}: {text[name]}", flush=True)

    report = {"rows": rows, "paired": paired, "text": text, "examples": args.examples, "answered": args.answered,
              "new_tokens": args.new_tokens, "repeats": args.repeats, "threads": torch.get_num_threads(),
              "date": time.strftime("%Y-%m-%d")}
    atomic_write_json(out / "ecosystem.json", report)
    print("\n| model | weights on disk | tensors in memory | decode ms/token | accuracy | answer-token loss |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['bytes_on_disk'] / 1e6:.1f} MB ({r['disk_ratio']:.2f}x) | "
              f"{r['bytes_in_memory'] / 1e6:.1f} MB ({r['memory_ratio']:.2f}x) | {r['decode_ms_per_token']:.1f} "
              f"({r['speed_ratio']:.2f}x) | {100 * r['accuracy']:.0f}% | {r['loss']:.4f} |")
    print("\n| difference | accuracy, points | loss |")
    print("|---|---|---|")
    for pair, entry in paired.items():
        print(f"| {pair} | {interval_text(entry['accuracy'], 100, 1, signed=True)} | "
              f"{interval_text(entry['loss'], 1, 4, signed=True)} |")
    for name, entry in text.items():
        if "lm_eval" in entry:
            metrics = entry["lm_eval"]["metrics"]["bsi_wikitext2"]
            print(f"{name}: lm-eval word perplexity {metrics['word_perplexity']:,.1f}, bits per byte "
                  f"{metrics['bits_per_byte']:.3f} ({args.articles} articles)")
        if "bsi" in entry:
            print(f"{name}: bsi token perplexity {entry['bsi']['perplexity']:,.2f} ({args.windows} windows of 512)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
