"""`bsi compress` on real weights, timed stage by stage: presets x dtypes on one device (issue 43, item 1).

    python bench/gpu_compress.py --json $OUT/compress.json              # on a GPU: default and demo, bf16 and fp32
    python bench/gpu_compress.py --runs smoke:bfloat16,smoke:float32 --device cpu --json /tmp/c.json  # CPU dry run

Each run is the pipeline ``bsi compress --preset P --dtype D --device X`` runs
(:class:`bsi.pipeline.runner.Pipeline`, saved into ``--runs-dir``), driven
here so that every stage is timed from the pipeline's own reports: the
pipeline records only the whole run's ``seconds`` in ``summary.json`` and
each evaluation's ``seconds`` in its ``EvalReport``; the stage events
(``StageReport`` start / end) carry no time. So this script stamps each
event as it arrives (the reports follow the GPU work: every step reads its
loss back) and derives:

* ``load``: task and model loaded (the embedded model converted on a fresh cache);
* ``finetune``: stage 1 (``cached`` when the fine-tune came from the cache:
  the cache key holds the dtype, so the first run of each dtype fine-tunes);
* ``conversion``: from the compression's start to its first tuning step
  (calibration batches, the whitened SVD of every layer);
* ``rounds``: the pruning rounds, to the end of the compression;
* ``recovery``: stage 3;
* ``evaluation``: both evaluations (dense fine-tuned and compressed), each
  also on its own (``evaluate:finetuned``, ``evaluate:recovered``);
* ``save``: the model, ``summary.json``, ``rounds.jsonl`` and ``outcomes.jsonl`` written;
* ``first_round_s``: from the run's start to the first round's report.

Each run's entry also holds its accuracy and answer-token loss before and
after, the compression ratio, eps, notes, the peak GPU memory, and every
test problem's outcome (``correct``, ``loss_sum``, ``tokens``) of the dense
and the compressed model with a hash of the questions, so that
``bench/gpu_report.py`` can pair them with the same preset's 2-core CPU run
(``outcomes.jsonl`` of its run folder) and give paired intervals.

``--profile PRESET:DTYPE`` runs that one once more after the timed runs,
under ``torch.profiler`` (which slows it: its times are not the table's),
and writes the operations that took the most device time (CPU time on a
CPU) to ``<json>-profile.txt``: where to look when a stage misses its target.
The profiler records one stage, ``--profile-stage`` (default ``compress``:
the conversion and the pruning rounds), or the whole run (``all``): each
operation is an event the profiler sorts out afterwards, and on the CPU a
whole smoke run (about a second) held 126,505 of them and took 5.9 s to
sort out, its compress stage 85,917 and 4.2 s, its recovery 14,137 and
0.6 s (2026-12-02, one thread); a long run on a GPU holds millions.

``--budget`` bounds the whole script: a run that would start with less than
``--min-start`` seconds left is skipped, a run in progress is stopped
between two reports once the budget is spent (its stages so far are kept,
``complete: false``), and the JSON file is rewritten after every stage, so
a command killed at the device's limit still leaves what it measured.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # this checkout's bsi first
from common import machine

from bsi.config import PRESETS, make_config
from bsi.errors import BSIError
from bsi.files import atomic_write_json
from bsi.pipeline.runner import Pipeline
from bsi.reports import DoneReport, EvalReport, RoundReport, StageReport, StepReport

DEFAULT_RUNS = "default:bfloat16,default:float32,demo:bfloat16,demo:float32"
DTYPES = ("float32", "bfloat16", "float16")


def parse_runs(text: str) -> list[tuple[str, str]]:
    """``"default:bfloat16,demo:float32"`` -> ``[("default", "bfloat16"), ("demo", "float32")]``, checked."""
    runs = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        preset, _, dtype = item.partition(":")
        if preset not in PRESETS or dtype not in DTYPES:
            raise BSIError(f"--runs takes PRESET:DTYPE items (presets {', '.join(PRESETS)}; dtypes "
                           f"{', '.join(DTYPES)}), got '{item}'")
        runs.append((preset, dtype))
    if not runs:
        raise BSIError("--runs needs at least one PRESET:DTYPE item")
    return runs


class StageClock:
    """Wall time of each pipeline stage, from the reports as they arrive (seconds since the run started)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.opened: dict[str, float] = {}
        self.seconds: dict[str, float] = {}
        self.marks: dict[str, float] = {}
        self.cached: dict[str, bool] = {}

    def now(self) -> float:
        return time.perf_counter() - self.start

    def see(self, report: object) -> None:
        now = self.now()
        if isinstance(report, StageReport):
            key = f"evaluate:{report.detail}" if report.stage == "evaluate" and report.event == "start" else report.stage
            if report.event == "start":
                self.opened[key] = now
                if report.stage == "evaluate":
                    self.opened["evaluate"] = now
            elif report.event == "end":
                if report.stage == "evaluate":  # closed by its EvalReport (which names the model)
                    return
                self.seconds[report.stage] = self.seconds.get(report.stage, 0.0) + now - self.opened.pop(key, now)
                self.cached[report.stage] = report.cached
                self.marks[f"{report.stage}_end"] = now
            if report.event == "start":
                self.marks.setdefault(f"{report.stage}_start", now)
        elif isinstance(report, EvalReport):
            began = self.opened.pop("evaluate", now)
            self.opened.pop(f"evaluate:{report.when}", None)
            self.seconds[f"evaluate:{report.when}"] = now - began
        elif isinstance(report, StepReport):
            self.marks.setdefault(f"first_{report.stage}", now)
            self.marks[f"last_{report.stage}"] = now
        elif isinstance(report, RoundReport):
            self.marks.setdefault("first_round", now)
            self.marks["last_round"] = now

    def stages(self) -> dict[str, float | None]:
        """The table's stages (None: not reached, or not run)."""
        m, s = self.marks, self.seconds
        tuning = min((m[k] for k in ("first_train", "first_profile") if k in m), default=None)
        conversion = tuning - m["compress_start"] if tuning is not None and "compress_start" in m else None
        rounds = m["compress_end"] - tuning if tuning is not None and "compress_end" in m else None
        evaluations = [v for k, v in s.items() if k.startswith("evaluate:")]
        return {"load": s.get("load"), "finetune": s.get("finetune", 0.0 if "finetune" in self.cached else None),
                "conversion": conversion, "rounds": rounds, "recovery": s.get("recover"),
                "evaluation": sum(evaluations) if evaluations else None, "save": s.get("save"),
                **{k: v for k, v in s.items() if k.startswith("evaluate:")}}


def questions_sha(pipeline: Pipeline) -> str | None:
    """A hash of the test questions, in order: two runs' outcomes pair only if theirs agree."""
    if pipeline.task is None:
        return None
    blob = "\n".join(example.question for example in pipeline.task.test)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def outcome_columns(pipeline: Pipeline) -> dict[str, dict[str, list]]:
    """Every evaluated model's per-problem outcomes (``correct``, ``loss_sum``, ``tokens``), by model."""
    out = {}
    for when, evaluation in pipeline.evaluations.items():
        columns = evaluation.columns()
        out[when] = {k: columns[k] for k in ("correct", "loss_sum", "tokens")}
    return out


def device_memory(device: torch.device) -> dict[str, float]:
    if device.type != "cuda":
        return {}
    return {"peak_gib": torch.cuda.max_memory_allocated(device) / 2**30,
            "reserved_peak_gib": torch.cuda.max_memory_reserved(device) / 2**30}


def run_one(preset: str, dtype: str, device: str, out_dir: Path, deadline: float, cache_dir: str | None,
            save: callable, now: Callable[[], float] = time.monotonic,
            seen: Callable[[object], None] = lambda report: None) -> dict:
    """One ``bsi compress`` run; its entry is rewritten through ``save`` after every stage.

    The run stops at the first report after ``now()`` passes ``deadline``;
    ``seen`` is handed every report as it comes.
    """
    config = make_config(preset, {"device": device, "dtype": dtype})
    pipeline = Pipeline(config, out_dir=out_dir, cache_dir=cache_dir, force=True)
    if pipeline.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(pipeline.device)
    clock = StageClock()
    entry: dict = {"preset": preset, "dtype": dtype, "device": str(pipeline.device), "complete": False,
                   "command": f"bsi compress --preset {preset} --dtype {dtype} --device {device} --out {out_dir}"}

    def record(summary: dict | None = None) -> dict:
        entry.update(stages=clock.stages(), finetune_cached=clock.cached.get("finetune"),
                     first_round_s=clock.marks.get("first_round"), rounds=len(pipeline.rounds),
                     wall_s=clock.now(), memory=device_memory(pipeline.device))
        if pipeline.metrics:
            entry["metrics"] = {when: m.to_dict() for when, m in pipeline.metrics.items()}
        if summary is not None:
            entry.update(complete=True, seconds=summary["seconds"], compression_ratio=summary["compression_ratio"],
                         compressible_ratio=summary["compressible_ratio"], eps=summary["eps"],
                         paired=summary["paired"], notes=summary["notes"],
                         skipped_batches=pipeline.rounds[-1].skipped_batches if pipeline.rounds else 0,
                         questions_sha=questions_sha(pipeline), outcomes=outcome_columns(pipeline))
        save(entry)
        return entry

    for report in pipeline.run():
        clock.see(report)
        seen(report)
        if isinstance(report, DoneReport):
            return record(report.summary)
        if isinstance(report, (StageReport, EvalReport)) and getattr(report, "event", "end") == "end":
            record()
        if now() > deadline:
            entry["stopped"] = f"the budget ran out during {max(clock.marks, key=clock.marks.get)}"
            return record()
    return record()


def profile_run(preset: str, dtype: str, args, root: Path, deadline: float,
                now: Callable[[], float] = time.monotonic) -> dict:
    """One more run of ``preset`` in ``dtype``, ``args.profile_stage`` of it under torch.profiler.

    The costliest operations of that stage (or of the whole run: ``all``) go
    to a text file; the profiler starts when the stage's start report comes
    and stops at its end report.
    """
    from torch.profiler import ProfilerActivity, profile

    cuda = args.device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    stage = args.profile_stage
    prof = profile(activities=activities)
    recording = {"on": False, "done": False}

    def window(report) -> None:
        if stage == "all" or recording["done"]:
            return
        ours = isinstance(report, StageReport) and report.stage == stage
        if ours and report.event == "start" and not recording["on"]:
            prof.start()
            recording["on"] = True
        elif recording["on"] and ((ours and report.event == "end") or (stage == "evaluate" and
                                                                       isinstance(report, EvalReport))):
            prof.stop()  # an evaluation has no end report of its own: its EvalReport ends it
            recording.update(on=False, done=True)

    if stage == "all":
        prof.start()
        recording["on"] = True
    try:
        entry = run_one(preset, dtype, args.device, root / f"profile-{preset}-{dtype}", deadline, args.cache_dir,
                        lambda e: None, now, window)
    finally:
        if recording["on"]:  # the whole run, or a run that stopped inside the stage
            prof.stop()
            recording.update(on=False, done=True)
    path = Path(args.json).with_name(Path(args.json).stem + "-profile.txt")
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    what = "the whole run" if stage == "all" else f"its {stage} stage"
    operations = prof.key_averages().table(sort_by=key, row_limit=40) if recording["done"] else \
        f"(the run never reached its {stage} stage)"
    path.write_text(f"{entry['command']}, {what} under torch.profiler (complete: {entry['complete']}; stages "
                    f"{entry['stages']})\n\n{operations}\n", encoding="utf-8")
    return {"run": f"{preset}:{dtype}", "stage": stage, "profiled": recording["done"], "file": path.name,
            "complete": entry["complete"], "stages": entry["stages"]}


def main(argv: list[str] | None = None, now: Callable[[], float] = time.monotonic) -> int:
    """The command line; ``now`` is what the budget is read from (seconds; a test passes its own)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", default=DEFAULT_RUNS, help=f"comma-separated PRESET:DTYPE (default: {DEFAULT_RUNS})")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (a dry run)")
    p.add_argument("--budget", type=float, default=520.0, help="seconds for the whole script (default: 520)")
    p.add_argument("--min-start", type=float, default=45.0,
                   help="start no run with fewer seconds left than this (default: 45)")
    p.add_argument("--runs-dir", help="where the run folders go (default: a temporary folder, removed at the end)")
    p.add_argument("--cache-dir", help="bsi's cache (default: $BSI_CACHE or ~/.cache/bsi)")
    p.add_argument("--json", default="bench/gpu-compress.json", help="the result file (rewritten after every stage)")
    p.add_argument("--profile", metavar="PRESET:DTYPE", help="after the timed runs, run this one under torch.profiler "
                                                             "and write its costliest operations (default: none)")
    p.add_argument("--profile-stage", default="compress",
                   choices=["finetune", "compress", "recover", "evaluate", "save", "all"],
                   help="the stage of that run the profiler records, its first time if it comes twice "
                        "(default: compress, the conversion and the rounds; all: the whole run)")
    args = p.parse_args(argv)
    runs = parse_runs(args.runs)
    profiled = parse_runs(args.profile)[0] if args.profile else None
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("bench/gpu_compress.py --device cuda needs a CUDA GPU; none is available here (--device cpu for a "
              "dry run)", file=sys.stderr)
        return 2
    deadline = now() + args.budget
    root = Path(args.runs_dir) if args.runs_dir else Path(tempfile.mkdtemp(prefix="bsi-gpu-compress-"))
    result: dict = {"kind": "compress", "machine": machine(), "budget_s": args.budget, "runs": [],
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)

    def save(entry: dict) -> None:
        if entry not in result["runs"]:
            result["runs"].append(entry)
        atomic_write_json(args.json, result)

    try:
        for preset, dtype in runs:
            left = deadline - now()
            if left < args.min_start:
                result.setdefault("not_run", []).append(f"{preset}:{dtype}")
                atomic_write_json(args.json, result)
                continue
            entry = run_one(preset, dtype, args.device, root / f"{preset}-{dtype}", deadline, args.cache_dir, save,
                            now)
            print(json.dumps({k: entry.get(k) for k in ("preset", "dtype", "complete", "stages", "first_round_s",
                                                        "metrics", "memory")}), flush=True)
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        if profiled is not None and deadline - now() >= args.min_start:
            result["profile"] = profile_run(*profiled, args, root, deadline, now)
            atomic_write_json(args.json, result)
    finally:
        if not args.runs_dir:
            shutil.rmtree(root, ignore_errors=True)
    atomic_write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
