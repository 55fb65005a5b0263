"""The typed result record: ``summary.json`` read and written through :class:`bsi.results.RunSummary`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bsi.cli.commands import summary_table
from bsi.errors import BSIError
from bsi.results import Metrics, RunSummary, StudyRow, read_study_rows

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("run", ["default", "tour"])
def test_a_shipped_summary_reads_typed_and_writes_back_byte_for_byte(run):
    text = (ROOT / "data" / "runs" / run / "summary.json").read_text(encoding="utf-8")
    data = json.loads(text)
    result = RunSummary.from_dict(data)
    assert result.to_dict() == data
    assert json.dumps(result.to_dict(), indent=2, sort_keys=True) + "\n" == text  # the file format is unchanged
    assert isinstance(result.metrics_after, Metrics) and 0 <= result.metrics_after.accuracy <= 1
    assert math.isclose(result.compression_ratio, data["params_before"] / data["params_after"])


def small(**changes) -> RunSummary:
    fields = dict(method="bsi", model="m", data="d", params_before=1000, params_after=500,
                  compressible_params_before=800, compressible_params_after=300,
                  metrics_before=Metrics(0.5, 0.2, 10), metrics_after=Metrics(0.6, 0.1, 10), seconds=12.0,
                  config={"recover": {"steps": 4}})
    return RunSummary(**(fields | changes))


def test_the_ratios_are_derived_and_the_optional_parts_appear_only_when_set():
    data = small().to_dict()
    assert data["compression_ratio"] == 2.0 and data["compressible_ratio"] == 0.375
    assert "metrics_dense_recovered" not in data and "perplexity" not in data and "bytes_on_disk" not in data
    data = small(metrics_dense_recovered=Metrics(0.7, 0.05, 10), bytes_on_disk=3, bytes_before=4).to_dict()
    assert data["metrics_dense_recovered"]["accuracy"] == 0.7 and (data["bytes_on_disk"], data["bytes_before"]) == (3, 4)
    assert RunSummary.from_dict(data) == small(metrics_dense_recovered=Metrics(0.7, 0.05, 10), bytes_on_disk=3,
                                               bytes_before=4)


def test_an_older_summary_reads_with_defaults_and_a_non_summary_is_refused_in_one_line():
    old = {k: v for k, v in small().to_dict().items() if k not in ("paired", "protocol_deviations", "notes", "task")}
    result = RunSummary.from_dict(old)
    assert result.paired == {} and result.notes == () and result.task == "qa"
    with pytest.raises(BSIError, match="not a run summary: it has no params_after") as err:
        RunSummary.from_dict({"params_before": 1, "compressible_params_before": 1, "compressible_params_after": 1})
    assert "\n" not in str(err.value)


def test_the_cli_table_reads_the_record_and_its_dict_alike():
    result = small(metrics_dense_recovered=Metrics(0.7, 0.05, 10))
    table = summary_table(result)
    assert table == summary_table(result.to_dict())
    assert "dense + 4 steps" in table and "50.0%" in table and "60.0%" in table and "2.00x whole model" in table


# ------------------------------------------------------------------ a study's rows (results.jsonl)
@pytest.mark.parametrize("sweep", ["study-quick", "study-quick-seed1", "text"])
def test_a_shipped_sweeps_rows_read_typed_and_write_back_unchanged(sweep):
    path = ROOT / "data" / "sweeps" / sweep / "results.jsonl"
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = read_study_rows(path)
    assert len(rows) == len(lines)
    for row, line in zip(rows, lines):
        assert json.dumps(row.to_dict(), sort_keys=True) == json.dumps(line, sort_keys=True)  # the file format is unchanged
        assert row.extra == {}  # every key the sweep writes has a name
    dense = [r for r in rows if r.is_reference]
    assert dense and all(r.run is None and r.recovered and r.compression_ratio == 1.0 for r in dense)
    compressed = [r for r in rows if not r.is_reference]
    assert all(r.run is not None and r.recovered == (r.recover_steps > 0) for r in compressed)
    assert all(r.params_total < r.params_before for r in compressed)
    assert all(r.is_text == (sweep == "text") for r in rows)


def test_a_decode_time_below_the_noise_gives_no_speedup_instead_of_a_crash():
    """On a loaded machine one more token can time at 0 ms (clamped): the row is still written, its ratio NaN."""
    line = {"method": "bsi", "target": 0.5, "params_total": 10, "accuracy": 0.5, "loss": 1.0, "examples": 4,
            "recover_steps": 0, "ms_per_token": 0.0, "dense_ms_per_token": 3.0, "speedup": 0.0}
    row = StudyRow.from_dict(line)
    assert math.isnan(row.speed.speedup)
    written = json.loads(json.dumps(row.to_dict()))
    assert written["ms_per_token"] == 0.0 and math.isnan(written["speedup"])


def test_a_study_row_keeps_unknown_keys_and_leaves_out_what_it_was_not_given():
    line = {"method": "bsi", "target": 0.5, "params_total": 10, "accuracy": 0.5, "loss": 1.0, "examples": 4,
            "recover_steps": 0, "ms_per_token": 2.0, "dense_ms_per_token": 3.0, "speedup": 1.5, "later_key": [1]}
    row = StudyRow.from_dict(line)
    assert row.extra == {"later_key": [1]} and not row.recovered and row.speed.speedup == 1.5
    written = row.to_dict()
    assert written["later_key"] == [1] and "fingerprint" not in written and "outcomes" not in written
    assert written["recover_lr"] is None and written["notes"] == []  # a method's run writes all of its keys
    assert StudyRow.from_dict(written) == row
    assert "recover_seconds" not in row.result() and "eval_seconds" not in row.result()


def test_a_bad_results_line_is_named_in_one_line(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text('{"method": "bsi", "target": 0.5, "params_total": 1}\n{"method": "x"}\n')
    with pytest.raises(BSIError, match=r"line 2: missing field\(s\) target, params_total"):
        read_study_rows(path)
    path.write_text('{"method": "bsi", "target": "half", "params_total": 1}\n')
    with pytest.raises(BSIError, match="line 1: .*must be numbers"):
        read_study_rows(path)
    path.write_text('{"method": "bsi", "target": 0.5, "params_total": 1}\n')
    with pytest.raises(BSIError, match="line 1: missing field\\(s\\) accuracy, loss"):
        read_study_rows(path, needs=("method", "accuracy", "loss"))
