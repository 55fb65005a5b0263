"""Where a whole `bsi compress` run's wall time goes: the real command sampled by py-spy, split by part of the run.

    python bench/run_profile.py                                    # the default preset (about 10 minutes on 2 cores)
    python bench/run_profile.py --preset tour --json /tmp/tour-profile.json
    python bench/run_profile.py --raw runs/profile.raw             # only re-read a recording

``bench/stage_profile.py`` times a few steps of each stage under
``torch.profiler`` (what the operators do); this script times the whole
command as a user runs it, fine-tune cache and all, by sampling its Python
stacks 25 times a second with py-spy (``pip install py-spy``; it runs the
command as its child, so nothing in bsi changes). Each part's share is the
share of samples whose stack passes through that part's function (its
*inclusive* time), so a part's figure includes what it calls. Seconds are
samples / rate; they add up to the run's wall time within the sampler's
misses. The recording is kept (``--raw``) to be read again.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # this checkout's bsi first
from common import machine

from bsi.files import atomic_write_text

#: (label, the function a sample's stack passes through, a function it must not pass through, the label it is
#: part of or None): the run's parts. Both evaluations run ``Pipeline.evaluate_stage``; the dense one inside
#: ``Pipeline.reference_stage``.
PARTS = (
    ("dense model: loading, fine-tune or its cache, evaluation", "Pipeline.reference_stage", None, None),
    ("fine-tune (nothing when cached)", "Pipeline.finetune_stage", None,
     "dense model: loading, fine-tune or its cache, evaluation"),
    ("dense evaluation", "Pipeline.evaluate_stage", None, "dense model: loading, fine-tune or its cache, evaluation"),
    ("pruning stage", "Pipeline.compress", None, None),
    ("calibration and conversion", "Compressor.convert", None, "pruning stage"),
    ("input statistics (X^T X)", "InputStatistics._hook.<locals>.hook", None, "calibration and conversion"),
    ("factorisation (Cholesky, SVD)", "whitened_bases_by.<locals>.bases", None, "calibration and conversion"),
    ("tuning steps", "Compressor._train_step", None, "pruning stage"),
    ("curvature profiling steps", "Compressor._profile_step", None, "pruning stage"),
    ("closing rounds (scores, cut, monitor loss)", "Compressor._close_round", None, "pruning stage"),
    ("the monitor batch's loss, before and after each cut", "Compressor._monitor_loss", None,
     "closing rounds (scores, cut, monitor loss)"),
    ("checkpoints", "Pipeline.checkpoint", None, "pruning stage"),
    ("recovery", "Pipeline.recover_stage", None, None),
    ("compressed evaluation", "Pipeline.evaluate_stage", "Pipeline.reference_stage", None),
    ("saving", "Pipeline.save", None, None),
    ("outside the pipeline (start, imports, summary)", "", "Pipeline._stages", None),
    ("both evaluations' scoring passes", "_score_batch", None, None),
    ("both evaluations' decode steps", "greedy_decode", None, None),
)


def function_of(frame: str) -> str:
    """``Compressor.run (bsi/method/engine.py:123)`` -> ``Compressor.run``: a py-spy frame's function name."""
    return frame.split(" (", 1)[0].strip()


def read_raw(path: Path) -> list[tuple[list[str], int]]:
    """py-spy's ``--format raw`` file: one ``frame;frame;... count`` line per distinct stack (outermost first)."""
    stacks = []
    for line in path.read_text(encoding="utf-8").splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks.append(([function_of(f) for f in stack.split(";")], int(count)))
    return stacks


#: each part's parent label and its own function, from :data:`PARTS`
PART_OF = {lbl: parent for lbl, _, _, parent in PARTS}
FUNCTION_OF_PART = {lbl: function for lbl, function, _, _ in PARTS}


def parents(label: str) -> list[str]:
    """The labels ``label`` is part of, innermost first (empty for a part of the whole run)."""
    chain: list[str] = []
    while (label := PART_OF[label]) is not None:
        chain.append(label)
    return chain


def through(label: str) -> list[str]:
    """The functions a sample's stack must pass through to count for ``label``: its own and its parents'."""
    return [f for f in (FUNCTION_OF_PART[lbl] for lbl in [label, *parents(label)]) if f]


def shares(stacks: list[tuple[list[str], int]], rate: int) -> dict:
    """Samples, seconds and share of the run for every part of :data:`PARTS`, and the busiest functions."""
    total = sum(count for _, count in stacks)
    parts: dict[str, dict] = {}
    for label, function, outside, parent in PARTS:
        needed = through(label)
        samples = sum(count for frames, count in stacks
                      if all(f in frames for f in needed) and (outside is None or outside not in frames))
        parts[label] = {"function": function, "outside": outside, "part_of": parent, "depth": len(parents(label)),
                        "samples": samples,
                        "seconds": samples / rate, "share": samples / total if total else 0.0}
    inclusive: collections.Counter[str] = collections.Counter()
    for frames, count in stacks:
        for name in set(frames):
            inclusive[name] += count
    return {"samples": total, "seconds": total / rate, "parts": parts,
            "top_functions": [{"function": name, "share": count / total} for name, count in inclusive.most_common(40)]}


def table(result: dict) -> str:
    lines = [f"`bsi compress --preset {result['preset']}`, {result['date']}, {result['machine'].get('cpu')}: "
             f"{result['seconds']:.0f} s sampled ({result['samples']} samples at {result['rate']} Hz), "
             f"wall {result.get('wall_s', float('nan')):.0f} s", "",
             "| part | seconds | share of the run |", "|---|---|---|"]
    for label, part in result["parts"].items():
        indent = "&nbsp;&nbsp;" * part["depth"]
        lines.append(f"| {indent}{label} | {part['seconds']:.0f} | {part['share']:.1%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="default")
    parser.add_argument("--rate", type=int, default=25, help="samples a second (default 25)")
    parser.add_argument("--raw", default=None, help="where to keep the recording; an existing file is only re-read")
    parser.add_argument("--json", default=None)
    parser.add_argument("flags", nargs="*", help="more flags for bsi compress, after --")
    args = parser.parse_args(argv)
    raw = Path(args.raw) if args.raw else None
    result: dict = {"preset": args.preset, "rate": args.rate, "date": time.strftime("%Y-%m-%d"), "machine": machine()}
    with tempfile.TemporaryDirectory(prefix="bsi-run-profile.") as scratch:  # the run's folder, removed at the end
        if raw is None or not raw.exists():
            spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
            if not Path(spy).exists():
                raise SystemExit("run_profile: py-spy is not installed: pip install py-spy")
            raw = raw or Path(scratch) / "profile.raw"
            command = [spy, "record", "--nonblocking", "--rate", str(args.rate), "--format", "raw", "-o", str(raw),
                       "--", sys.executable, "-m", "bsi", "compress", "--preset", args.preset,
                       "--out", str(Path(scratch) / "run"), *args.flags]
            started = time.perf_counter()
            subprocess.run(command, check=True)
            result["wall_s"] = time.perf_counter() - started
            result["command"] = f"bsi compress --preset {args.preset} {' '.join(args.flags)}".strip()
        result |= shares(read_raw(raw), args.rate)
    print(table(result))
    if args.json:
        atomic_write_text(args.json, json.dumps(result, indent=1) + "\n")  # parts in the run's order, not sorted


if __name__ == "__main__":
    main()
