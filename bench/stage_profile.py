"""Where the time of `bsi compress` goes: each stage run for a few steps under torch.profiler.

    python bench/stage_profile.py                                  # the embedded model, the default preset
    python bench/stage_profile.py --model tiny-random-llama        # a smoke run (seconds)
    python bench/stage_profile.py --steps 3 --eval-problems 16 --json /tmp/profile.json

The stages of ``bsi compress`` (bsi.pipeline.runner.Pipeline), each for a
few steps with the preset's settings, on the model as loaded (the fine-tune
cache is not needed: a step costs the same before and after fine-tuning):

* ``finetune``: dense training steps (bsi.pipeline.training.finetune);
* ``evaluate``: the evaluation of ``--eval-problems`` test problems
  (teacher-forced scoring pass and greedy decode, bsi.pipeline.evaluate),
  split into its scoring passes, its decode steps and the tokenizer's
  ``decode`` calls;
* ``calibrate``: the whitening statistics' forward passes, then the bases
  (``convert``: the per-layer factorisation, timed apart);
* ``compress-train`` / ``compress-profile``: the engine's tuning and
  profiling steps (bsi.method.engine.Compressor), then one round's close
  (``close-round``: scores, selection, the cut, two monitor losses);
* ``recover``: the recovery steps of the exported model (its export apart).

For each stage the table gives the wall seconds per step (profiler on), the
share of the wall time spent in the profiler's operators (``ops``) and, of
that, in matrix products (``matmul``: mm, addmm, bmm, linear's products,
attention) and in the backward's accumulation; the rest of the wall time is
Python and framework overhead outside any operator (``outside``); the host
syncs (``aten::_local_scalar_dense`` calls, what ``.item()``, ``float(t)``,
``bool(t)`` cost) per step; and the padding share of its batches (padded
positions / real tokens). Then each stage's top operators by self time.

Figures are wall seconds on whatever machine runs it; the profiler adds a
few percent. For ratios against an alternative code path see
``bench/speed.py``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # this checkout's bsi first
from common import machine

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_dot_product_flash_attention_for_cpu",
              "aten::_scaled_dot_product_flash_attention_for_cpu_backward", "aten::_weight_int8pack_mm")
SYNC_OPS = ("aten::_local_scalar_dense",)


class Stage:
    """The wall time, the profile and the padding of one stage's steps."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.steps = 0
        self.wall = 0.0
        self.events = None
        self.padded = 0
        self.real = 0
        self.parts: dict[str, list[float]] = collections.defaultdict(list)  # sub-timings (seconds per call)

    def add_batch(self, batch: dict) -> None:
        mask = batch["attention_mask"]
        self.padded += int(mask.numel())
        self.real += int(mask.sum())

    def row(self) -> dict:
        """The stage's table row (seconds per step, shares, syncs per step, padding share)."""
        averages = self.events or []
        self_us = {e.key: e.self_cpu_time_total for e in averages}
        calls = {e.key: e.count for e in averages}
        ops_us = sum(self_us.values())
        matmul_us = sum(self_us.get(k, 0.0) for k in MATMUL_OPS)
        wall_us = self.wall * 1e6
        syncs = sum(calls.get(k, 0) for k in SYNC_OPS)
        top = sorted(averages, key=lambda e: -e.self_cpu_time_total)[:8]
        return {
            "stage": self.name, "steps": self.steps, "seconds": self.wall,
            "seconds_per_step": self.wall / max(self.steps, 1),
            "ops_share": ops_us / wall_us if wall_us else float("nan"),
            "matmul_share": matmul_us / wall_us if wall_us else float("nan"),
            "outside_share": 1 - ops_us / wall_us if wall_us else float("nan"),
            "syncs_per_step": syncs / max(self.steps, 1),
            "padding_share": (self.padded - self.real) / self.real if self.real else None,
            "parts": {k: {"calls": len(v), "seconds": sum(v)} for k, v in self.parts.items()},
            "top": [{"op": e.key, "share": e.self_cpu_time_total / wall_us, "calls": e.count} for e in top],
        }


@contextlib.contextmanager
def profiled(stage: Stage, enabled: bool = True):
    """Profile the block (CPU activities) and add its wall time and operator averages to ``stage``."""
    context = profile(activities=[ProfilerActivity.CPU]) if enabled else contextlib.nullcontext()
    start = time.perf_counter()
    with context as prof:
        yield
    stage.wall += time.perf_counter() - start
    if enabled:
        stage.events = list(prof.key_averages())


def wrap_timed(owner, name: str, stage: Stage, label: str):
    """Replace ``owner.name`` by a wrapper adding each call's seconds to ``stage.parts[label]``; returns an undo."""
    original = getattr(owner, name)

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            stage.parts[label].append(time.perf_counter() - start)

    setattr(owner, name, timed)
    return lambda: setattr(owner, name, original)


def run(args) -> dict:
    from bsi.config import make_config
    from bsi.data import BatchStream, encode_answer, encode_prompt, load_task
    from bsi.method.engine import Compressor
    from bsi.models import load_model_and_tokenizer
    from bsi.pipeline import evaluate as evaluate_module
    from bsi.pipeline.distributed import from_environment
    from bsi.pipeline.losses import answer_token_loss
    from bsi.pipeline.stages import SkipLimit, recover_model
    from bsi.pipeline.training import finetune

    torch.manual_seed(0)
    overrides = json.loads(args.override) if args.override else {}
    overrides |= {"model": args.model} if args.model else {}
    config = make_config(args.preset, overrides)
    steps = args.steps
    task = load_task(config.data, question_field=config.question_field, answer_field=config.answer_field,
                     test_size=config.test_size, train_size=config.train_size, seed=config.seed,
                     validation_size=config.validation_size)
    model, tokenizer = load_model_and_tokenizer(config.model, dtype=torch.float32)

    def stream(offset: int) -> BatchStream:
        return BatchStream(task.train, tokenizer, batch_size=config.batch_size, max_length=config.max_length,
                           seed=config.seed + offset)

    class Counting:
        """A batch stream that adds each batch's padding to a stage."""

        def __init__(self, inner, stage: Stage) -> None:
            self.inner, self.stage = inner, stage

        def __iter__(self):
            return self

        def __next__(self):
            batch = next(self.inner)
            self.stage.add_batch(batch)
            return batch

    stages: list[Stage] = []

    def new(name: str) -> Stage:
        stages.append(Stage(name))
        print(f"[profile] {name} ...", file=sys.stderr, flush=True)
        return stages[-1]

    # ---- fine-tune: one unprofiled warm-up step, then `steps` profiled
    stage = new("finetune")
    batches = Counting(stream(1), Stage("warm-up"))
    training = finetune(model, batches, steps=steps + 1, lr=config.finetune.lr, warmup_steps=0,
                        weight_decay=config.finetune.weight_decay, max_grad_norm=config.finetune.max_grad_norm)
    next(training)
    batches.stage = stage
    with profiled(stage):
        for _ in training:
            stage.steps += 1

    # ---- evaluation of N problems (scoring pass + greedy decode)
    stage = new("evaluate")
    problems = task.test[: args.eval_problems]
    undo = [wrap_timed(evaluate_module, "_score_batch", stage, "scoring pass"),
            wrap_timed(evaluate_module, "greedy_decode", stage, "decode loop"),
            wrap_timed(type(tokenizer), "decode", stage, "tokenizer.decode")]
    decode_calls: list[float] = []

    def before(module, args, kwargs):
        ids = kwargs.get("input_ids")
        kwargs_start.append((time.perf_counter(), ids is not None and ids.shape[1] == 1))

    def after(module, args, kwargs, output):
        started, one_token = kwargs_start.pop()
        if one_token:
            decode_calls.append(time.perf_counter() - started)

    kwargs_start: list = []
    hooks = [model.register_forward_pre_hook(before, with_kwargs=True),
             model.register_forward_hook(after, with_kwargs=True)]
    try:
        with profiled(stage):
            evaluation = evaluate_module.evaluate(model, tokenizer, problems, answered=len(problems),
                                                  batch_size=config.eval_batch_size,
                                                  max_new_tokens=config.max_new_tokens)
    finally:
        for u in undo:
            u()
        for hook in hooks:
            hook.remove()
    stage.steps = len(problems)
    prompt_lengths = [len(encode_prompt(tokenizer, e.question)) for e in problems]
    answer_lengths = [len(encode_answer(tokenizer, e.answer)) for e in problems]
    order = evaluate_module._length_order([p + a for p, a in zip(prompt_lengths, answer_lengths)])  # as evaluate
    for start in range(0, len(order), config.eval_batch_size):
        chunk = order[start:start + config.eval_batch_size]  # prompts padded on the left, answers on the right
        stage.padded += len(chunk) * (max(prompt_lengths[i] for i in chunk) + max(answer_lengths[i] for i in chunk))
        stage.real += sum(prompt_lengths[i] + answer_lengths[i] for i in chunk)
    stage.parts["decode steps (one-token model calls)"] = decode_calls
    generated = sum(len(tokenizer.encode(o.prediction or "", add_special_tokens=False)) for o in evaluation.outcomes)
    stage.parts["generated tokens"] = [0.0] * generated

    # ---- calibration (whitening statistics) and conversion to the Basel form
    compress = _replace(config.compress, calibration_batches=steps)
    stage = new("calibrate")
    convert_stage = Stage("convert")
    compressor = Compressor(model, Counting(stream(2), stage), compress, answer_token_loss, seed=config.seed)
    conversion = compressor.convert()
    with profiled(stage):
        for _ in range(steps):
            next(conversion)
            stage.steps += 1
    stages.append(convert_stage)
    with profiled(convert_stage):
        for _ in conversion:
            pass
    convert_stage.steps = 1

    # ---- compression: `steps` tuning steps, `steps` profiling steps, one round's close
    compressor._monitor = next(compressor.batches)
    total = compressor.total_iterations
    compressor._train_step(compressor._next_batch(), total)  # warm-up (allocator, AdamW state)
    stage = new("compress-train")
    compressor.batches = Counting(compressor.batches.inner, stage)
    with profiled(stage):
        for _ in range(steps):
            compressor._train_step(compressor._next_batch(), total)
            stage.steps += 1
    stage = new("compress-profile")
    compressor.batches = Counting(compressor.batches.inner, stage)
    undo = [wrap_timed(compressor, "_open_round", stage, "opening the round (candidate pools, first step)")]
    with profiled(stage):
        for _ in range(steps):
            compressor._profile_step(compressor._next_batch(), total)
            stage.steps += 1
    stage = new("close-round")
    undo += [wrap_timed(compressor, name, stage, label) for name, label in (
        ("score_round", "scores"), ("select", "selection"), ("_monitor_loss", "monitor loss (2 forward passes)"),
        ("prune_layer", "the cut"))]
    with profiled(stage):
        compressor._close_round()
    stage.steps = 1
    for u in undo:
        u()

    # ---- recovery: export, then `steps` steps of the exported model (one warm-up step)
    stage = new("recover")
    export_stage = Stage("export")
    settings = _replace(config.recover, steps=steps + 1, warmup_steps=0)
    batches = Counting(stream(3), Stage("warm-up"))
    reports = recover_model(model, lambda: batches, settings, loss_fn=answer_token_loss,
                            dist=from_environment(), skips=SkipLimit(10))
    start = time.perf_counter()
    next(reports)  # the stage's start report: the model is exported
    export_stage.wall = time.perf_counter() - start
    export_stage.steps = 1
    next(reports)  # warm-up step
    batches.stage = stage
    with profiled(stage):
        for report in reports:
            stage.steps += int(getattr(report, "step", 0) > 0)
    stages.insert(len(stages) - 1, export_stage)

    return {"model": config.model, "preset": args.preset or "default", "steps": steps,
            "eval_problems": len(problems), "batch_size": config.batch_size, "eval_batch_size": config.eval_batch_size,
            "max_new_tokens": config.max_new_tokens, "machine": machine(), "date": time.strftime("%Y-%m-%d"),
            "stages": [s.row() for s in stages], "load_average_end": os.getloadavg()[0]}


def _replace(section, **changes):
    """A config section with some fields changed (validated again by its constructor)."""
    return type(section).from_dict({**section.to_dict(), **changes})


def busy(result: dict) -> str:
    """A warning when the machine had more runnable processes than cores while the stages ran."""
    cores = result["machine"].get("cores_visible") or 1
    load = max(result["machine"].get("load_average_1m", 0.0), result["load_average_end"])
    return f": more than its {cores} cores were busy, other processes slowed the figures" if load > cores + 0.5 else ""


def table(result: dict) -> str:
    """The printed table: one row per stage, then each stage's parts and top operators."""
    lines = [f"bsi compress, stage by stage: model {result['model']}, preset {result['preset']}, "
             f"{result['steps']} steps per stage, {result['eval_problems']} problems evaluated "
             f"({result['machine'].get('cpu')}, {result['machine'].get('torch_threads')} threads, {result['date']}; "
             f"load average {result['machine'].get('load_average_1m', float('nan')):.1f} at the start, "
             f"{result['load_average_end']:.1f} at the end{busy(result)})",
             "",
             f"{'stage':<17}{'steps':>6}{'s/step':>9}{'ops':>7}{'matmul':>8}{'outside':>9}{'syncs/step':>12}"
             f"{'padding':>9}"]
    for row in result["stages"]:
        pad = "" if row["padding_share"] is None else f"{row['padding_share']:.0%}"
        share = (lambda v: "" if v != v else f"{v:.0%}")  # noqa: E731 - NaN when not profiled
        lines.append(f"{row['stage']:<17}{row['steps']:>6}{row['seconds_per_step']:>9.3f}{share(row['ops_share']):>7}"
                     f"{share(row['matmul_share']):>8}{share(row['outside_share']):>9}{row['syncs_per_step']:>12.1f}"
                     f"{pad:>9}")
    lines.append("")
    lines.append("ops: share of the wall time inside profiled operators; matmul: inside matrix products and attention;")
    lines.append("outside: Python and framework time between operators; syncs: aten::_local_scalar_dense calls;")
    lines.append("padding: padded positions / real tokens of the stage's batches.")
    for row in result["stages"]:
        if not row["top"] and not row["parts"]:
            continue
        lines.append("")
        lines.append(f"{row['stage']}:")
        for name, part in row["parts"].items():
            if name == "generated tokens":
                lines.append(f"  {name}: {part['calls']}")
            elif part["calls"]:
                lines.append(f"  {name}: {part['calls']} calls, {part['seconds']:.2f} s "
                             f"({part['seconds'] / row['seconds']:.0%} of the stage)")
        for op in row["top"][:6]:
            lines.append(f"  {op['share']:>5.0%}  {op['op']} ({op['calls']} calls)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model spec (default: the preset's, the embedded model)")
    parser.add_argument("--preset", default="default", help="the preset whose settings the stages use")
    parser.add_argument("--steps", type=int, default=3, help="profiled steps per training stage (default 3)")
    parser.add_argument("--eval-problems", type=int, default=16, help="test problems evaluated (default 16)")
    parser.add_argument("--override", default=None,
                        help="settings over the preset's, as JSON (e.g. '{\"compress\": {\"bases\": \"svd\"}}')")
    parser.add_argument("--json", default=None, help="also write the result as JSON here")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.eval_problems < 1:
        parser.error("--steps and --eval-problems must be >= 1")
    result = run(args)
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
