"""The re-made study against the lost one: its cells beside the tables docs/log.md printed on 2026-11-26.

    python bench/study_against_log.py data/sweeps/study    # or a re-made folder such as runs/study

The lost folder survives only as printed tables (docs/log.md). Two kinds:

* "The study, seed 0": seed 0's accuracy to 0.1 point and answer-token loss
  to 0.001, for the `tuned` and `paper` protocols (the truncation baselines'
  rows repeat under both, as `published` rows in a folder). The same code,
  seed and kind of machine should give the same printed digits: a
  difference means something changed a result.
* "The study, three seeds": protocol `tuned` pooled over seeds 0, 1, 2 and,
  for `basel`, `svd-llm` and `bsi-grad`, each seed's own difference from
  `bsi`. The lost seed 2 ran on an H200 GPU, the re-made one on the 2-core
  CPU: float32 on both, but not the same kernels, so seed 2 (and every pooled
  cell) may move a little, while seed 1 (CPU both times) should not.

This reads both back and says, cell by cell, where the re-made folder gives
other digits.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTION = ("## The study, seed 0 (2026-11-26)", "## The study, three seeds (2026-11-26)")
THREE_SEEDS_END = "## GPU: `bsi compress` on real weights, bf16 and float32 (2026-11-26)"
SEEDS = (0, 1, 2)
CELL = re.compile(r"([\d.]+) \[[^]]*\] / ([\d.]+) \[")  # "71.5 [65.5, 77.5] / 0.047 [0.040, 0.055]"
ROW = re.compile(r"\| `([\w-]+)` \|(.*)\|$")


def _section(log: Path, start: str, end: str) -> list[str]:
    """The log's lines from the heading ``start`` up to the heading ``end``."""
    lines = log.read_text(encoding="utf-8").splitlines()
    return lines[lines.index(start):lines.index(end)]


def same_digits(now: tuple[float, float], printed: tuple[float, float]) -> bool:
    """Whether (accuracy %, loss) rounds to the printed (0.1 point, 0.001) digits."""
    return abs(now[0] - printed[0]) < 0.051 and abs(now[1] - printed[1]) < 0.0006


def _rows(folder: Path) -> list[dict]:
    """Every row of a sweep folder's ``results.jsonl``."""
    return [json.loads(line) for line in (folder / "results.jsonl").open(encoding="utf-8")]


def printed_cells(log: Path) -> dict[tuple[str, str, float], tuple[float, float]]:
    """(protocol, method, target) -> (accuracy %, loss) from the absolute tables of the log's seed-0 section."""
    cells: dict[tuple[str, str, float], tuple[float, float]] = {}
    protocol, sizes = "tuned", []
    for line in _section(log, SECTION[0], SECTION[1]):
        if line.startswith("Protocol `paper`"):
            protocol = "paper"
        if line.startswith("| method | 0.6"):
            sizes = [float(c.split()[0]) for c in line.strip("|").split("|")[1:]]
        row = ROW.match(line)
        if row and sizes:
            for size, text in zip(sizes, (c.strip() for c in row[2].split("|"))):
                found = CELL.match(text)  # difference tables start with a sign or bold: not matched
                if found:
                    cells[(protocol, row[1], size)] = (float(found[1]), float(found[2]))
    return cells


def printed_pooled_cells(log: Path) -> dict[tuple[str, float], tuple[float, float]]:
    """(method, target) -> (accuracy %, loss) of the three-seed section's pooled `tuned` table (its first)."""
    cells: dict[tuple[str, float], tuple[float, float]] = {}
    sizes: list[float] = []
    for line in _section(log, SECTION[1], THREE_SEEDS_END):
        if line.startswith("| method | 0.6"):
            if sizes:
                break  # the second such table holds the differences
            sizes = [float(c.split()[0]) for c in line.strip("|").split("|")[1:]]
        row = ROW.match(line)
        if row and sizes:
            for size, text in zip(sizes, (c.strip() for c in row[2].split("|"))):
                found = CELL.match(text)
                if found:
                    cells[(row[1], size)] = (float(found[1]), float(found[2]))
    return cells


SEED_DIFFERENCES = re.compile(r"([-+][\d.]+), ([-+][\d.]+), ([-+][\d.]+) \[[^]]*\]; "
                              r"([-+][\d.]+), ([-+][\d.]+), ([-+][\d.]+) \[")


def printed_seed_differences(log: Path) -> dict[tuple[str, float, int], tuple[float, float]]:
    """(method, target, seed) -> `bsi` minus the method (accuracy points, loss), from the per-seed table."""
    cells: dict[tuple[str, float, int], tuple[float, float]] = {}
    sizes: list[float] = []
    for line in _section(log, SECTION[1], THREE_SEEDS_END):
        if line.startswith("| `bsi` minus |"):
            sizes = [float(c) for c in line.strip("|").split("|")[1:]]
        row = ROW.match(line)
        if row and sizes and line.count(";"):
            for size, text in zip(sizes, (c.strip() for c in row[2].split("|"))):
                found = SEED_DIFFERENCES.match(text)
                if found:
                    for seed in SEEDS:
                        cells[(row[1], size, seed)] = (float(found[1 + seed]), float(found[4 + seed]))
    return cells


def folder_seed_cells(folder: Path) -> dict[tuple[str, float, int], tuple[float, float]]:
    """(method, target, seed) -> (accuracy %, loss) of every `tuned` or `published` row of a sweep folder."""
    return {(r["method"], r["target"], r["seed"]): (100 * r["accuracy"], r["loss"])
            for r in _rows(folder) if r["protocol"] in ("tuned", "published")}


def pooled(cells: dict[tuple[str, float, int], tuple[float, float]],
           method: str, target: float) -> tuple[float, float] | None:
    """The mean over the three seeds of one cell (each seed scores the same number of problems), or None."""
    found = [cells.get((method, target, seed)) for seed in SEEDS]
    if any(cell is None for cell in found):
        return None
    return sum(c[0] for c in found) / len(found), sum(c[1] for c in found) / len(found)


def three_seed_comparison(log: Path, folder: Path) -> list[str]:
    """Lines saying where the folder's pooled cells and per-seed differences give other digits than the log."""
    cells = folder_seed_cells(folder)
    lines, same, other = [], 0, 0
    for (method, target), (accuracy, loss) in sorted(printed_pooled_cells(log).items()):
        now = pooled(cells, method, target)
        if now is None:
            continue
        if same_digits(now, (accuracy, loss)):
            same += 1
        else:
            other += 1
            lines.append(f"  pooled {method}@{target:g}: printed {accuracy:.1f}% / {loss:.3f}, "
                         f"now {now[0]:.1f}% / {now[1]:.3f} ({now[0] - accuracy:+.1f} points, {now[1] - loss:+.3f})")
    lines.insert(0, f"pooled `tuned` cells (three seeds): the same printed digits {same}, other {other}")
    by_seed = {seed: [0, 0] for seed in SEEDS}
    moved = []
    for (method, target, seed), (accuracy, loss) in sorted(printed_seed_differences(log).items()):
        mine, theirs = cells.get(("bsi", target, seed)), cells.get((method, target, seed))
        if mine is None or theirs is None:
            continue
        now = (mine[0] - theirs[0], mine[1] - theirs[1])
        if same_digits(now, (accuracy, loss)):
            by_seed[seed][0] += 1
        else:
            by_seed[seed][1] += 1
            moved.append(f"  seed {seed} bsi - {method}@{target:g}: printed {accuracy:+.1f} / {loss:+.3f}, "
                         f"now {now[0]:+.1f} / {now[1]:+.3f}")
    lines.append("per-seed differences from `bsi`: " + "; ".join(
        f"seed {seed} the same {same_}, other {other_}" for seed, (same_, other_) in by_seed.items()))
    return lines + moved


def folder_cells(folder: Path, seed: int = 0) -> dict[tuple[str, str, float], tuple[float, float]]:
    """(protocol, method, target) -> (accuracy %, loss) of one seed's rows of a sweep folder (dense rows left out)."""
    return {(r["protocol"], r["method"], r["target"]): (100 * r["accuracy"], r["loss"])
            for r in _rows(folder) if r["seed"] == seed and r["method"] != "dense"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", nargs="?", default="data/sweeps/study",
                   help="the re-made study's folder (default: data/sweeps/study)")
    args = p.parse_args(argv)
    old, new = printed_cells(ROOT / "docs" / "log.md"), folder_cells(Path(args.folder))
    agree, differ, missing = 0, [], []
    for (protocol, method, target), (accuracy, loss) in sorted(old.items()):
        now = new.get((protocol, method, target)) or new.get(("published", method, target))
        if now is None:
            missing.append((protocol, method, target))
        elif same_digits(now, (accuracy, loss)):
            agree += 1
        else:
            differ.append(((protocol, method, target), (accuracy, loss), now))
    print(f"printed seed-0 cells: {len(old)} (the truncations' rows under both protocols); "
          f"seed-0 rows in {args.folder}: {len(new)}")
    print(f"the same printed digits: {agree}; different: {len(differ)}; not re-made yet: {len(missing)}")
    for cell, printed, now in differ:
        print(f"  different: {cell}: printed {printed}, now ({now[0]:.1f}, {now[1]:.4f})")
    for cell in missing:
        print(f"  not re-made yet: {cell}")
    print("\n".join(three_seed_comparison(ROOT / "docs" / "log.md", Path(args.folder))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
