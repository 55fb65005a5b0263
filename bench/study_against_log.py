"""The re-made study against the lost one: each seed-0 cell beside the seed-0 tables docs/log.md printed on 2026-11-26.

    python bench/study_against_log.py data/in-progress/study    # or runs/study, data/sweeps/study

The lost folder's seed 0 survives only as printed tables (docs/log.md, "The
study, seed 0"): accuracy to 0.1 point and answer-token loss to 0.001, for
the `tuned` and `paper` protocols (the truncation baselines' rows repeat
under both, as `published` rows in a folder). This reads those tables back
and says, cell by cell, whether the re-made folder's seed-0 rows give the
same printed digits. The same code, seed and kind of machine should: a
difference means something changed a result.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTION = ("## The study, seed 0 (2026-11-26)", "## The study, three seeds (2026-11-26)")
CELL = re.compile(r"([\d.]+) \[[^]]*\] / ([\d.]+) \[")  # "71.5 [65.5, 77.5] / 0.047 [0.040, 0.055]"
ROW = re.compile(r"\| `([\w-]+)` \|(.*)\|$")


def printed_cells(log: Path) -> dict[tuple[str, str, float], tuple[float, float]]:
    """(protocol, method, target) -> (accuracy %, loss) from the absolute tables of the log's seed-0 section."""
    lines = log.read_text(encoding="utf-8").splitlines()
    section = lines[lines.index(SECTION[0]):lines.index(SECTION[1])]
    cells: dict[tuple[str, str, float], tuple[float, float]] = {}
    protocol, sizes = "tuned", []
    for line in section:
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


def folder_cells(folder: Path, seed: int = 0) -> dict[tuple[str, str, float], tuple[float, float]]:
    """(protocol, method, target) -> (accuracy %, loss) of one seed's rows of a sweep folder (dense rows left out)."""
    rows = (json.loads(line) for line in (folder / "results.jsonl").open(encoding="utf-8"))
    return {(r["protocol"], r["method"], r["target"]): (100 * r["accuracy"], r["loss"])
            for r in rows if r["seed"] == seed and r["method"] != "dense"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", nargs="?", default="runs/study", help="the re-made study's folder (default: runs/study)")
    args = p.parse_args(argv)
    old, new = printed_cells(ROOT / "docs" / "log.md"), folder_cells(Path(args.folder))
    agree, differ, missing = 0, [], []
    for (protocol, method, target), (accuracy, loss) in sorted(old.items()):
        now = new.get((protocol, method, target)) or new.get(("published", method, target))
        if now is None:
            missing.append((protocol, method, target))
        elif abs(now[0] - accuracy) < 0.05 and abs(now[1] - loss) < 0.0006:  # the same printed digits
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
