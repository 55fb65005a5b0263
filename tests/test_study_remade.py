"""The re-made study reproduces the lost one: its seed-0 rows give the digits docs/log.md printed on 2026-11-26."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "data" / "sweeps" / "study"
FOLDERS = [SHIPPED]


def bench():
    return load_script(ROOT / "bench" / "study_against_log.py")


def test_the_printed_seed_0_tables_are_read_back_whole():
    cells = bench().printed_cells(ROOT / "docs" / "log.md")
    # 7 methods at 6 sizes under `tuned` (bsi and basel at 0.02 too), 3 engine methods at 3 sizes under `paper`,
    # the 4 truncations' 24 rows printed again under `paper`
    assert len(cells) == 6 * 7 + 2 + 3 * 3 + 24
    assert cells[("tuned", "bsi", 0.6)] == (71.5, 0.047) and cells[("paper", "basel", 0.4)] == (0.0, 5.431)


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.parent.name)
def test_every_re_made_seed_0_cell_gives_the_printed_digits(folder):
    module = bench()
    printed, made = module.printed_cells(ROOT / "docs" / "log.md"), module.folder_cells(folder)
    compared = 0
    for (protocol, method, target), (accuracy, loss) in printed.items():
        now = made.get((protocol, method, target)) or made.get(("published", method, target))
        if now is not None:
            compared += 1
            assert abs(now[0] - accuracy) < 0.05 and abs(now[1] - loss) < 0.0006, (protocol, method, target, now)
    assert compared == len(printed)  # every printed cell: the shipped study holds all of seed 0


def test_the_printed_three_seed_tables_are_read_back_whole():
    module = bench()
    pooled = module.printed_pooled_cells(ROOT / "docs" / "log.md")
    assert len(pooled) == 7 * 6 + 2  # seven methods at six sizes, bsi and basel at 0.02 too
    assert pooled[("bsi", 0.15)] == (6.2, 0.509) and pooled[("svd", 0.05)] == (0.2, 6.397)
    by_seed = module.printed_seed_differences(ROOT / "docs" / "log.md")
    assert len(by_seed) == 3 * 6 * 3  # basel, svd-llm, bsi-grad at six sizes, three seeds
    assert by_seed[("basel", 0.6, 0)] == (7.5, 0.002) and by_seed[("bsi-grad", 0.05, 2)] == (-5.5, -0.033)


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.parent.name)
def test_seeds_0_and_1_give_the_printed_per_seed_differences(folder):
    """Seeds 0 and 1 ran on the 2-core CPU both times: their differences from `bsi` must not move."""
    module = bench()
    cells = module.folder_seed_cells(folder)
    compared = 0
    for (method, target, seed), (accuracy, loss) in module.printed_seed_differences(ROOT / "docs" / "log.md").items():
        mine, theirs = cells.get(("bsi", target, seed)), cells.get((method, target, seed))
        if seed in (0, 1) and mine and theirs:
            compared += 1
            assert abs(mine[0] - theirs[0] - accuracy) < 0.051, (method, target, seed)
            assert abs(mine[1] - theirs[1] - loss) < 0.0006, (method, target, seed)
    assert compared == 2 * 3 * 6


def test_seed_2_is_compared_in_full_and_the_pooled_cells_exist():
    """Seed 2 moved from a GPU to the CPU: its differences are compared (and may differ), none is missing."""
    module = bench()
    lines = module.three_seed_comparison(ROOT / "docs" / "log.md", SHIPPED)
    assert lines[0].startswith("pooled `tuned` cells (three seeds): the same printed digits ")
    same, other = (int(n) for n in re.findall(r"(\d+)", lines[0].split(":", 1)[1]))
    assert same + other == 7 * 6 + 2  # every printed pooled cell has its three seeds in the folder
    per_seed = next(line for line in lines if line.startswith("per-seed differences"))
    counts = re.findall(r"seed (\d) the same (\d+), other (\d+)", per_seed)
    assert [(s, int(a) + int(b)) for s, a, b in counts] == [("0", 18), ("1", 18), ("2", 18)]
