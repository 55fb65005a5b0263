"""A comparison study's statistics: every method against ``bsi``, with paired bootstrap intervals.

Input: the rows of a sweep (``results.jsonl``, one per evaluated model) and
each row's per-problem outcomes (``outcomes/*.json``: correct or not, summed
answer-token loss, token count, in test-set order). Output: for every
protocol, target and method

* the pooled accuracy and loss with a 95% stratified bootstrap interval
  (over the test problems, each seed's problems resampled apart), and
* the paired difference ``bsi - method`` in accuracy (points; positive: bsi
  answers more) and in loss (negative: bsi's loss is lower), with its
  interval, pooled over the seeds both ran, and the difference of each seed
  alone (the training-noise view the interval does not cover).

:func:`study_stats` computes it (the sweep writes it as ``stats.json``),
:func:`study_markdown` renders it (``results.md``), and
:func:`bsi.analysis.figures.study_figure` draws it. Truncation methods are the
published ones under every protocol, so their rows (protocol
``published``) appear in every protocol's table.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bsi.analysis.stats import Interval, Outcomes, paired_difference, per_seed_differences, value_interval

REFERENCE = "dense"
PUBLISHED = "published"  # the protocol label of the truncation methods' rows
ANCHOR = "bsi"  # every method is compared with this one

OutcomeLoader = Callable[[dict], Outcomes]


def folder_loader(folder: str | Path) -> OutcomeLoader:
    """Reads a row's outcomes from ``folder / row["outcomes"]``."""
    root = Path(folder)

    def load(row: dict) -> Outcomes:
        return Outcomes.from_columns(json.loads((root / row["outcomes"]).read_text(encoding="utf-8")))

    return load


def rows_of(rows: Sequence[dict], protocol: str) -> list[dict]:
    """The rows a protocol's table holds: the dense reference, the published truncations, its engine rows."""
    return [r for r in rows if r.get("protocol") in (REFERENCE, PUBLISHED, protocol) and r.get("outcomes")]


def _by_seed(rows: Sequence[dict], method: str, target: float) -> dict[int, dict]:
    return {r["seed"]: r for r in rows if r["method"] == method and math.isclose(r["target"], target)}


def study_stats(rows: Sequence[dict], load: OutcomeLoader, protocols: Sequence[str], *,
                anchor: str = ANCHOR, resamples: int = 4000) -> dict[str, Any]:
    """Intervals for every (protocol, method, target) and differences from ``anchor``; plain JSON values."""
    cache: dict[str, Outcomes] = {}

    def outcomes(row: dict) -> Outcomes:
        if row["outcomes"] not in cache:
            cache[row["outcomes"]] = load(row)
        return cache[row["outcomes"]]

    out: dict[str, Any] = {"anchor": anchor, "protocols": {}}
    dense = [r for r in rows if r["method"] == REFERENCE and r.get("outcomes")]
    if dense:
        runs = [outcomes(r) for r in sorted(dense, key=lambda r: r["seed"])]
        out["dense"] = {"seeds": sorted(r["seed"] for r in dense), "params_total": dense[0]["params_total"],
                        **{stat: value_interval(runs, stat, resamples=resamples).to_dict() for stat in ("accuracy", "loss")}}
    for protocol in protocols:
        mine = rows_of(rows, protocol)
        targets = sorted({r["target"] for r in mine if r["method"] != REFERENCE}, reverse=True)
        methods = list(dict.fromkeys(r["method"] for r in mine if r["method"] != REFERENCE))
        table: dict[str, dict[str, Any]] = {}
        for method in methods:
            for target in targets:
                cells = _by_seed(mine, method, target)
                if not cells:
                    continue
                seeds = sorted(cells)
                runs = [outcomes(cells[s]) for s in seeds]
                entry: dict[str, Any] = {
                    "seeds": seeds,
                    "params_total": sum(cells[s]["params_total"] for s in seeds) / len(seeds),
                    "compression_ratio": sum(cells[s]["compression_ratio"] for s in seeds) / len(seeds),
                    "recover_lr": sorted({cells[s].get("recover_lr") for s in seeds} - {None}),
                    **{stat: value_interval(runs, stat, resamples=resamples).to_dict() for stat in ("accuracy", "loss")},
                }
                timed = [cells[s] for s in seeds if cells[s].get("ms_per_token")]
                if timed:  # decode speed, measured side by side with the dense model (bsi.analysis.speed)
                    entry["ms_per_token"] = sum(r["ms_per_token"] for r in timed) / len(timed)
                    entry["speedup"] = sum(r["dense_ms_per_token"] / r["ms_per_token"] for r in timed) / len(timed)
                ours = _by_seed(mine, anchor, target)
                shared = [s for s in seeds if s in ours]
                if method != anchor and shared:
                    a = [outcomes(ours[s]) for s in shared]
                    b = [outcomes(cells[s]) for s in shared]
                    entry["vs_anchor"] = {
                        "seeds": shared,
                        **{stat: paired_difference(a, b, stat, resamples=resamples).to_dict()
                           for stat in ("accuracy", "loss")},
                        "per_seed": {stat: per_seed_differences(a, b, stat) for stat in ("accuracy", "loss")},
                    }
                table.setdefault(method, {})[f"{target:g}"] = entry
        out["protocols"][protocol] = {"targets": targets, "methods": table}
    return out


# ------------------------------------------------------------------ tables
def _pct(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{100 * value:.1f}"


def _interval(entry: Mapping[str, Any], scale: float, digits: int, signed: bool = False) -> str:
    if not math.isfinite(entry["estimate"]):
        return "-"
    fmt = f"{{:{'+' if signed else ''}.{digits}f}}"
    text = f"{fmt.format(scale * entry['estimate'])} [{fmt.format(scale * entry['low'])}, {fmt.format(scale * entry['high'])}]"
    return f"**{text}**" if signed and entry.get("excludes_zero") else text


def _loss_digits(value: float) -> int:
    return 3 if abs(value) < 10 else 2


def study_markdown(stats: Mapping[str, Any], descriptions: Mapping[str, str] | None = None,
                   notes: Mapping[str, str] | None = None) -> str:
    """``results.md``: per protocol, the accuracy/loss table with intervals, then the differences from the anchor."""
    anchor = stats.get("anchor", ANCHOR)
    lines: list[str] = []
    dense = stats.get("dense")
    if dense:
        lines += [f"Dense fine-tuned model (seeds {', '.join(map(str, dense['seeds']))}): accuracy "
                  f"{_interval(dense['accuracy'], 100, 1)} %, answer-token loss {_interval(dense['loss'], 1, 4)}.", ""]
    for protocol, block in stats["protocols"].items():
        targets = block["targets"]
        table = block["methods"]
        if not table:
            continue
        lines += [f"## Protocol `{protocol}`", ""]
        if descriptions and protocol in descriptions:
            lines += [descriptions[protocol], ""]
        if notes and protocol in notes:
            lines += [notes[protocol], ""]
        ratio = {t: next((table[m][f"{t:g}"]["compression_ratio"] for m in table if f"{t:g}" in table[m]), float("nan"))
                 for t in targets}
        head = [f"{t:g} ({ratio[t]:.2f}x)" for t in targets]
        lines += ["Accuracy in % and answer-token loss, pooled over the seeds, with 95% bootstrap intervals "
                  "(problems resampled within each seed). Column: share of the linear layers kept (whole-model "
                  "compression).", "",
                  "| method | " + " | ".join(head) + " |", "|---|" + "---|" * len(targets)]
        for method, cells in table.items():
            row = []
            for t in targets:
                e = cells.get(f"{t:g}")
                row.append("" if e is None else f"{_interval(e['accuracy'], 100, 1)} / "
                                                f"{_interval(e['loss'], 1, _loss_digits(e['loss']['estimate']))}")
            lines.append(f"| `{method}` | " + " | ".join(row) + " |")
        lines += ["", f"`{anchor}` minus each method: accuracy in points (positive: `{anchor}` answers more) and "
                      f"loss (negative: `{anchor}`'s is lower), paired bootstrap 95% interval pooled over the seeds "
                      "both ran; **bold**: the interval excludes 0. Per-seed differences are in `stats.json`.", "",
                  "| method | " + " | ".join(head) + " |", "|---|" + "---|" * len(targets)]
        for method, cells in table.items():
            if method == anchor:
                continue
            row = []
            for t in targets:
                diff = (cells.get(f"{t:g}") or {}).get("vs_anchor")
                row.append("" if diff is None else f"{_interval(diff['accuracy'], 100, 1, True)} / "
                                                   f"{_interval(diff['loss'], 1, 3, True)}")
            lines.append(f"| `{method}` | " + " | ".join(row) + " |")
        lines.append("")
        if any("speedup" in e for cells in table.values() for e in cells.values()):
            lines += ["Decode speed, measured side by side with the dense model (greedy, batch 1, median): "
                      "ms/token is the time of one more token once the prompt is processed; the speed-up is the "
                      "dense model's ms/token / this model's (tokens/s = 1000 / ms/token).", "",
                      "| method | " + " | ".join(head) + " |", "|---|" + "---|" * len(targets)]
            for method, cells in table.items():
                row = [f"{e['ms_per_token']:.2f} ms ({e['speedup']:.2f}x)" if "speedup" in e else ""
                       for e in (cells.get(f"{t:g}") or {} for t in targets)]
                lines.append(f"| `{method}` | " + " | ".join(row) + " |")
            lines.append("")
    return "\n".join(lines) + "\n"
