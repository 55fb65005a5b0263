"""The typed result record: ``summary.json`` read and written through :class:`bsi.results.RunSummary`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bsi.cli.commands import summary_table
from bsi.errors import BSIError
from bsi.results import Metrics, RunSummary

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
