"""Issue 43's GPU scripts, dry-run on the CPU with the tiny model: what each writes is what the merge here reads.

The GPU gets about 15 minutes at a time; these tests make sure those minutes
go to measuring. Each script runs here on the smoke preset (or the tiny
shape), and the tables of bench/gpu_report.py are made from its output; the
sweep flags of bench/gpu_study/plan.py go through bsi's own parser and grid.
What needs CUDA is skipped without it.
"""

from __future__ import annotations

import itertools
import json
import math
import shlex
import socket
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import load_script

from bsi.cli import build_parser
from bsi.cli import main as bsi_main
from bsi.cli.commands import build_config
from bsi.cli.flags import overrides_from_args
from bsi.cli.sweep import settings_from_args
from bsi.config import protocol_deviations
from bsi.method.schedule import path_budgets
from bsi.pipeline.sweep import Sweep

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("load", "finetune", "conversion", "rounds", "recovery", "evaluation", "save")


def load(path: str, name: str):
    return load_script(ROOT / path, name)


@pytest.fixture(scope="module")
def report():
    return load("bench/gpu_report.py", "bench_gpu_report")


@pytest.fixture(scope="module")
def plan():
    return load("bench/gpu_study/plan.py", "bench_gpu_plan")


# ------------------------------------------------------------------ item 1: bsi compress, stage by stage
def test_compress_times_every_stage_and_its_run_is_the_pipelines_own(isolated_cache, tmp_path, report):
    script = load("bench/gpu_compress.py", "bench_gpu_compress")
    out, runs = tmp_path / "compress.json", tmp_path / "runs"
    assert script.main(["--runs", "smoke:bfloat16,smoke:float32", "--device", "cpu", "--runs-dir", str(runs),
                        "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["kind"] == "compress" and [r["dtype"] for r in result["runs"]] == ["bfloat16", "float32"]
    for run in result["runs"]:
        assert run["complete"] and run["finetune_cached"] is False  # a fresh cache; the key holds the dtype
        assert all(run["stages"][s] is not None and run["stages"][s] >= 0 for s in STAGES), run["stages"]
        assert run["stages"]["conversion"] > 0 and run["stages"]["rounds"] > 0 and run["stages"]["finetune"] > 0
        assert sum(run["stages"][s] for s in STAGES) <= run["wall_s"]
        assert 0 < run["first_round_s"] < run["wall_s"] and run["rounds"] == 2
        assert len(run["outcomes"]["recovered"]["loss_sum"]) == len(run["outcomes"]["finetuned"]["tokens"]) == 8
        assert json.loads((runs / f"smoke-{run['dtype']}" / "summary.json").read_text())["dtype"] == run["dtype"]
    bf16, fp32 = result["runs"]
    assert bf16["questions_sha"] == fp32["questions_sha"]  # the same test problems: the pairs are valid
    assert bf16["eps"] == 0.1 and fp32["eps"] == 1e-4  # the eps rule: bf16's 7 fraction bits cap it at eps_max
    assert bf16["metrics"]["recovered"]["loss"] != fp32["metrics"]["recovered"]["loss"]  # bf16 really ran

    # The reference folder is a `bsi compress` run folder: against itself, the fp32 row differs by exactly 0.
    table = report.compress_table(result, {"smoke": report.cpu_reference(runs / "smoke-float32")})
    fp32_row = next(line for line in table.splitlines() if line.startswith("| `smoke` | float32 | yes"))
    assert "+0.0 [+0.0, +0.0]" in fp32_row and "+0.0000 [+0.0000, +0.0000]" in fp32_row
    assert "| load | finetune | conversion | rounds | recovery | evaluation | save |" in table
    # bf16 minus float32 on the same machine, paired on the same problems: the difference of the two runs' figures
    dtype_rows = [line for line in table.splitlines() if line.startswith("| `smoke` | ")]
    recovered = next(line for line in dtype_rows if "compressed, recovered" in line)
    diff = 100 * (bf16["metrics"]["recovered"]["accuracy"] - fp32["metrics"]["recovered"]["accuracy"])
    assert f"{diff:+.1f} [" in recovered
    times = next(line for line in table.splitlines() if line.startswith("| `smoke` | float32 |") and "yes" not in line)
    assert times.split(" | ")[-3:-1] == ["-", "-"]  # CPU total, speed-up: PRESET_COSTS has no figure for smoke


def test_compress_stops_at_its_budget_and_keeps_what_it_measured(isolated_cache, tmp_path, report):
    # A clock that moves one second per reading, whatever the machine's speed: the deadline is 2.5 (read at 0);
    # the first run starts with 1.5 s left (read at 1), reads 2 at its first report (load starts) and 3 at its
    # second (load ends), and stops there, mid-run; the second run finds the budget spent (read at 4).
    readings = itertools.count()
    script = load("bench/gpu_compress.py", "bench_gpu_compress")
    out = tmp_path / "c.json"
    assert script.main(["--runs", "smoke:float32,smoke:bfloat16", "--device", "cpu", "--budget", "2.5",
                        "--min-start", "0", "--json", str(out)], now=lambda: float(next(readings))) == 0
    result = json.loads(out.read_text())
    first = result["runs"][0]
    assert first["complete"] is False and first["stopped"] == "the budget ran out during load_end"
    assert first["stages"]["load"] is not None  # what was measured before the stop is there, and nothing after
    assert [stage for stage, seconds in first["stages"].items() if seconds is not None] == ["load"]
    assert result["not_run"] == ["smoke:bfloat16"]
    assert "Not run (budget): smoke:bfloat16." in report.compress_table(result, {})


def test_compress_profiles_one_more_run_apart_from_the_timed_ones(isolated_cache, tmp_path):
    script = load("bench/gpu_compress.py", "bench_gpu_compress")
    out = tmp_path / "c.json"
    # one stage under the profiler (the recovery: its few thousand operations sort out in well under a second)
    assert script.main(["--runs", "smoke:float32", "--device", "cpu", "--profile", "smoke:float32",
                        "--profile-stage", "recover", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert len(result["runs"]) == 1 and result["profile"]["complete"]  # the profiled run is not a timed row
    assert result["profile"]["stage"] == "recover" and result["profile"]["profiled"]
    text = (tmp_path / result["profile"]["file"]).read_text()
    assert "its recover stage under torch.profiler" in text and "aten::mm" in text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compress_on_cuda_in_bf16(isolated_cache, tmp_path):
    script = load("bench/gpu_compress.py", "bench_gpu_compress")
    out = tmp_path / "c.json"
    assert script.main(["--runs", "smoke:bfloat16", "--device", "cuda", "--json", str(out)]) == 0
    run = json.loads(out.read_text())["runs"][0]
    assert run["complete"] and run["device"].startswith("cuda") and run["memory"]["peak_gib"] > 0


def test_compress_without_cuda_says_so(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here")
    script = load("bench/gpu_compress.py", "bench_gpu_compress")
    assert script.main(["--json", str(tmp_path / "c.json")]) == 2
    assert not (tmp_path / "c.json").exists()


def test_bf16_rounds_compare_the_same_weights_in_both_dtypes(isolated_cache, tmp_path, report):
    script = load("bench/bf16_rounds.py", "bench_bf16_rounds")
    out = tmp_path / "bf16.json"
    assert script.main(["--preset", "smoke", "--device", "cpu", "--rounds", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    runs = result["runs"]
    assert runs["bfloat16"]["eps"] == 0.1 and runs["float32"]["eps"] < 0.1
    assert len(runs["float32"]["rounds"]) == len(runs["bfloat16"]["rounds"]) == len(result["layers"]) == 1
    first = result["layers"][0]
    assert first["spearman"]["median"] > 0.5  # the same model: bf16 round-off does not scramble the ranking
    assert 0 <= first["pruned_jaccard"]["min"] <= first["pruned_jaccard"]["median"] <= 1
    assert first["sigma_rel"]["median"] > 0  # ... but it is not the float32 computation either
    assert "| 1 | " in report.bf16_table(result)


# ------------------------------------------------------------------ item 4: the dashboard, driven
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dashboard_run_is_driven_from_start_to_done(isolated_cache, tmp_path, report):
    script = load("bench/gpu_dashboard.py", "bench_gpu_dashboard")
    out = tmp_path / "dashboard.json"
    assert script.main(["--preset", "smoke", "--port", str(free_port()), "--budget", "300", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["outcome"] == "done" and result["last_status"].startswith("**Done**")
    assert 0 < result["server_up_s"] and 0 < result["first_round_s"] < result["done_s"]
    assert result["rounds_seen"] >= 2  # the smoke preset's two rounds were streamed
    log = out.with_suffix(".log").read_text()
    assert "bsi: live compression studio" in log
    # stopped with this client's streams still open: app.py closed the app (demo.close()), its server ended without
    # waiting for them (not Gradio giving up on it after 5 s), and the requests it cancelled printed no traceback
    assert "Closing server running on port" in log and "still running 5 s after the stop" not in log
    assert "Traceback" not in log and "ERROR" not in log
    assert result["stopped_s"] is not None
    assert "| done |" in report.dashboard_table(result)


# ------------------------------------------------------------------ item 5: the 7B shape end to end (tiny here)
def test_e2e_runs_every_stage_and_the_export_reloads_the_same_model(tmp_path, report):
    script = load("bench/gpu.py", "bench_gpu")
    out = tmp_path / "e2e.json"
    assert script.main(["--sections", "e2e", "svd", "--shape", "tiny", "--layers", "2", "--device", "cpu",
                        "--batch-size", "2", "--seq-len", "32", "--recover-steps", "2", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    e2e = result["e2e"]
    assert e2e["order"] == ["build", "conversion", "round_1", "round_2", "recovery", "export", "reload"]
    assert all(e2e["stages"][s]["seconds"] >= 0 for s in e2e["order"])
    assert e2e["params_after"] < e2e["dense_params"]  # two rounds reach half the linear layers: factors exported
    assert e2e["reload_max_logit_diff"] < 1e-2 and e2e["bytes_on_disk"] > 0
    for shape in result["svd"]["shapes"].values():
        assert all(way["relative_error"] < 1e-4 for way in shape["ways"].values()), shape
    tables = report.gpu_tables(result)
    assert "| round_2 |" in tables and "| float32, batched |" in tables


def test_e2e_budget_runs_no_stage_past_it(tmp_path):
    script = load("bench/gpu.py", "bench_gpu")
    out = tmp_path / "e2e.json"
    assert script.main(["--sections", "e2e", "--shape", "tiny", "--layers", "1", "--device", "cpu", "--budget", "0",
                        "--json", str(out)]) == 0
    stages = json.loads(out.read_text())["e2e"]["stages"]
    assert stages and all(s["note"] == "not run: the budget was spent" for s in stages.values())


def test_gpu_sections_without_cuda_say_so(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here")
    script = load("bench/gpu.py", "bench_gpu")
    assert script.main(["--sections", "train", "--json", str(tmp_path / "g.json")]) == 2
    assert script.main(["--sections", "e2e", "--json", str(tmp_path / "g.json")]) == 2  # --device cuda, the default


# ------------------------------------------------------------------ items 2 and 3: the sweep flags
def sweep_of(flags: list[str], out: Path) -> Sweep:
    args = build_parser().parse_args(["sweep", "--out", str(out), *flags])
    return Sweep(build_config(args), settings_from_args(args), out, overrides=overrides_from_args(args))


def sweep_flags(call) -> list[str]:
    words = shlex.split(call.command)
    return words[words.index("bench/gpu_study/run.sh") + 1:]


def test_new_seeds_prune_along_the_same_path_as_the_studys_seeds(tmp_path, plan):
    study = sweep_of(["--preset", "study"], tmp_path / "study")
    calls = [c for p in plan.PIECES for c in p.calls if "run.sh" in c.command and "tuned" in c.command]
    assert len(calls) == 4 and sum(c.optional for c in calls) == 2  # seeds 3-5 (4 twice: piece 3 if not piece 2)
    for call in calls:
        flags = sweep_flags(call)
        sweep = sweep_of(flags, tmp_path / "seeds")
        assert sweep.fingerprint() == study.fingerprint()  # the study folder takes its rows, and merges them
        seeds = sweep.settings.seeds
        assert len(seeds) == 1 and seeds[0] in (3, 4, 5)  # one seed per call: each seed on one machine
        cells = sweep.cells()
        assert len(cells) == 20 and all(c.startswith(("tuned/", "published/")) for c in cells)
        for method in ("bsi", "basel", "svd-llm"):
            assert sweep.config_for(seeds[0], method, "tuned").compress == study.config_for(0, method, "tuned").compress
    # Why the targets stay the preset's: a path through fewer sizes splits its rounds otherwise.
    full, short = ([int(1000 * t) for t in ts] for ts in ((0.6, 0.4, 0.25, 0.15, 0.1, 0.05, 0.02), (0.6, 0.4, 0.25)))
    at_first_stop = [next(i for i, b in enumerate(path_budgets(1490, stops, 24)) if b[2] == 0) for stops in (full, short)]
    assert at_first_stop[0] != at_first_stop[1]


def test_the_published_engine_gets_ten_tuning_steps_between_cuts_of_about_four_percent(tmp_path, plan):
    call = next(c for p in plan.PIECES for c in p.calls if "--protocols paper" in c.command)
    sweep = sweep_of(sweep_flags(call), tmp_path / "paper")
    assert sweep.settings.methods == ("bsi", "basel") and sweep.settings.protocols == ("paper",)
    for method in ("bsi", "basel"):
        config = sweep.config_for(0, method, "paper")
        c = config.compress
        assert (c.rounds, c.round_length, c.profiling_iters) == (40, 12, 2)  # 10 tuning, 2 profiling
        assert protocol_deviations(config) == [] and c.bases == "svd" and c.curvature == "hutchinson"
        assert sweep.settings.targets_of(method, "paper") == (0.6, 0.4, 0.25)
    cut = 1 - (0.25 / 1.49) ** (1 / 40)  # full-rank factors (1.49x dense on the embedded model) to 0.25
    assert 0.035 < cut < 0.05
    assert sweep.fingerprint() != sweep_of(["--preset", "study"], tmp_path / "study").fingerprint()  # its own folder
    assert "40 rounds of 12 iterations (2 profiling)" in sweep.schedule_note("paper")


def test_the_next_one_change_rows_merge_with_the_shipped_ones_along_the_same_path(tmp_path, plan):
    shipped = ROOT / "data" / "sweeps" / "paper-40x12-one-change-h100"
    fingerprints = {json.loads(line)["fingerprint"] for line in (shipped / "results.jsonl").open()}
    paper = sweep_of(plan.PAPER_SCHEDULE + ["--methods", "bsi", "--seeds", "0"], tmp_path / "paper")
    assert fingerprints == {paper.fingerprint()}  # the shipped rows are one sweep, this schedule's
    call = next(c for p in plan.PIECES for c in p.calls if "parallel.sh" in c.command)
    words = shlex.split(call.command)
    start = words.index("bench/gpu_study/parallel.sh") + 1
    pairs = dict(zip(words[start::2], words[start + 1::2]))  # the NAME FLAGS pairs
    assert list(pairs) == [name for name, _ in plan.ONE_CHANGE_RUNS]
    for name, flags in pairs.items():
        sweep = sweep_of(flags.split(), tmp_path / name)
        assert sweep.fingerprint() == paper.fingerprint(), name  # they merge into the shipped folder
        (protocol,), (method,) = sweep.settings.protocols, sweep.settings.methods
        assert sweep.settings.targets_of(method, protocol) == (0.6, 0.4, 0.25), name  # the path paper's cells took
        c = sweep.config_for(sweep.settings.seeds[0], method, protocol).compress
        assert (c.rounds, c.round_length, c.profiling_iters) == (40, 12, 2), name


def test_every_piece_fits_and_names_scripts_that_exist(plan):
    for piece in plan.PIECES:
        assert piece.expect_s < 15 * 60 and all(c.expect_s < c.timeout_s <= 600 for c in piece.calls), piece.number
        for call in piece.calls:
            for word in shlex.split(call.command):
                if word.startswith("bench/"):
                    assert (ROOT / word).is_file(), word
    for script in sorted((ROOT / "bench" / "gpu_study").glob("*.sh")):
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0, script.name
    assert plan.main([]) == 0


def test_the_schedule_row_is_compared_with_the_studys_cells(isolated_cache, tmp_path, report):
    common = ["--preset", "smoke", "--methods", "bsi,basel", "--targets", "0.6", "--seeds", "0", "--quiet"]
    assert bsi_main(["sweep", *common, "--protocols", "tuned,paper", "--out", str(tmp_path / "study")]) == 0
    assert bsi_main(["sweep", *common, "--protocols", "paper", "--rounds", "4", "--iters-per-epoch", "16",
                     "--out", str(tmp_path / "long")]) == 0
    table = report.against_table(tmp_path / "long", tmp_path / "study", "4 rounds of 4")
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert [r.split(" | ")[0] for r in rows] == ["| `bsi`", "| `basel`"]
    for row in rows:
        value, tuned, paper = row.split(" | ")[3:6]
        assert "(seeds 0)" in tuned and "(seeds 0)" in paper  # paired on the seed both folders hold
    minus = next(line for line in table.splitlines() if line.startswith("| 0.6 |"))
    assert minus.count("(seeds 0)") == 2
    loss = float(rows[0].split(" | ")[3].split(" / ")[1].split(" ")[0])
    assert math.isfinite(loss) and loss > 0
