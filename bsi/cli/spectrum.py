"""``bsi spectrum``: the command line of :mod:`bsi.analysis.spectrum`.

The defaults measure the last block's layer of each kind, the top 16 sigmas,
on one batch of 4 examples: about a minute on a 2-core CPU with the embedded
model (most of it loading the model). Each extra column costs one second
backward pass, and a layer near the input costs a full-depth one: layer 0's
top 16 sigmas alone take about as long as all seven defaults.
"""

from __future__ import annotations

import argparse
import sys

from bsi.cli.flags import add_model_flags, number_in, whole_number

DEFAULT_TOP_K = 16  # sigmas per layer: one second backward pass each
DEFAULT_BATCHES = 1


#: The shared model flags (:data:`bsi.cli.flags.MODEL_FLAGS`) with this command's defaults: small
#: batches, float32 (second derivatives want the precision).
CONFIG_FLAGS = {"model": "smollm2-135m-instruct", "data": "embedded-math", "question_field": "question",
                "answer_field": "answer", "batch_size": 4, "max_length": 256, "dtype": "float32", "device": "auto",
                "seed": 0, "trust_remote_code": False}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``bsi spectrum`` (no heavy import: ``--help`` answers at once)."""
    p.description = (f"{p.description or ''}. The defaults take about a minute on a 2-core CPU with the embedded "
                     "model: the last block's layer of each kind, top-16 sigmas, one batch of 4. More layers, "
                     "a larger --top-k or layers near the input cost more: each Hessian column is one second "
                     "backward pass, which for block 0 runs through the whole model.")
    add_model_flags(p, CONFIG_FLAGS, helps={"seed": "seed of the batches",
                                            "data": "question/answer task data: embedded-math, a local .jsonl file "
                                                    "or a datasets hub name"})
    p.add_argument("--layers", nargs="+", metavar="SPEC",
                   help="layers to measure: exact names, substrings (mlp.down_proj), globs (*.layers.1?.*proj), "
                        "each optionally with @I,J for the I-th and J-th matches, negative from the end "
                        "(mlp.down_proj@0,-1) (default: the last block's layer of each kind, kind@-1, the cheapest)")
    p.add_argument("--top-k", type=whole_number(1), default=DEFAULT_TOP_K, metavar="K",
                   help="sigmas per layer (the largest); each is one second backward pass")
    p.add_argument("--batches", type=whole_number(1), default=DEFAULT_BATCHES, metavar="N",
                   help="mini-batches to average the Hessian over")
    p.add_argument("--error", type=number_in(0), default=0.1, metavar="E",
                   help="relative error e > 0 for the probes-needed column")
    p.add_argument("--delta", type=number_in(0, 1), default=0.1, metavar="DELTA",
                   help="failure probability delta in (0, 1) for the probes-needed column")
    p.add_argument("--out", required=True, help="output folder for spectrum.json, summary.txt, spectrum.html")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def run(args: argparse.Namespace) -> int:
    """``bsi spectrum``: validate, load, measure, save, print the summary table."""
    from bsi.analysis.spectrum import SpectrumAnalysis, SpectrumProgress, SpectrumResult, select_layers
    from bsi.data import BatchStream, load_task
    from bsi.files import check_output_dir
    from bsi.models import load_model_and_tokenizer, resolve_device, resolve_dtype
    from bsi.pipeline.losses import answer_token_loss

    check_output_dir(args.out)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    task = load_task(args.data, question_field=args.question_field, answer_field=args.answer_field, test_size=0,
                     train_size=max(64, args.batches * args.batch_size), seed=args.seed)
    model, tokenizer = load_model_and_tokenizer(args.model, dtype=dtype, device=device, attn_implementation="eager",
                                                trust_remote_code=args.trust_remote_code)
    names = select_layers(model, args.layers)
    stream = BatchStream(task.train, tokenizer, batch_size=args.batch_size, max_length=args.max_length, seed=args.seed)
    batches = [next(stream) for _ in range(args.batches)]
    meta = {"model": args.model, "data": args.data, "batch_size": args.batch_size, "max_length": args.max_length,
            "dtype": str(dtype).replace("torch.", ""), "seed": args.seed, "error": args.error, "delta": args.delta}
    analysis = SpectrumAnalysis(model, names, batches, answer_token_loss, top_k=args.top_k, error=args.error,
                                delta=args.delta, meta=meta)
    result = None
    for report in analysis.run():
        if isinstance(report, SpectrumProgress) and not args.quiet:
            print(f"batch {report.batch}/{report.batches} layer {report.layer_index}/{report.layers} "
                  f"{report.layer}: loss {report.loss:.4f} ({report.seconds:.0f} s)", file=sys.stderr, flush=True)
        elif isinstance(report, SpectrumResult):
            result = report
    assert result is not None
    result.save(args.out)
    print(result.summary_table())
    print(f"saved {args.out}/spectrum.json, summary.txt, spectrum.html ({result.seconds:.0f} s)")
    return 0
