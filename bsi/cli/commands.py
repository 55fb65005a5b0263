"""``bsi compress``, ``bsi export``, ``bsi eval``, ``bsi chat`` and ``bsi presets``.

Each command has ``add_<name>(parser)`` and ``run_<name>(args)``; heavy
modules are imported inside ``run_*`` only, after the arguments are checked
(see :mod:`bsi.cli`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from bsi.cli.flags import REQUIRED, add_config_flags, add_model_flags, in_flag_words, overrides_from_args, whole_number
from bsi.errors import BSIError
from bsi.results import RunSummary


# ------------------------------------------------------------------ compress
def add_compress(p: argparse.ArgumentParser) -> None:
    """Flags of ``bsi compress``: the run's own, then one per configuration field (see :mod:`bsi.cli.flags`)."""
    from bsi.config import PRESETS

    p.add_argument("--preset", choices=list(PRESETS), help="starting configuration (default: default)")
    p.add_argument("--config", help="a JSON PipelineConfig file as the starting configuration instead of "
                                    "--preset (e.g. from `bsi presets default`); flags override it "
                                    "(default: none, the preset)")
    p.add_argument("--out", help="output folder for the compressed model, summary.json and rounds.jsonl "
                                 "(required unless --resume)")
    p.add_argument("--resume", metavar="DIR", help="continue the interrupted run whose --out was DIR (other flags "
                                                   "ignored) (default: none, a fresh run)")
    p.add_argument("--force", action="store_true",
                   help="replace what --out holds: a finished result, or an interrupted run's checkpoint")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_config_flags(p, exclude=("preset",))


def build_config(args: argparse.Namespace):
    """The run's PipelineConfig: ``--config`` file or ``--preset``, then the flags given."""
    from bsi.config import PipelineConfig, make_config

    if args.config and args.preset:
        raise BSIError("give --config FILE or --preset NAME, not both")
    base = PipelineConfig.from_json(args.config) if args.config else None
    try:
        return make_config(None if base else (args.preset or "default"), overrides_from_args(args), base=base)
    except BSIError as err:  # name the flag the user typed, not the field behind it
        raise BSIError(in_flag_words(str(err), args)) from None


def run_compress(args: argparse.Namespace) -> int:
    if not args.resume and not args.out:
        raise BSIError("--out DIR is required (or --resume DIR to continue an interrupted run)")
    config = None if args.resume else build_config(args)  # checked before torch is imported: errors answer at once

    from bsi.pipeline.runner import Pipeline
    from bsi.progress import ProgressPrinter
    from bsi.reports import DoneReport

    pipeline = Pipeline.resume(args.resume) if args.resume else Pipeline(config, out_dir=args.out, force=args.force)
    printer = ProgressPrinter(enabled=not args.quiet)
    started = time.time()
    summary = None
    try:
        for report in pipeline.run():
            printer.show(report)
            if isinstance(report, DoneReport):
                summary = report.summary
    except KeyboardInterrupt:
        printer.close()
        print(interrupted_message(pipeline.out_dir, started, resumed=bool(args.resume)), file=sys.stderr)
        return 130
    printer.close()
    if summary is not None:
        print(summary_table(summary))
    return 0


def interrupted_message(out_dir: Path, started: float, resumed: bool) -> str:
    """What a Ctrl-C of ``bsi compress`` leaves in ``out_dir``; ends with the ``--resume`` command on its own line.

    A checkpoint counts when this run wrote it (or continues it): a
    ``--force`` run stopped before its first round leaves the earlier run's
    checkpoint, which this run did not make.
    """
    from bsi.pipeline.runner import CHECKPOINT

    state = out_dir / CHECKPOINT / "state.json"
    summary = out_dir / "summary.json"
    if summary.is_file() and summary.stat().st_mtime >= started:
        return f"bsi compress: interrupted after the result was saved; it is complete in {out_dir}"
    if state.is_file() and (resumed or state.stat().st_mtime >= started):
        rounds = len(json.loads(state.read_text(encoding="utf-8")).get("rounds", []))
        return (f"bsi compress: interrupted; {rounds} finished pruning round(s) are saved in {state.parent}. "
                f"Continue the run with:\nbsi compress --resume {shlex.quote(str(out_dir))}")
    earlier = f" ({out_dir} still holds an earlier run's checkpoint)" if state.is_file() else ""
    return f"bsi compress: interrupted before the first pruning round ended; nothing was written{earlier}"


def summary_table(summary: RunSummary | dict[str, Any]) -> str:
    """A small plain-text table of a run's summary; on a text task, perplexity and its protocol instead of accuracy.

    A run made with ``--dense-recovery`` gets a middle column, the dense model
    trained with the same recovery steps, and every run the paired 95%
    intervals of the compressed model against each dense one (``paired``).
    ``summary`` is a :class:`~bsi.results.RunSummary` or its dict (``summary.json``).
    """
    result = summary if isinstance(summary, RunSummary) else RunSummary.from_dict(summary)
    same = result.metrics_dense_recovered
    columns = [result.metrics_before, *([same] if same else []), result.metrics_after]

    def pct(m) -> str:
        return f"{100 * m.accuracy:.1f}%" if m else "-"

    def loss(m) -> str:
        return f"{m.loss:.4f}" if m else "-"

    def ppl(m) -> str:
        return f"{m.perplexity:.3f}" if m and m.perplexity is not None else "-"

    steps = result.recover_steps
    heads = ["before", *([f"dense + {steps} steps"] if same else []), "after"]
    metrics = [("perplexity", *map(ppl, columns)), ("mean next-token loss (nats)", *map(loss, columns))] \
        if result.perplexity else [("accuracy", *map(pct, columns)), ("answer-token loss", *map(loss, columns))]
    params = [f"{result.params_before:,}", *([f"{result.params_before:,}"] if same else []), f"{result.params_after:,}"]
    compressible = [f"{result.compressible_params_before:,}",
                    *([f"{result.compressible_params_before:,}"] if same else []),
                    f"{result.compressible_params_after:,}"]
    rows = [("", *heads), ("parameters (whole model)", *params), ("parameters (compressible layers)", *compressible),
            *metrics]
    width = [max(len(r[i]) for r in rows) for i in range(len(heads) + 1)]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, width))) for r in rows]
    lines.append(
        f"compression: {result.compression_ratio:.2f}x whole model, compressible layers at "
        f"{100 * result.compressible_ratio:.1f}% of their size; {result.seconds:.0f} s"
    )
    for pair, label in (("recovered - finetuned", "after - before"),
                        ("recovered - dense_recovered", f"after - dense + {steps} steps")):
        entry = (result.paired or {}).get(pair)
        if entry:
            parts = [f"accuracy {100 * entry['accuracy']['estimate']:+.1f} points [{100 * entry['accuracy']['low']:+.1f}, "
                     f"{100 * entry['accuracy']['high']:+.1f}]"] if "accuracy" in entry else []
            parts.append(f"loss {entry['loss']['estimate']:+.4f} [{entry['loss']['low']:+.4f}, {entry['loss']['high']:+.4f}]")
            lines.append(f"{label}: {', '.join(parts)} (paired 95% interval, {entry['loss']['samples']} problems)")
    protocol = (result.perplexity or {}).get("protocol")
    if protocol:
        lines.append(f"perplexity on {protocol['source']}: {protocol['description']}")
    return "\n".join(lines)


# -------------------------------------------------------------------- export
def add_export(p: argparse.ArgumentParser) -> None:
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--dense", metavar="FOLDER",
                        help="a compressed-model folder (what `bsi compress --out` wrote): its factors are multiplied "
                             "back into ordinary dense layers, for tools that read only standard checkpoints "
                             "(required: this or --model)")
    source.add_argument("--model", metavar="FOLDER",
                        help="with --quantize: a compressed-model folder or any model folder (the dense fine-tuned "
                             "model, for a reference) to write with quantized weights (required: this or --dense)")
    from bsi.config import DTYPES

    p.add_argument("--quantize", choices=("int8",),
                   help="with --model: int8 weights (per output channel, optimum-quanto; embeddings and norms stay "
                        "float) in a bsi folder that loads as the model does; needs `pip install 'bsi[quantize]'` "
                        "(default: none)")
    p.add_argument("--out", metavar="DIR", required=True,
                   help="folder for the written model (config.json, model.safetensors, tokenizer)")
    p.add_argument("--dtype", default="stored", choices=("stored", *DTYPES),
                   help="--dense: dtype of the written weights; stored: the compressed folder's")
    p.add_argument("--force", action="store_true", help="replace what --out holds")


def run_export(args: argparse.Namespace) -> int:
    if args.model is not None and args.quantize is None:
        raise BSIError("--model FOLDER goes with --quantize int8 (to multiply factors back into dense layers, use "
                       "--dense FOLDER)")
    if args.dense is not None and args.quantize is not None:
        raise BSIError("--quantize goes with --model FOLDER, not --dense: quantize the compressed folder itself")
    if args.quantize is not None:
        if args.dtype != "stored":
            raise BSIError("--dtype is for --dense; a quantized folder keeps int8 weights and float32 for the rest")
        from bsi.pipeline.quantize import check_quantization, export_quantized, weights_bytes

        check_quantization(args.quantize)  # before anything loads: a missing library answers at once
        out = export_quantized(args.model, args.out, scheme=args.quantize, force=args.force)
        print(f"wrote {args.quantize} weights to {out} ({weights_bytes(out):,} bytes of weights, against "
              f"{weights_bytes(args.model):,}); it loads like its source: "
              f"AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True)")
        return 0
    from bsi.models import torch_dtype
    from bsi.pipeline.export import export_dense

    dtype = None if args.dtype == "stored" else torch_dtype(args.dtype)
    out = export_dense(args.dense, args.out, dtype=dtype, force=args.force)
    print(f"wrote a dense checkpoint to {out}; any transformers tool loads it, e.g. "
          f"AutoModelForCausalLM.from_pretrained({str(out)!r})")
    return 0


# ---------------------------------------------------------------------- eval
def add_eval(p: argparse.ArgumentParser) -> None:
    add_model_flags(p, {"model": REQUIRED, "data": None, "question_field": "question", "answer_field": "answer"},
                    helps={"model": "a bsi output folder, a model folder, a hub id or a built-in name",
                           "data": "task data: embedded-math, a .jsonl file or a hub name; with --perplexity, text: "
                                   "wikitext-2 (packaged, tokenized release), a text file, a folder of .txt files, "
                                   "a .jsonl file with a text field or a hub id "
                                   "(default: embedded-math; wikitext-2 with --perplexity)"})
    p.add_argument("--examples", type=whole_number(1), default=100, metavar="N", help="test examples to score")
    add_model_flags(p, {"batch_size": None, "max_new_tokens": 96, "device": "auto", "dtype": "auto", "seed": 0,
                        "trust_remote_code": False},
                    helps={"batch_size": "examples per evaluation batch; windows per forward pass with --perplexity "
                                         "(default: 16; 4 with --perplexity)",
                           "seed": "seed of the test split (same as the compress run's to reuse it)"})
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    _add_perplexity_flags(p)
    _add_lm_eval_flags(p)


def run_eval(args: argparse.Namespace) -> int:
    from bsi.data import EMBEDDED_TASK, load_task, looks_like_text
    from bsi.method.surgery import model_parameters
    from bsi.models import check_model_spec, load_model_and_tokenizer, resolve_device, resolve_dtype
    from bsi.pipeline.evaluate import evaluate

    if args.lm_eval is not None:
        return _run_eval_lm_eval(args)  # checks lm-eval, the tasks and the model folder, then evaluates
    if args.limit is not None or args.include_path is not None:
        raise BSIError("--limit and --include-path go with --lm-eval TASKS")
    if args.perplexity:
        return _run_eval_perplexity(args)  # checks the text and its flags, then the model
    check_model_spec(args.model)
    args.data = args.data or EMBEDDED_TASK
    args.batch_size = 16 if args.batch_size is None else args.batch_size
    if looks_like_text(args.data, args.text_field, args.question_field):
        raise BSIError(f"'{args.data}' is text, not a question/answer task: add --perplexity to measure perplexity on it")
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    task = load_task(args.data, question_field=args.question_field, answer_field=args.answer_field,
                     test_size=args.examples, seed=args.seed)
    model, tokenizer = load_model_and_tokenizer(args.model, dtype=dtype, device=device,
                                                trust_remote_code=args.trust_remote_code)
    metrics = evaluate(model, tokenizer, task.test[: args.examples], batch_size=args.batch_size,
                       max_new_tokens=args.max_new_tokens).metrics
    result = {**metrics.to_dict(), "params_total": model_parameters(model), "model": args.model, "data": args.data}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"accuracy {100 * metrics.accuracy:.1f}%  answer-token loss {metrics.loss:.4f}  "
              f"on {metrics.examples} examples  ({result['params_total']:,} parameters)")
    return 0


def _add_perplexity_flags(p: argparse.ArgumentParser) -> None:
    """``bsi eval --perplexity`` and its protocol's flags (see :mod:`bsi.pipeline.perplexity`)."""
    p.add_argument("--perplexity", action="store_true",
                   help="measure perplexity on the held-out part of a text (--data) instead of accuracy on a task")
    p.add_argument("--text-field", default="text", help="--perplexity: JSON field (or hub column) holding the text")
    p.add_argument("--window", type=int, default=512, help="--perplexity: tokens per window (at most the model's context)")
    p.add_argument("--stride", type=int,
                   help="--perplexity: tokens between window starts; below the window, each window scores only its "
                        "last STRIDE tokens and the rest is context (default: the window, non-overlapping windows)")
    p.add_argument("--max-windows", type=int, help="--perplexity: score only the first N windows (default: all)")
    p.add_argument("--held-out-fraction", type=float, default=0.1,
                   help="--perplexity on your own text: the share of its tokens held out and scored, its tail after a "
                        "seeded shuffle of its documents (1: all of it); wikitext-2 always scores test.txt")


def _run_eval_perplexity(args: argparse.Namespace) -> int:
    """``bsi eval --perplexity``: check the flags, read the text, load the model, then score."""
    from bsi.data import WIKITEXT_2, check_window, read_text_corpus, tokenize_corpus
    from bsi.method.surgery import model_parameters
    from bsi.models import check_model_spec, load_model_and_tokenizer, resolve_device, resolve_dtype
    from bsi.pipeline.perplexity import DEFAULT_BATCH_SIZE, check_stride, model_context, text_task_perplexity

    data = args.data or WIKITEXT_2
    batch_size = DEFAULT_BATCH_SIZE if args.batch_size is None else args.batch_size
    check_window(args.window)
    check_stride(args.window if args.stride is None else args.stride, args.window)
    if args.max_windows is not None and args.max_windows < 1:
        raise BSIError(f"--max-windows must be >= 1, got {args.max_windows} (leave it out to score every window)")
    if batch_size < 1:
        raise BSIError(f"--batch-size must be >= 1, got {batch_size}")
    if not 0 < args.held_out_fraction <= 1:
        raise BSIError(f"--held-out-fraction must be in (0, 1], got {args.held_out_fraction}")
    device = resolve_device(args.device)
    corpus = read_text_corpus(data, text_field=args.text_field)  # bad text is refused before the model loads
    check_model_spec(args.model)
    model, tokenizer = load_model_and_tokenizer(args.model, dtype=resolve_dtype(args.dtype, device), device=device,
                                                trust_remote_code=args.trust_remote_code)
    task = tokenize_corpus(corpus, tokenizer, window=args.window, held_out_fraction=args.held_out_fraction,
                           seed=args.seed, max_context=model_context(model))
    bar = None
    if not args.json:
        from tqdm.auto import tqdm

        bar = tqdm(total=0, unit="window", desc="perplexity", leave=False, file=sys.stderr, disable=None)

    def progress(done: int, total: int) -> None:
        if bar is not None:
            bar.total = total
            bar.update(done - bar.n)

    try:
        result = text_task_perplexity(model, task, stride=args.stride, batch_size=batch_size,
                                      max_windows=args.max_windows, progress=progress)
    finally:
        if bar is not None:
            bar.close()
    params = model_parameters(model)
    if args.json:
        print(json.dumps({"model": args.model, "data": data, "task": task.describe(), "params_total": params,
                          **result.to_dict()}, indent=2))
    else:
        print(f"{result.summary_line()}; {params:,} parameters")
    return 0


def _add_lm_eval_flags(p: argparse.ArgumentParser) -> None:
    """``bsi eval --lm-eval TASKS``: lm-evaluation-harness on the model folder (see :mod:`bsi.pipeline.harness`)."""
    p.add_argument("--lm-eval", metavar="TASKS",
                   help="evaluate with lm-evaluation-harness instead: task names separated by commas; bsi ships "
                        "bsi_wikitext2 (word perplexity on WikiText-2's test articles) and bsi_embedded_math (the "
                        "embedded task's test problems); needs `pip install 'bsi[eval]'` (default: none, bsi's own "
                        "evaluation)")
    p.add_argument("--limit", type=whole_number(1), metavar="N",
                   help="--lm-eval: documents per task (lm-eval's --limit) (default: all)")
    p.add_argument("--include-path", metavar="DIR",
                   help="--lm-eval: a folder of your own lm-eval task YAML files (default: bsi's tasks only)")


def _run_eval_lm_eval(args: argparse.Namespace) -> int:
    """``bsi eval --lm-eval``: check lm-eval, the tasks (their files and data) and the folder, then evaluate."""
    from bsi.pipeline import harness

    if args.perplexity:
        raise BSIError("give --perplexity or --lm-eval, not both (bsi_wikitext2 is lm-eval's word perplexity)")
    if args.data is not None:
        raise BSIError("--data is for bsi's own evaluation: with --lm-eval the tasks say what is scored")
    tasks = harness.parse_tasks(args.lm_eval)
    harness.check_lm_eval()
    manager = harness.task_manager(args.include_path, tasks)
    harness.check_tasks(tasks, manager)
    model = _lm_eval_model_folder(args.model)
    from bsi.models import resolve_device

    device = str(resolve_device(args.device))
    result = harness.run_lm_eval(model, tasks, limit=args.limit, include_path=args.include_path, device=device,
                                 dtype=args.dtype, batch_size=args.batch_size or 1,
                                 trust_remote_code=args.trust_remote_code, manager=manager)
    if args.json:
        print(harness.result_json(result))
    else:
        print("\n".join(result.lines()))
    return 0


def _lm_eval_model_folder(spec: str) -> str:
    """The folder lm-eval's ``hf`` model loads for ``--model``: a built-in model's cached copy, or the folder given."""
    from bsi.models import (
        BUILT_IN_MODELS,
        EMBEDDED_MODEL,
        GEMMA_MODEL,
        check_model_spec,
        ensure_embedded_model,
        ensure_gemma_model,
    )

    if spec in BUILT_IN_MODELS:
        if spec == "embedded" or spec == EMBEDDED_MODEL:
            return str(ensure_embedded_model())
        if spec == GEMMA_MODEL:
            return str(ensure_gemma_model())
        raise BSIError(f"--lm-eval loads model folders: '{spec}' has none (give a bsi output folder or a model folder)")
    check_model_spec(spec)
    return spec


# ---------------------------------------------------------------------- chat
def add_chat(p: argparse.ArgumentParser) -> None:
    add_model_flags(p, {"model": REQUIRED, "max_new_tokens": 128, "device": "auto", "dtype": "auto",
                        "trust_remote_code": False},
                    helps={"model": "a bsi output folder, a model folder, a hub id or a built-in name",
                           "max_new_tokens": "longest reply"})


def run_chat(args: argparse.Namespace) -> int:
    from bsi.chat import ChatSession
    from bsi.models import check_model_spec, load_model_and_tokenizer, resolve_device, resolve_dtype

    check_model_spec(args.model)
    device = resolve_device(args.device)
    model, tokenizer = load_model_and_tokenizer(args.model, dtype=resolve_dtype(args.dtype, device), device=device,
                                                trust_remote_code=args.trust_remote_code)
    session = ChatSession(model, tokenizer, max_new_tokens=args.max_new_tokens)
    print("Type a message; an empty line or Ctrl-D quits.", file=sys.stderr)
    while True:
        try:
            message = input("you> ").strip()
        except EOFError:
            break
        if not message:
            break
        try:
            print("bot> ", end="", flush=True)
            for piece in session.stream_reply(message):
                print(piece, end="", flush=True)
            print()
        except BSIError as err:
            print(f"\nerror: {err}", file=sys.stderr)
    return 0


# ------------------------------------------------------------------- presets
def add_presets(p: argparse.ArgumentParser) -> None:
    from bsi.config import PRESETS

    p.add_argument("name", nargs="?", choices=list(PRESETS), metavar="PRESET",
                   help=f"print this preset ({', '.join(PRESETS)}) as a full JSON config (default: list every "
                        "preset, one a line)")


def run_presets(args: argparse.Namespace) -> int:
    """Every preset, a line each: its measured time on 2 cores (``preset_costs.json``), then its settings."""
    from bsi.config import PRESET_COSTS, PRESETS, SWEEP_PRESETS, make_config

    if args.name:
        print(make_config(args.name).to_json())
        if args.name in SWEEP_PRESETS:
            print(f"bsi sweep adds: {json.dumps(SWEEP_PRESETS[args.name])}", file=sys.stderr)
        cost = PRESET_COSTS.get(args.name)
        print(f"measured: {cost.time_text() if cost else 'not measured'}", file=sys.stderr)
    else:
        for name, values in PRESETS.items():
            cost = PRESET_COSTS.get(name)
            extra = f"; bsi sweep adds {json.dumps(SWEEP_PRESETS[name])}" if name in SWEEP_PRESETS else ""
            own = json.dumps(values) if values else "the defaults of every field"
            print(f"{name} ({cost.time_text() if cost else 'not measured'}): {own}{extra}")
    return 0
