"""Issue 43's GPU work as pieces of about 15 minutes of device time: every call, what it carries, what it costs.

    python bench/gpu_study/plan.py            # the plan as a markdown table (README.md holds a copy)
    python bench/gpu_study/plan.py --piece 2  # one piece's calls, ready to issue

A piece is what one session with a GPU does: its calls are issued one right
after the other (the machine keeps /tmp only while it stays warm, about 30 s
after a call), then the machine is given back and the results merged here.
The sweep pieces' flags live here as lists (:data:`SEEDS`, :data:`PAPER_SCHEDULE`)
so that tests/test_gpu_scripts.py can check them against bsi's own parser and
grid: the study's seeds 3-5 must prune along the same path as seeds 0-2.

Expected device times are estimates, not measurements: from the H200 figures
of the study's seed 2 (docs/benchmarks.md: engine paths 52-85 s, a recovery
about 2.6 s, an evaluation of 200 answers and 400 scored problems 3-7 s,
the fine-tune 6 s) and the CPU figures of the presets; a start costs 1-2
minutes more. The first call of each piece says whether they hold.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass

#: `bsi sweep` flags of item 2: seeds of the study for bsi, basel and svd-llm under `tuned`, float32 like seeds 0-2.
#: The targets stay the preset's (0.6 ... 0.05 and 0.02 for bsi and basel): the engine prunes along one path through
#: every size, and fewer sizes would give the rounds another split (tests/test_gpu_scripts.py checks it), so the
#: cells at 0.6, 0.4 and 0.25 would not be the procedure seeds 0-2 ran. The deeper cells come along (14 more cells).
SEEDS = ["--preset", "study", "--methods", "bsi,basel,svd-llm", "--protocols", "tuned", "--dtype", "float32"]

#: `bsi sweep` flags of item 3: the published engine (`paper`) on the schedule docs/method.md section 14 found it
#: survives: about 10 tuning steps between cuts of about 4%. The paper cells' path goes from the full-rank factors
#: (1.49x the dense size on the embedded model) to 0.25 (protocol_targets): 40 rounds cut about 4.3% each, every round
#: 12 iterations, 10 tuning and 2 profiling (sampling ratio 0.17: round(0.17 x 12) = 2). A new folder: the schedule is
#: part of a sweep's fingerprint, so these rows cannot join runs/study (a protocol of its own in bsi/config.py could).
PAPER_SCHEDULE = ["--preset", "study", "--protocols", "paper", "--rounds", "40", "--iters-per-epoch", "480",
                  "--sampling-ratio", "0.17", "--dtype", "float32"]
PAPER_SCHEDULE_NAME = "paper, 40 rounds of 12 iterations (10 tuning, 2 profiling)"

#: The schedule alone: with any ``--protocols`` and ``--methods`` these flags make one sweep (protocols, methods and
#: seeds are outside its fingerprint), so rows of `paper`, the one-change protocols (`paper-whitened`,
#: `paper-layer-probes`) and `tuned` on this schedule merge into data/sweeps/paper-40x12-one-change-h100.
SCHEDULE = [flag for flag in PAPER_SCHEDULE if flag not in ("--protocols", "paper")]

#: `tuned` along the same path as `paper` (0.25 in 40 rounds): without it, its path would go on to 0.02 in 40 rounds,
#: cutting more each round (protocol targets are outside the fingerprint, so the rows still merge).
TUNED_TO_025 = ["--protocol-targets", "tuned:0.6,tuned:0.4,tuned:0.25"]

#: Item 2's next call (issue 55): four sweeps side by side on the one GPU (bench/gpu_study/parallel.sh; on
#: 2026-11-27 three of them shared an H100 at little cost to each). `tuned` on the published schedule tests the
#: reading that the one-probe curvature and the untested first-order terms put `basel` ahead of `bsi` under
#: `paper-whitened`; seed 1 of `paper-whitened` gives that gap a second run.
ONE_CHANGE_RUNS = (
    ("tuned-bsi", SCHEDULE + ["--protocols", "tuned", "--methods", "bsi", "--seeds", "0"] + TUNED_TO_025),
    ("tuned-basel", SCHEDULE + ["--protocols", "tuned", "--methods", "basel", "--seeds", "0"] + TUNED_TO_025),
    ("whitened-bsi-1", SCHEDULE + ["--protocols", "paper-whitened", "--methods", "bsi", "--seeds", "1"]),
    ("whitened-basel-1", SCHEDULE + ["--protocols", "paper-whitened", "--methods", "basel", "--seeds", "1"]),
)


def parallel_call(runs: tuple[tuple[str, list[str]], ...], seconds: int, what: str) -> Call:
    """Several sweeps at once (parallel.sh): the work call, carrying model part b."""
    pairs = " ".join(f"{name} {shlex.quote(' '.join(flags))}" for name, flags in runs)
    return Call((".gpu-b",), f"SWEEP_S={seconds} bash bench/gpu_study/parallel.sh {pairs}", seconds + 60, seconds, what)


@dataclass(frozen=True)
class Call:
    carry: tuple[str, ...]
    command: str
    timeout_s: int
    expect_s: int  # estimated seconds of the command itself
    what: str
    optional: bool = False  # only when the piece has the time left (not in its expected total)


@dataclass(frozen=True)
class Piece:
    number: int
    item: str
    prepare: str  # here, before the piece
    calls: tuple[Call, ...]
    merge: str  # here, after the piece (<files> is the reply's files_at)
    returns: str

    @property
    def expect_s(self) -> int:
        return sum(c.expect_s for c in self.calls if not c.optional) + 90  # a start: 1-2 minutes


SETUP_A = Call((".gpu-a",), "bash bench/gpu_study/setup.sh", 120, 20, "keep model part a (and the sweep copy), install "
               "gguf, check bsi imports")
SETUP_A2 = Call((".gpu-a2",), "bash bench/gpu_study/setup.sh", 120, 15, "keep model part a2")
SETUP_A3 = Call((".gpu-a3",), "bash bench/gpu_study/setup.sh", 120, 15, "keep model part a3")


def sweep_call(flags: list[str], seconds: int, what: str, resume: bool = False) -> Call:
    """A sweep call: the first carries model half b; a resumed one (optional) continues in the warm machine's copy."""
    env = f"SWEEP_S={seconds}" + (" RESUME=/tmp/study-gpu" if resume else "")
    return Call(() if resume else (".gpu-b",), f"{env} bash bench/gpu_study/run.sh {shlex.join(flags)}", seconds + 50,
                seconds, what, optional=resume)


PIECES = (
    Piece(1, "1: `bsi compress` in bf16 and fp32 (default, demo) + bf16 rounds against fp32",
          "bash bench/gpu_study/prepare.sh",
          (SETUP_A, SETUP_A2, SETUP_A3, Call((".gpu-b",), "BUDGET=510 bash bench/gpu_study/compress.sh", 570, 420,
                       "join and install the model, 4 compress runs (2 fine-tunes), then bf16_rounds on `default`")),
          "python bench/gpu_report.py <files>/compress.json <files>/bf16.json --cpu default=data/runs/default "
          "--cpu demo=runs/demo", "compress.json, bf16.json, compress.log"),
    Piece(2, "2: study seed 3, then seed 4 if the piece has 8 minutes left (bsi, basel, svd-llm; tuned; float32)",
          "bash bench/gpu_study/prepare.sh runs/study",
          (SETUP_A, SETUP_A2, SETUP_A3, sweep_call(SEEDS + ["--seeds", "3"], 420, "seed 3: 20 cells, 3 paths (about 5.5 min)"),
           sweep_call(SEEDS + ["--seeds", "4"], 420, "only with 8 minutes of device time left: seed 4 into the same "
                                                     "copy (each seed on one machine)", resume=True)),
          "for f in <files of each call>/study.tgz; do rm -rf /tmp/study; tar xzf $f -C /tmp && "
          "bsi sweep --preset study --out runs/study --merge /tmp/study; done",
          "study.tgz from each sweep call (the folder and sweep.log)"),
    Piece(3, "2: the seeds piece 2 left (5, and 4 if it did not run)",
          "bash bench/gpu_study/prepare.sh runs/study   # the merged folder",
          (SETUP_A, SETUP_A2, SETUP_A3, sweep_call(SEEDS + ["--seeds", "5"], 420, "seed 5"),
           sweep_call(SEEDS + ["--seeds", "4"], 420, "seed 4, if piece 2 did not run it", resume=True)),
          "as piece 2", "study.tgz from each sweep call"),
    Piece(4, "3: the published engine on its schedule, seed 0 (bsi, then basel)",
          "bash bench/gpu_study/prepare.sh   # later pieces: prepare.sh runs/study-paper-40x12",
          (SETUP_A, SETUP_A2, SETUP_A3, sweep_call(PAPER_SCHEDULE + ["--methods", "bsi,basel", "--seeds", "0"], 540,
                             "bsi's 40-round path (estimated 5-10 min), then basel's as far as SWEEP_S goes")),
          "tar xzf <files>/study.tgz -C /tmp && bsi sweep --preset study --protocols paper --rounds 40 "
          "--iters-per-epoch 480 --sampling-ratio 0.17 --out runs/study-paper-40x12 --merge /tmp/study; "
          "python bench/gpu_report.py --sweep runs/study-paper-40x12 --against runs/study",
          "study.tgz (sweep.log has every round's time)"),
    Piece(5, "4: the dashboard on the GPU, a `default` run from Start to Done", "DASHBOARD=1 bash bench/gpu_study/prepare.sh",
          (SETUP_A, SETUP_A2, SETUP_A3, Call((".gpu-b",), "bash bench/gpu_study/install.sh", 90, 40, "join, install, convert the model"),
           Call((".gpu-c",), "BUDGET=420 bash bench/gpu_study/dashboard.sh", 480, 200,
                "install gradio, start app.py, drive a default run (fine-tune included: a fresh cache)")),
          "python bench/gpu_report.py <files>/dashboard.json", "dashboard.json, dashboard.log"),
    Piece(7, "issue 55, item 2 continued: `tuned` on the published schedule, `paper-whitened` seed 1 (bsi, basel)",
          "bash bench/gpu_study/prepare.sh",
          (SETUP_A, SETUP_A2, SETUP_A3, parallel_call(ONE_CHANGE_RUNS, 480, "four 40-round paths side by side "
                                                      "(each about 4-5 min alone, 2026-11-27)")),
          "cp -r data/sweeps/paper-40x12-one-change-h100 runs/one-change; for n in tuned-bsi tuned-basel "
          "whitened-bsi-1 whitened-basel-1; do tar xzf <files>/$n.tgz -C /tmp && bsi sweep "
          + " ".join(SCHEDULE) + " --protocols paper,paper-whitened,paper-layer-probes,tuned --methods bsi,basel "
          "--out runs/one-change --merge /tmp/$n/study; done",
          "one NAME.tgz per sweep (its folder and sweep.log), smi.csv"),
    Piece(6, "5: the 7B shape end to end in bf16 (random weights) + the conversion's SVD", "(nothing to carry)",
          (Call((), "python bench/gpu.py --sections e2e svd --budget 480 --json $OUT/e2e.json", 560, 480,
                "build, conversion (251 s measured before), 2 rounds, 8 recovery steps, export, reload; then SVD ways"),),
          "python bench/gpu_report.py <files>/e2e.json", "e2e.json"),
)


def markdown() -> str:
    lines = ["| piece | item | here first | call | carry | command | timeout_s | expected | back, then here |",
             "|---|---|---|---|---|---|---|---|---|"]
    for piece in PIECES:
        for i, call in enumerate(piece.calls):
            first = i == 0
            what = ("(optional) " if call.optional else "") + call.what
            lines.append(f"| {piece.number if first else ''} | {piece.item if first else ''} | "
                         f"{'`' + piece.prepare + '`' if first else ''} | {i + 1}: {what} | "
                         f"{', '.join(call.carry) or '-'} | `{call.command}` | {call.timeout_s} | ~{call.expect_s} s | "
                         f"{(piece.returns + '; `' + piece.merge + '`') if i == len(piece.calls) - 1 else ''} |")
        lines.append(f"| | | | piece total, a start included | | | | ~{piece.expect_s / 60:.0f} min | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--piece", type=int, help="print one piece's calls")
    args = p.parse_args(argv)
    if args.piece is None:
        print(markdown())
        return 0
    piece = next((x for x in PIECES if x.number == args.piece), None)
    if piece is None:
        raise SystemExit(f"--piece must be one of {', '.join(str(x.number) for x in PIECES)}")
    print(f"# piece {piece.number}, item {piece.item}\n# here: {piece.prepare}")
    for call in piece.calls:
        print(("# only with the time left:\n" if call.optional else "")
              + f"run(command={call.command!r}, carry={list(call.carry)}, timeout_s={call.timeout_s})")
    print(f"# back here: {piece.merge}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
