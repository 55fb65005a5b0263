"""``bsi answers``: what the models answered, problem by problem, marked right or wrong (:mod:`bsi.analysis.answers`).

Given a run folder (``bsi compress --out``): its test problems with the
dense and the compressed model's answers side by side, the counts of each
category (lost, gained, both right, both wrong) and, with ``--only``, the
problems of one category. Given a sweep folder (``bsi sweep --out``, or a
shipped one under ``data/sweeps/``): with ``--problem N``, every method's
answer to problem N at every size; with ``--method M --beats A,B --size S``,
the problems M answers right at size S where every one of A, B is wrong.
Nothing loads a model: the answers are the ones the run or sweep stored.
"""

from __future__ import annotations

import argparse
import textwrap

from bsi.cli.flags import number_in, whole_number
from bsi.errors import BSIError


def add_arguments(p: argparse.ArgumentParser) -> None:
    from bsi.analysis.answers import CATEGORIES, REFERENCES

    p.add_argument("folder", metavar="FOLDER", help="a run folder (bsi compress --out) or a sweep folder (bsi sweep --out, "
                                                    "data/sweeps/...)")
    run = p.add_argument_group("a run")
    run.add_argument("--only", choices=CATEGORIES, help="show only the problems of one category (default: every problem)")
    run.add_argument("--reference", choices=list(REFERENCES), default="finetuned",
                     help="the dense model compared with: finetuned, or dense_recovered (the same trained with the "
                          "recovery's steps, runs made with --dense-recovery)")
    sweep = p.add_argument_group("a sweep")
    sweep.add_argument("--problem", type=whole_number(0), metavar="N",
                       help="show every model's answer to test problem N, 0-based (default: none)")
    sweep.add_argument("--method", help="with --beats and --size: the method whose right answers are listed "
                                        "(default: none)")
    sweep.add_argument("--beats", metavar="A,B", help="comma-separated methods that must all be wrong (default: none)")
    sweep.add_argument("--size", type=number_in(0, 1, include_high=True), metavar="R",
                       help="the target ratio (share of the linear layers kept) compared at (default: none)")
    sweep.add_argument("--seed", type=whole_number(0), help="the seed's problems (default: the sweep's first seed)")
    sweep.add_argument("--protocol", help="the engine methods' protocol shown (default: tuned, or the sweep's only one)")
    p.add_argument("--width", type=whole_number(20), default=60, help="characters per answer column")


def _clip(text: str | None, width: int) -> list[str]:
    """An answer as wrapped lines (its own newlines kept as ' / '), at most 4 lines."""
    if text is None:
        return ["(not answered)"]
    flat = " / ".join(part.strip() for part in text.strip().splitlines() if part.strip()) or "(empty)"
    lines = textwrap.wrap(flat, width) or [""]
    return lines[:4] if len(lines) <= 4 else [*lines[:3], lines[3][: width - 3] + "..."]


def mark(correct: bool | None) -> str:
    """``right`` / ``wrong`` / ``-`` (not answered)."""
    return "-" if correct is None else "right" if correct else "wrong"


def run_text(answers, only: str | None, width: int) -> str:
    """The terminal view of a run's answers: counts, then each problem's question, the task's answer, both answers."""
    from bsi.analysis.answers import CATEGORIES, CATEGORY_MEANINGS

    counts = answers.counts()
    dense, compressed = answers.accuracy()
    lines = [f"{answers.folder}: {len(answers.rows)} answered test problems; reference: {answers.reference_label}",
             f"accuracy: dense {100 * dense:.1f}%, compressed {100 * compressed:.1f}%"]
    lines += [f"  {name:<10} {counts[name]:>4}  {CATEGORY_MEANINGS[name]}" for name in CATEGORIES]
    rows = answers.only(only)
    lines.append(f"\n{len(rows)} problem(s)" + (f" of category {only}" if only else "") + ":")
    for row in rows:
        lines.append(f"\n#{row.index} [{row.category}] {row.question or '(question not stored)'}")
        if row.reference_answer is not None:
            lines.append(f"  task's answer: {' / '.join(row.reference_answer.splitlines())}")
        left, right = _clip(row.dense_answer, width), _clip(row.answer, width)
        lines.append(f"  {'dense (' + mark(row.dense_correct) + ')':<{width}}   compressed ({mark(row.correct)})")
        for i in range(max(len(left), len(right))):
            a = left[i] if i < len(left) else ""
            b = right[i] if i < len(right) else ""
            lines.append(f"  {a:<{width}} | {b}")
    return "\n".join(lines)


def problem_text(problem, width: int) -> str:
    """The terminal view of one sweep problem: the question, the task's answer, then every model's answer, marked."""
    lines = [f"seed {problem.seed}, problem #{problem.index}: {problem.question or '(question not stored)'}"]
    if problem.reference_answer is not None:
        lines.append(f"task's answer: {' / '.join(problem.reference_answer.splitlines())}")
    right = sum(bool(a.correct) for a in problem.answers)
    lines.append(f"{right} of {len(problem.answers)} models answer right:")
    label_width = max(len(a.label) for a in problem.answers)
    for a in problem.answers:
        text = _clip(a.answer, width)
        lines.append(f"  {a.label:<{label_width}}  {mark(a.correct):<5}  {text[0]}")
        lines += [f"  {'':<{label_width}}         {more}" for more in text[1:]]
    return "\n".join(lines)


def beats_text(answers, method: str, others: list[str], size: float, seed: int | None, width: int) -> str:
    """The problems ``method`` answers right at ``size`` where every one of ``others`` is wrong, with the counts."""
    seed = answers.seeds[0] if seed is None else seed
    wins = answers.beats(method, others, size, seed)
    counts = answers.beats_counts(method, others, size, seed)
    right = ", ".join(f"{name} {count}" for name, count in counts["right"].items())
    lines = [f"{answers.folder}, seed {seed}, size {size:g}: of {counts['answered']} answered problems, right: {right}",
             f"{len(wins)} problem(s) that {method} answers right and {', '.join(others)} all answer wrong:"]
    for index in wins:
        problem = answers.problem(index, seed)
        lines.append(f"\n#{index}: {problem.question or '(question not stored)'}")
        if problem.reference_answer is not None:
            lines.append(f"  task's answer: {' / '.join(problem.reference_answer.splitlines())}")
        for name in (method, *others):
            given = problem.at(name, size)
            lines.append(f"  {name:<10} {mark(given.correct):<5}  {_clip(given.answer, width)[0]}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from bsi.analysis.answers import read_run_answers, read_sweep_answers

    folder = Path(args.folder).expanduser()
    sweep_flags = [f for f, v in (("--problem", args.problem), ("--method", args.method), ("--beats", args.beats),
                                  ("--size", args.size), ("--seed", args.seed)) if v is not None]
    if (folder / "results.jsonl").is_file():
        if args.only:
            raise BSIError(f"--only filters a run's answers; '{folder}' is a sweep: give --problem N, or --method M "
                           "--beats A,B --size R")
        answers = read_sweep_answers(folder, args.protocol)
        if args.problem is not None:
            print(problem_text(answers.problem(args.problem, args.seed), args.width))
            return 0
        if args.method or args.beats or args.size is not None:
            missing = [f for f, v in (("--method", args.method), ("--beats", args.beats), ("--size", args.size))
                       if v is None]
            if missing:
                raise BSIError(f"--method, --beats and --size go together: add {', '.join(missing)}")
            others = [m.strip() for m in args.beats.split(",") if m.strip()]
            print(beats_text(answers, args.method, others, args.size, args.seed, args.width))
            return 0
        seeds = ", ".join(map(str, answers.seeds))
        count = answers.problem_count()
        raise BSIError(f"'{folder}' is a sweep (methods {', '.join(answers.methods)}; seeds {seeds}; {count} answered "
                       f"problems a seed): give --problem N (0 to {count - 1}), or --method M --beats A,B --size R")
    if sweep_flags:
        raise BSIError(f"{', '.join(sweep_flags)} read a sweep; '{folder}' is not one (no results.jsonl): give a "
                       "`bsi sweep --out` folder, or use --only with a run")
    print(run_text(read_run_answers(folder, args.reference), args.only, args.width))
    return 0
