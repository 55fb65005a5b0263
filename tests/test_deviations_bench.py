"""bench/deviations.py: rows per seed, resumable, pooled table with each seed's change, old files still read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import load_script

BENCH = Path(__file__).resolve().parents[1] / "bench" / "deviations.py"


@pytest.fixture(scope="module")
def deviations():
    return load_script(BENCH, "bench_deviations")


def test_two_seeds_are_kept_apart_resumed_and_pooled(deviations, isolated_cache, tmp_path, capsys):
    out = tmp_path / "d"
    argv = ["--preset", "smoke", "--rounds", "2", "--seeds", "0,1", "--only", "bsi", "--out", str(out)]
    assert deviations.main(argv) == 0
    rows = json.loads((out / "deviations.json").read_text())
    tuned, variant = "bsi, tuned", next(label for label in rows if label.startswith("bsi-mag"))
    assert set(rows) == {tuned, variant}  # --only bsi: the two rows whose label starts with it
    assert set(rows[tuned]) == set(rows[variant]) == {"0", "1"}
    assert rows[variant]["0"]["method"] == "bsi-mag" and rows[tuned]["1"]["seed"] == 1
    # The seed reaches the run: the two seeds' tuned models score differently.
    assert rows[tuned]["0"]["loss_sum"] != rows[tuned]["1"]["loss_sum"]
    table = capsys.readouterr().out
    line = next(t for t in table.splitlines() if t.startswith(f"| {variant} |"))
    assert "| 0,1 |" in line and line.count("(seeds: ") == line.count("over seeds ") == 2  # pooled, each, over seeds

    # A second call finds every row done: nothing re-runs, the file is unchanged.
    before = (out / "deviations.json").read_text()
    assert deviations.main(argv) == 0
    assert (out / "deviations.json").read_text() == before


def test_a_one_seed_file_reads_as_seed_zero(deviations, tmp_path):
    row = {"method": "bsi", "compress": {}, "baseline": {}, "metrics": {"accuracy": 0.5, "loss": 1.0}}
    path = tmp_path / "deviations.json"
    path.write_text(json.dumps({"bsi, tuned": row}))
    assert deviations.load_rows(path) == {"bsi, tuned": {"0": row}}


def test_bad_seeds_stop_before_any_run(deviations, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        deviations.main(["--seeds", "0,one", "--out", str(tmp_path / "d")])
    assert stop.value.code == 2
    assert "--seeds takes comma-separated integers" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
