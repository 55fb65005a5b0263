"""What each preset costs on general text: lm-eval's WikiText-2 word perplexity of every run and its dense reference.

    OMP_NUM_THREADS=2 python bench/general_text.py --runs runs/p-tour runs/default runs/p-demo runs/p-quality \\
        runs/p-text --limit 3 --out data/general-text.json
    python bench/general_text.py --runs /tmp/smoke --limit 1 --out /tmp/g.json --no-shipped   # a smoke run

A model compressed for one task keeps the bases that task needs; this
measures what that leaves of general text, in the field's protocol:
lm-evaluation-harness's ``bsi_wikitext2`` task (bsi ships it:
``loglikelihood_rolling`` over whole WikiText-2 test articles, word
perplexity and bits per byte), on the first ``--limit`` articles, for

* every run folder given (``bsi compress --preset NAME --out FOLDER``);
* each run's fine-tuned dense model, the model it compressed (from the
  fine-tune cache, :func:`bsi.pipeline.compare.run_reference`): a run's
  general-text cost is its perplexity against that one's;
* the embedded model as shipped (unless ``--no-shipped``): what the task
  fine-tunes themselves cost.

A dense folder shared by several runs is scored once. The JSON (written
atomically) holds each run's preset, task, size and own-task metrics from
its ``summary.json`` beside the lm-eval metrics, the lm-eval version and
the command; ``python -m bsi.cli.docs`` renders it as the table in
docs/ecosystem.md (:func:`bsi.cli.docs.general_text_table`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's bsi first

from bsi.files import atomic_write_json
from bsi.pipeline.compare import run_reference, run_summary
from bsi.pipeline.harness import check_lm_eval, run_lm_eval

TASK = "bsi_wikitext2"


def score(folder: str, limit: int) -> dict:
    """lm-eval's word perplexity and bits per byte of ``folder`` on the first ``limit`` WikiText-2 test articles."""
    start = time.perf_counter()
    result = run_lm_eval(folder, [TASK], limit=limit)
    metrics = result.metrics[TASK]
    out = {"word_perplexity": metrics["word_perplexity"], "bits_per_byte": metrics["bits_per_byte"],
           "articles": result.samples.get(TASK, limit), "seconds": round(time.perf_counter() - start, 1)}
    print(f"{folder}: {out}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    """The command line: ``argv`` as the words after the script's name (default: ``sys.argv[1:]``)."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", nargs="+", required=True, help="bsi run folders (bsi compress --out)")
    parser.add_argument("--limit", type=int, default=3, help="WikiText-2 test articles scored (lm-eval's --limit)")
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--no-shipped", action="store_true", help="skip the embedded model as shipped")
    args = parser.parse_args(argv)

    version = check_lm_eval()
    runs = [(folder, run_summary(folder), run_reference(folder).model) for folder in args.runs]  # all checked first
    dense_scores: dict[str, dict] = {}
    rows = []
    for folder, summary, dense in runs:
        if dense not in dense_scores:
            dense_scores[dense] = score(dense, args.limit)
        config = summary["config"]
        rows.append({"run": folder, "preset": config.get("preset"), "task": summary["task"], "data": config["data"],
                     "compression_ratio": summary["compression_ratio"], "before": summary["metrics_before"],
                     "after": summary["metrics_after"], "dense_folder": Path(dense).name, "dense": dense_scores[dense],
                     "compressed": score(folder, args.limit)})
    shipped = None
    if not args.no_shipped:
        from bsi.models import ensure_embedded_model

        shipped = score(str(ensure_embedded_model()), args.limit)
    record = {"date": datetime.date.today().isoformat(), "lm_eval_version": version, "task": TASK,
              "articles": args.limit, "threads": int(os.environ.get("OMP_NUM_THREADS", "0")) or os.cpu_count(),
              "command": "python bench/general_text.py " + " ".join(argv),
              "embedded_as_shipped": shipped, "runs": rows}
    atomic_write_json(Path(args.out), record)
    print(json.dumps({r["preset"]: (r["dense"]["word_perplexity"], r["compressed"]["word_perplexity"])
                      for r in rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
