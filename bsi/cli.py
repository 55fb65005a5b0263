"""Command line: ``bsi compress``, ``bsi eval``, ``bsi chat``, ``bsi presets``.

The CLI is a thin consumer of the engine's report generator: it turns
:mod:`bsi.reports` objects into progress bars and a closing table. Any
:class:`~bsi.errors.BSIError` becomes one line on stderr and exit status 2.

Further sub-commands register themselves in :data:`COMMANDS` (name -> module
with ``add_arguments(parser)`` and ``run(args) -> int``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Any

from bsi.errors import BSIError

#: sub-command name -> (module path, one-line help). Modules expose add_arguments and run.
COMMANDS: dict[str, tuple[str, str]] = {
    "compress": ("bsi.cli", "run the three-stage pipeline (fine-tune, compress, recover) and save the model"),
    "eval": ("bsi.cli", "measure accuracy and answer-token loss of a model on a task"),
    "chat": ("bsi.cli", "chat with a model in the terminal"),
    "presets": ("bsi.cli", "print the presets (or one, as a full JSON config)"),
    "sweep": ("bsi.pipeline.sweep", "compare methods (svd, fwsvd, asvd, basel, bsi-grad, bsi) across target sizes"),
    "compare": ("bsi.analysis.compare", "generate from several models side by side for the same prompts"),
    "spectrum": ("bsi.analysis.spectrum", "measure per-layer Hessian spectra in sigma-space (power-law fit, JSON, HTML)"),
}


# ------------------------------------------------------------------ compress
def _add_compress(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="a JSON PipelineConfig file (flags override it)")
    p.add_argument("--preset", help="smoke | default | paper (default: default)")
    p.add_argument("--model", help="embedded default 'smollm2-135m-instruct', 'tiny-random-llama', a local folder or a hub id")
    p.add_argument("--data", help="'embedded-math' (default), a local .jsonl file, or a datasets hub name")
    p.add_argument("--question-field"), p.add_argument("--answer-field")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--keep-ratio", type=float, help="KeepRatio of the importance-mass rule, in (0, 1]")
    mode.add_argument("--target-ratio", type=float, help="target parameters of the compressible layers / before, in (0, 1]")
    p.add_argument("--score", help="bsi | bsi-grad | basel")
    p.add_argument("--eps", type=float, help="perturbation intensity in (0, 1) (default: the rule for the dtype)")
    p.add_argument("--rounds", type=int, help="PruningRounds T")
    p.add_argument("--gamma", type=float, help="candidate-pool exponent gamma > 0")
    p.add_argument("--probe-scope", help="model (one joint probe) | layer (one probe per layer)")
    p.add_argument("--hessian-method", help="fd (finite differences) | hvp (double backward)")
    p.add_argument("--probes", type=int, dest="probes_per_batch", help="probes per profiling batch")
    p.add_argument("--center-gradient", help="exact (own pass) | average ((g+ + g-)/2, one pass fewer)")
    p.add_argument("--iters-per-epoch", type=int, help="NumIterPerEpoch")
    p.add_argument("--pruning-epochs", type=float, help="PruningEpochs")
    p.add_argument("--sampling-ratio", type=float, help="SamplingIterRatio in (0, 1]")
    p.add_argument("--aux-rank", type=int, help="auxiliary vectors per layer")
    p.add_argument("--lr", type=float, help="learning rate of sigma while pruning")
    p.add_argument("--finetune-steps", type=int), p.add_argument("--finetune-lr", type=float)
    p.add_argument("--recover-steps", type=int), p.add_argument("--recover-lr", type=float)
    p.add_argument("--skip-finetune", action="store_true", default=None, help="start from the model as given")
    p.add_argument("--batch-size", type=int), p.add_argument("--max-length", type=int)
    p.add_argument("--eval-examples", type=int, help="test examples for accuracy (0: skip evaluation)")
    p.add_argument("--dtype", help="auto | float32 | bfloat16 | float16")
    p.add_argument("--device", help="auto | cpu | cuda[:N]")
    p.add_argument("--gradient-checkpointing", action="store_true", default=None)
    p.add_argument("--trust-remote-code", action="store_true", default=None, help="allow custom model code from the hub")
    p.add_argument("--seed", type=int)
    p.add_argument("--out", help="output folder for the compressed model and summary.json (required)")
    p.add_argument("--resume", metavar="DIR", help="continue the interrupted run whose --out was DIR (other flags ignored)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


_TOP = ("model", "data", "question_field", "answer_field", "batch_size", "max_length", "eval_examples", "dtype",
        "device", "trust_remote_code", "seed", "skip_finetune", "gradient_checkpointing")
_COMPRESS = ("keep_ratio", "target_ratio", "score", "eps", "rounds", "gamma", "probe_scope", "hessian_method",
             "probes_per_batch", "center_gradient", "iters_per_epoch", "pruning_epochs", "sampling_ratio", "aux_rank", "lr")


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Nested PipelineConfig overrides from the flags the user actually gave."""
    out: dict[str, Any] = {k: getattr(args, k) for k in _TOP if getattr(args, k, None) is not None}
    comp = {k: getattr(args, k) for k in _COMPRESS if getattr(args, k, None) is not None}
    if comp:
        out["compress"] = comp
    for stage in ("finetune", "recover"):
        stage_over = {k: getattr(args, f"{stage}_{k}") for k in ("steps", "lr") if getattr(args, f"{stage}_{k}", None) is not None}
        if stage_over:
            out[stage] = stage_over
    return out


def build_config(args: argparse.Namespace):
    from bsi.config import PipelineConfig, deep_update, make_config

    if args.config:
        base = PipelineConfig.from_json(args.config).to_dict()
        over = overrides_from_args(args)
        comp = over.get("compress", {})
        if comp.get("target_ratio") is not None:
            base["compress"]["keep_ratio"] = None
        if comp.get("keep_ratio") is not None:
            base["compress"]["target_ratio"] = None
        return PipelineConfig.from_dict(deep_update(base, over))
    return make_config(args.preset or "default", overrides_from_args(args))


def _run_compress(args: argparse.Namespace) -> int:
    from bsi.pipeline.runner import Pipeline
    from bsi.progress import ProgressPrinter

    if args.resume:
        pipeline = Pipeline.resume(args.resume)
    elif not args.out:
        raise BSIError("--out DIR is required (or --resume DIR to continue an interrupted run)")
    else:
        pipeline = Pipeline(build_config(args), out_dir=args.out)
    printer = ProgressPrinter(enabled=not args.quiet)
    summary = None
    for report in pipeline.run():
        printer.show(report)
        if type(report).__name__ == "DoneReport":
            summary = report.summary
    printer.close()
    if summary is not None:
        print(summary_table(summary))
    return 0


def summary_table(summary: dict[str, Any]) -> str:
    """A small plain-text table of a run's summary."""
    before, after = summary.get("metrics_before") or {}, summary.get("metrics_after") or {}

    def pct(m: dict) -> str:
        return f"{100 * m['accuracy']:.1f}%" if m else "-"

    def loss(m: dict) -> str:
        return f"{m['loss']:.4f}" if m else "-"

    rows = [
        ("", "before", "after"),
        ("parameters (whole model)", f"{summary['params_before']:,}", f"{summary['params_after']:,}"),
        ("parameters (compressible layers)", f"{summary['compressible_params_before']:,}", f"{summary['compressible_params_after']:,}"),
        ("accuracy", pct(before), pct(after)),
        ("answer-token loss", loss(before), loss(after)),
    ]
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, width))) for r in rows]
    lines.append(
        f"compression: {summary['compression_ratio']:.2f}x whole model, compressible layers at "
        f"{100 * summary['compressible_ratio']:.1f}% of their size; {summary['seconds']:.0f} s"
    )
    return "\n".join(lines)


# ---------------------------------------------------------------------- eval
def _add_eval(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="a bsi output folder, a model folder, a hub id or a built-in name")
    p.add_argument("--data", default="embedded-math")
    p.add_argument("--question-field", default="question"), p.add_argument("--answer-field", default="answer")
    p.add_argument("--examples", type=int, default=100, help="test examples to score")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--device", default="auto"), p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")


def _run_eval(args: argparse.Namespace) -> int:
    from bsi.data import load_task
    from bsi.pipeline.evaluate import evaluate
    from bsi.models import load_model_and_tokenizer
    from bsi.pipeline.runner import resolve_device, resolve_dtype
    from bsi.method.surgery import model_parameters

    if args.examples < 1:
        raise BSIError(f"--examples must be >= 1, got {args.examples}")
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    task = load_task(args.data, question_field=args.question_field, answer_field=args.answer_field,
                     test_size=args.examples, seed=args.seed)
    model, tokenizer = load_model_and_tokenizer(args.model, dtype=dtype, device=device,
                                                trust_remote_code=args.trust_remote_code)
    metrics = evaluate(model, tokenizer, task.test[: args.examples], batch_size=args.batch_size,
                       max_new_tokens=args.max_new_tokens)
    result = {**metrics.to_dict(), "params_total": model_parameters(model), "model": args.model, "data": args.data}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"accuracy {100 * metrics.accuracy:.1f}%  answer-token loss {metrics.loss:.4f}  "
              f"on {metrics.examples} examples  ({result['params_total']:,} parameters)")
    return 0


# ---------------------------------------------------------------------- chat
def _add_chat(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--device", default="auto"), p.add_argument("--dtype", default="auto")
    p.add_argument("--trust-remote-code", action="store_true")


def _run_chat(args: argparse.Namespace) -> int:
    from bsi.chat import ChatSession
    from bsi.models import load_model_and_tokenizer
    from bsi.pipeline.runner import resolve_device, resolve_dtype

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
def _add_presets(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", help="print this preset as a full JSON config")


def _run_presets(args: argparse.Namespace) -> int:
    from bsi.config import PRESETS, make_config

    if args.name:
        print(make_config(args.name).to_json())
    else:
        for name, values in PRESETS.items():
            print(f"{name}: {json.dumps(values)}")
    return 0


_LOCAL = {
    "compress": (_add_compress, _run_compress),
    "eval": (_add_eval, _run_eval),
    "chat": (_add_chat, _run_chat),
    "presets": (_add_presets, _run_presets),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bsi", description="Compress causal LMs with Basis Selection with Importance.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if module == "bsi.cli":
            _LOCAL[name][0](p)
        else:
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``bsi`` command; returns the exit status."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress bars only; errors come as one line
    hf_logging.set_verbosity_error()
    parser = build_parser()
    args = parser.parse_args(argv)
    module = COMMANDS[args.command][0]
    run = _LOCAL[args.command][1] if module == "bsi.cli" else importlib.import_module(module).run
    try:
        return run(args)
    except BSIError as err:
        print(f"bsi {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"bsi {args.command}: interrupted; nothing was written", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
