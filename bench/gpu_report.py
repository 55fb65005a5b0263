"""Tables from the GPU scripts' result files (issue 43), written here after the device returned them.

    python bench/gpu_report.py /work/.device/.../compress.json --cpu default=runs/default --cpu demo=runs/demo
    python bench/gpu_report.py bf16.json dashboard.json e2e.json > /tmp/gpu-tables.md

Each file names its ``kind`` (written by the script that made it):

* ``compress`` (``bench/gpu_compress.py``): one row per preset and dtype:
  accuracy and answer-token loss after compression, their paired difference
  from the same preset's CPU float32 run with a bootstrap 95% interval
  (:func:`bsi.analysis.stats.paired_difference`, on the same test problems:
  the question hashes must agree), the compression ratio, and the wall time
  of every stage. ``--cpu PRESET=FOLDER`` names the CPU run folder of a
  preset (its ``summary.json`` and ``outcomes.jsonl``: ``bsi compress --preset
  PRESET --out FOLDER`` on the 2-core machine); without one the row has no
  difference.
* ``bf16_rounds`` (``bench/bf16_rounds.py``): per round, how far the bf16
  engine's scores and cuts stand from float32's on the same weights.
* ``dashboard`` (``bench/gpu_dashboard.py``): time to the first round and to Done.
* ``--sweep FOLDER --against STUDY``: a sweep folder of the published
  engine on its own schedule (issue 43, item 3; ``bench/gpu_study/plan.py``),
  each engine cell beside the same method's ``tuned`` and ``paper`` cells of
  the study, with paired differences pooled over the seeds both hold and a
  t-interval over the seeds; and ``bsi`` minus ``basel`` on the new schedule.
* ``gpu`` (``bench/gpu.py``): its ``e2e`` section (seconds and peak memory
  per stage) and its ``svd`` section (seconds per matrix and reconstruction
  error of each way to factorise).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's bsi first

from bsi.analysis.stats import Outcomes, paired_difference, per_seed_differences, seed_interval, value_interval
from bsi.analysis.study import folder_loader, interval_text
from bsi.config import PRESET_COSTS
from bsi.errors import BSIError
from bsi.results import StudyRow, read_study_rows

STAGES = ("load", "finetune", "conversion", "rounds", "recovery", "evaluation", "save")


def seconds(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def cpu_reference(folder: str | Path) -> dict:
    """A CPU run folder's compressed-model outcomes, the hash of its questions, and its metrics."""
    folder = Path(folder)
    try:  # summary.json gives the CPU's wall time; without it the table has the outcomes alone
        summary = json.loads((folder / "summary.json").read_text(encoding="utf-8")) \
            if (folder / "summary.json").is_file() else {}
        lines = [json.loads(line) for line in (folder / "outcomes.jsonl").read_text(encoding="utf-8").splitlines()
                 if line.strip()]
    except (OSError, ValueError) as err:
        raise BSIError(f"'{folder}' is not a finished `bsi compress` run folder ({err}): give the --out folder of "
                       "the CPU run") from None
    mine = sorted((r for r in lines if r["model"] == "recovered"), key=lambda r: r["index"])
    sha = hashlib.sha256("\n".join(r["question"] for r in mine).encode()).hexdigest()[:16] if mine else None
    return {"summary": summary, "sha": sha, "outcomes": Outcomes.from_columns(
        {k: [r[k] for r in mine] for k in ("correct", "loss_sum", "tokens")})}


def compress_table(result: dict, cpu: dict[str, dict]) -> str:
    """The ``compress`` result as two markdown tables: quality against the CPU run, then wall time per stage."""
    device = result["machine"].get("gpu") or result["machine"].get("cpu")
    lines = [f"`bsi compress` on {device} ({result['date']}; torch {result['machine']['torch']}), the 2-core CPU "
             "float32 run of the same preset as reference (paired bootstrap 95% intervals, same test problems):", "",
             "| preset | dtype | complete | ratio | accuracy | loss | accuracy - CPU (points) | loss - CPU | "
             "CPU accuracy / loss |",
             "|---|---|---|---|---|---|---|---|---|"]
    for run in result["runs"]:
        after = (run.get("metrics") or {}).get("recovered")
        acc = f"{100 * after['accuracy']:.1f}% (n={after['examples']})" if after else "-"
        loss = f"{after['loss']:.4f}" if after else "-"
        diff_acc = diff_loss = ref_text = "-"
        ref = cpu.get(run["preset"])
        if ref is not None and run.get("outcomes", {}).get("recovered"):
            ref_text = f"{100 * ref['outcomes'].accuracy():.1f}% / {ref['outcomes'].loss():.4f}"
            if ref["sha"] != run.get("questions_sha"):
                diff_acc = diff_loss = "other problems"
            else:
                mine = Outcomes.from_columns(run["outcomes"]["recovered"])
                diff_acc = interval_text(paired_difference([mine], [ref["outcomes"]], "accuracy").to_dict(), 100, 1,
                                         signed=True)
                diff_loss = interval_text(paired_difference([mine], [ref["outcomes"]], "loss").to_dict(), 1, 4,
                                          signed=True)
        ratio = f"{run['compression_ratio']:.2f}x" if run.get("compression_ratio") else "-"
        lines.append(f"| `{run['preset']}` | {run['dtype']} | {'yes' if run['complete'] else 'no: ' + run.get('stopped', '')} "
                     f"| {ratio} | {acc} | {loss} | {diff_acc} | {diff_loss} | {ref_text} |")
    lines += ["", "Wall time per stage, seconds (fine-tune 0.0: from the cache):", "",
              "| preset | dtype | " + " | ".join(STAGES) + " | first round | total | CPU total | speed-up | peak GiB |",
              "|---|---|" + "---|" * (len(STAGES) + 5)]
    for run in result["runs"]:
        stages = run.get("stages", {})
        cpu_total = preset_cpu_seconds(run["preset"], bool(run.get("finetune_cached")))
        total = run.get("seconds")
        speed = f"{cpu_total / total:.1f}x" if cpu_total and total else "-"
        peak = run.get("memory", {}).get("peak_gib")
        lines.append(f"| `{run['preset']}` | {run['dtype']} | " + " | ".join(seconds(stages.get(s)) for s in STAGES)
                     + f" | {seconds(run.get('first_round_s'))} | {seconds(total)} | {seconds(cpu_total)} | {speed} | "
                       f"{'-' if peak is None else f'{peak:.1f}'} |")
    dtype_rows = dtype_differences(result["runs"])
    if dtype_rows:
        lines += ["", "bf16 against float32 on this device, the same preset and test problems (paired bootstrap 95% "
                      "intervals; each dtype fine-tunes its own dense model):", "",
                  "| preset | model | accuracy bf16 / fp32 | bf16 - fp32 (points) | loss bf16 - fp32 |", "|---|---|---|---|---|"]
        lines += dtype_rows
    lines += ["", "CPU total: the preset's measured `bsi compress` time on 2 cores (`bsi.config.PRESET_COSTS`), "
                  "with an empty cache where the GPU run fine-tuned, with the fine-tune cached where it did not."]
    if result.get("not_run"):
        lines += ["", f"Not run (budget): {', '.join(result['not_run'])}."]
    return "\n".join(lines)


def preset_cpu_seconds(preset: str, finetune_cached: bool) -> float | None:
    """The preset's measured 2-core CPU time, cached or not as the GPU run was (None where not measured)."""
    cost = PRESET_COSTS.get(preset)
    if cost is None:
        return None
    return cost.cached_seconds if finetune_cached else cost.uncached_seconds


def dtype_differences(runs: list[dict]) -> list[str]:
    """Table rows: each preset's bf16 run minus its float32 run, dense fine-tuned and compressed, paired."""
    by_key = {(run["preset"], run["dtype"]): run for run in runs if run.get("outcomes")}
    rows = []
    for (preset, dtype), bf16 in by_key.items():
        fp32 = by_key.get((preset, "float32"))
        if dtype != "bfloat16" or fp32 is None or fp32.get("questions_sha") != bf16.get("questions_sha"):
            continue
        for stage in ("finetuned", "recovered"):
            if not (bf16["outcomes"].get(stage) and fp32["outcomes"].get(stage)):
                continue
            a, b = Outcomes.from_columns(bf16["outcomes"][stage]), Outcomes.from_columns(fp32["outcomes"][stage])
            acc = interval_text(paired_difference([a], [b], "accuracy").to_dict(), 100, 1, signed=True)
            loss = interval_text(paired_difference([a], [b], "loss").to_dict(), 1, 4, signed=True)
            name = "dense, fine-tuned" if stage == "finetuned" else "compressed, recovered"
            rows.append(f"| `{preset}` | {name} | {100 * a.accuracy():.0f}% / {100 * b.accuracy():.0f}% | {acc} | {loss} |")
    return rows


def bf16_table(result: dict) -> str:
    device = result["machine"].get("gpu") or result["machine"].get("cpu")
    runs = result["runs"]
    if set(runs) != {"float32", "bfloat16"}:
        return f"bf16 against float32 (`{result['preset']}`, {device}): cut short, only {', '.join(runs) or 'nothing'} ran."
    lines = [f"bf16 against float32 on the same fine-tuned weights (`{result['preset']}`, protocol {result['protocol']}, "
             f"{device}; eps {runs['float32']['eps']:.3g} / {runs['bfloat16']['eps']:.3g}); per layer, median "
             "[min, max]:", "",
             "| round | importance rank correlation | pruned-set overlap | sigma rel. diff | gradient rel. diff | "
             "curvature rel. diff | monitor loss after the cut, fp32 / bf16 |", "|---|---|---|---|---|---|---|"]

    def cell(entry) -> str:
        return "-" if entry is None else f"{entry['median']:.3f} [{entry['min']:.3f}, {entry['max']:.3f}]"

    for row, a, b in zip(result["layers"], runs["float32"]["rounds"], runs["bfloat16"]["rounds"]):
        lines.append(f"| {row['round']} | {cell(row['spearman'])} | {cell(row['pruned_jaccard'])} | "
                     f"{cell(row['sigma_rel'])} | {cell(row['grad_rel'])} | {cell(row['curvature_rel'])} | "
                     f"{a['loss_after']:.4f} / {b['loss_after']:.4f} |")
    return "\n".join(lines)


def dashboard_table(result: dict) -> str:
    device = result["machine"].get("gpu") or result["machine"].get("cpu")
    return "\n".join([
        f"The dashboard on {device} (`python app.py`, preset `{result['preset']}` driven through gradio_client):", "",
        "| server up | first round | Done | rounds seen | outcome | stopped |", "|---|---|---|---|---|---|",
        f"| {seconds(result.get('server_up_s'))} s | {seconds(result.get('first_round_s'))} s | "
        f"{seconds(result.get('done_s'))} s | {result.get('rounds_seen', '-')} | {result.get('outcome', '-')} | "
        f"{seconds(result.get('stopped_s'))} s |"])


def gpu_tables(result: dict) -> str:
    """``bench/gpu.py``'s e2e and svd sections (the older sections have their own figures in docs)."""
    tables = []
    if "e2e" in result:
        e2e = result["e2e"]
        lines = [f"End to end on {result['device']} ({e2e['shape']}, {e2e['dtype']}, random weights, {e2e['bases']} "
                 f"bases, batch {e2e['batch'][0]} x {e2e['batch'][1]}):", "",
                 "| stage | seconds | peak GiB | note |", "|---|---|---|---|"]
        for name in e2e.get("order") or list(e2e["stages"]):
            stage = e2e["stages"][name]
            peak = stage.get("peak_gib")
            lines.append(f"| {name} | {seconds(stage.get('seconds'))} | {'-' if peak is None else f'{peak:.2f}'} | "
                         f"{stage.get('note', '')} |")
        tables.append("\n".join(lines))
    if "svd" in result:
        lines = [f"The conversion's factorisation on {result['device']}, seconds per matrix ({result['svd']['batch']} "
                 "matrices of each shape) / relative reconstruction error:", "",
                 "| way | " + " | ".join(f"{n} x{v['per_model']}" for n, v in result["svd"]["shapes"].items()) + " |",
                 "|---|" + "---|" * len(result["svd"]["shapes"])]
        ways = list(dict.fromkeys(w for v in result["svd"]["shapes"].values() for w in v["ways"]))
        for way in ways:
            cells = []
            for v in result["svd"]["shapes"].values():
                got = v["ways"].get(way, {})
                cells.append(got.get("error", "-") if "seconds_per_matrix" not in got else
                             f"{got['seconds_per_matrix']:.4f} s / {got['relative_error']:.1e}")
            lines.append(f"| {way} | " + " | ".join(cells) + " |")
        tables.append("\n".join(lines))
    return "\n\n".join(tables)


def sweep_rows(folder: str | Path) -> list[StudyRow]:
    path = Path(folder) / "results.jsonl"
    if not path.is_file():
        raise BSIError(f"'{folder}' holds no sweep results (no results.jsonl)")
    return read_study_rows(path)


def same_problems(a: Path, b: Path, seed: int) -> bool:
    """Whether two sweep folders scored the same test problems on ``seed`` (True when either kept no list)."""
    files = [folder / "outcomes" / f"problems-s{seed}.json" for folder in (a, b)]
    if not all(f.is_file() for f in files):
        return True
    return json.loads(files[0].read_text(encoding="utf-8")) == json.loads(files[1].read_text(encoding="utf-8"))


def against_table(folder: str | Path, study: str | Path, name: str) -> str:
    """The engine cells of ``folder`` against the same cells of ``study`` under ``tuned`` and ``paper``."""
    folder, study = Path(folder), Path(study)
    mine = [r for r in sweep_rows(folder) if r.method in ("bsi", "basel") and r.recovered and r.outcomes]
    theirs = [r for r in sweep_rows(study) if r.recovered and r.outcomes]
    load_mine, load_theirs = folder_loader(folder), folder_loader(study)

    def by_seed(rows, method, target, protocol):
        return {r.seed: r for r in rows if r.method == method and abs(r.target - target) < 1e-9
                and r.protocol == protocol}

    def diff(a: dict, b: dict, load_a, load_b, stat: str, scale: float, digits: int) -> str:
        seeds = sorted(s for s in set(a) & set(b) if same_problems(folder, study, s) or load_a is load_b)
        if not seeds:
            return "-"
        runs_a, runs_b = [load_a(a[s]) for s in seeds], [load_b(b[s]) for s in seeds]
        text = interval_text(paired_difference(runs_a, runs_b, stat).to_dict(), scale, digits, signed=True)
        if len(seeds) >= 2:
            over = seed_interval(per_seed_differences(runs_a, runs_b, stat))
            text += f"; over seeds {interval_text(over.to_dict(), scale, digits, signed=True)}"
        return text + f" (seeds {','.join(map(str, seeds))})"

    protocol = next((r.protocol for r in mine), "paper")
    lines = [f"`{protocol}` on {name} ({folder}) against the study's cells ({study}): accuracy in points / "
             "answer-token loss, paired bootstrap 95% interval pooled over the seeds both hold, then the t-interval "
             "over those seeds' own differences:", "",
             "| method | target | seeds | this schedule | minus `tuned` | minus `paper` (the study's schedule) |",
             "|---|---|---|---|---|---|"]
    targets = sorted({r.target for r in mine}, reverse=True)
    for method in ("bsi", "basel"):
        for target in targets:
            cells = by_seed(mine, method, target, protocol)
            if not cells:
                continue
            runs = [load_mine(cells[s]) for s in sorted(cells)]
            value = (f"{interval_text(value_interval(runs, 'accuracy').to_dict(), 100, 1)} / "
                     f"{interval_text(value_interval(runs, 'loss').to_dict(), 1, 3)}")
            vs = {p: " / ".join(diff(cells, by_seed(theirs, method, target, p), load_mine, load_theirs, stat, scale, d)
                                for stat, scale, d in (("accuracy", 100, 1), ("loss", 1, 3)))
                  for p in ("tuned", "paper")}
            lines.append(f"| `{method}` | {target:g} | {','.join(map(str, sorted(cells)))} | {value} | {vs['tuned']} | "
                         f"{vs['paper']} |")
    lines += ["", f"`bsi` minus `basel` on {name}:", "", "| target | accuracy (points) | loss |", "|---|---|---|"]
    for target in targets:
        a, b = by_seed(mine, "bsi", target, protocol), by_seed(mine, "basel", target, protocol)
        lines.append(f"| {target:g} | {diff(a, b, load_mine, load_mine, 'accuracy', 100, 1)} | "
                     f"{diff(a, b, load_mine, load_mine, 'loss', 1, 3)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="*", help="result files of the GPU scripts")
    p.add_argument("--sweep", help="a sweep folder of the published engine on its own schedule (item 3)")
    p.add_argument("--against", help="the study's sweep folder the --sweep cells are compared with")
    p.add_argument("--name", default="40 rounds of 12 iterations (10 tuning, 2 profiling)",
                   help="the schedule's name in the --sweep table")
    p.add_argument("--cpu", action="append", default=[], metavar="PRESET=FOLDER",
                   help="the CPU float32 run folder of a preset, the reference of the compress table (repeatable)")
    args = p.parse_args(argv)
    cpu = {}
    for item in args.cpu:
        preset, sep, folder = item.partition("=")
        if not sep:
            raise SystemExit(f"--cpu takes PRESET=FOLDER, got '{item}'")
        cpu[preset] = cpu_reference(folder)
    tables = []
    if bool(args.sweep) != bool(args.against):
        raise SystemExit("give --sweep FOLDER and --against STUDY together")
    if args.sweep:
        tables.append(against_table(args.sweep, args.against, args.name))
    for name in args.files:
        result = json.loads(Path(name).read_text(encoding="utf-8"))
        kind = result.get("kind") or ("gpu" if "train" in result or "inference" in result else None)
        render = {"compress": lambda r: compress_table(r, cpu), "bf16_rounds": bf16_table,
                  "dashboard": dashboard_table, "gpu": gpu_tables}.get(kind)
        if render is None:
            raise SystemExit(f"'{name}' is no result of the GPU scripts (kind {kind!r})")
        tables.append(render(result))
    print("\n\n".join(tables))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BSIError as err:
        raise SystemExit(f"error: {err}") from None
