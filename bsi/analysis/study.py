"""A comparison study's statistics: every method against ``bsi``, with paired bootstrap intervals.

Input: the rows of a sweep (``results.jsonl``, one :class:`~bsi.results.StudyRow` per evaluated model) and
each row's per-problem outcomes (``outcomes/*.json``: correct or not, summed
answer-token loss, token count, in test-set order). Output: for every
protocol, target and method

* the pooled accuracy and loss with a 95% stratified bootstrap interval
  (over the test problems, each seed's problems resampled apart), and
* the paired difference ``bsi - method`` in accuracy (points; positive: bsi
  answers more) and in loss (negative: bsi's loss is lower), with its
  interval, pooled over the seeds both ran, and the difference of each seed
  alone (the training-noise view the interval does not cover).

On a text task a "problem" is a held-out window (its outcome: its summed
next-token NLL and scored tokens, nothing answered); the loss is the mean
next-token NLL and the tables add the perplexity, ``exp`` of the loss, with
``exp`` of the loss's interval (exact: ``exp`` is monotone), and the ratio
of perplexities, ``exp`` of the loss difference. Rows evaluated before
recovery (``recover_steps`` 0, ``bsi sweep``'s ``also_unrecovered``) make
tables of their own, compared with ``bsi`` before recovery.

:func:`study_stats` computes it (the sweep writes it as ``stats.json``),
:func:`study_markdown` renders it (``results.md``), and
:func:`bsi.analysis.figures.study_figure` draws it. Truncation methods are the
published ones under every protocol, so their rows (protocol
``published``) appear in every protocol's table.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bsi.analysis.stats import Outcomes, paired_difference, per_seed_differences, seed_interval, value_interval
from bsi.results import REFERENCE, StudyRow

PUBLISHED = "published"  # the protocol label of the truncation methods' rows
ANCHOR = "bsi"  # every method is compared with this one

OutcomeLoader = Callable[[StudyRow], Outcomes]


def folder_loader(folder: str | Path) -> OutcomeLoader:
    """Reads a row's outcomes from ``folder / row.outcomes``."""
    root = Path(folder)

    def load(row: StudyRow) -> Outcomes:
        return Outcomes.from_columns(json.loads((root / row.outcomes).read_text(encoding="utf-8")))

    return load


def rows_of(rows: Sequence[StudyRow], protocol: str) -> list[StudyRow]:
    """The rows a protocol's table holds: the dense reference, the published truncations, its engine rows."""
    return [r for r in rows if r.protocol in (REFERENCE, PUBLISHED, protocol) and r.outcomes]


def _by_seed(rows: Sequence[StudyRow], method: str, target: float) -> dict[int, StudyRow]:
    return {r.seed: r for r in rows if r.method == method and math.isclose(r.target, target)}


def is_text_study(rows: Sequence[StudyRow]) -> bool:
    """Whether the rows are of a text task: their metrics carry a perplexity (the loss is the mean next-token NLL)."""
    return any(r.is_text for r in rows)


def _exp_interval(entry: Mapping[str, Any]) -> dict[str, Any]:
    """An interval on a loss (difference) mapped through ``exp``: a perplexity (ratio), exactly, exp being monotone."""
    def exp(x: float) -> float:
        return math.exp(x) if math.isfinite(x) else float("nan")

    out = {**entry, "estimate": exp(entry["estimate"]), "low": exp(entry["low"]), "high": exp(entry["high"])}
    out["excludes_zero"] = entry.get("excludes_zero", False)  # a ratio's interval excludes 1 where the loss's excludes 0
    return out


def _training(rows: Iterable[StudyRow]) -> dict[str, Any]:
    """The training the rows' models saw after the fine-tune, where recorded: mean steps and tokens over seeds."""
    runs = [r.run for r in rows if r.run is not None and r.run.training_steps is not None]
    if not runs:
        return {}
    out: dict[str, Any] = {"path_steps": sum(r.path_steps or 0 for r in runs) / len(runs),
                           "training_steps": sum(r.training_steps or 0 for r in runs) / len(runs)}
    tokens = [r.training_tokens for r in runs]
    if all(t is not None for t in tokens):
        out["training_tokens"] = sum(t or 0 for t in tokens) / len(tokens)
    shares = [r.gradient_passed for r in runs if r.gradient_passed is not None]
    if shares:  # bsi's gradient test: the share of candidate bases whose first-order term it kept
        out["gradient_passed"] = sum(shares) / len(shares)
    return out


def _method_table(rows: Sequence[StudyRow], targets: Sequence[float], outcomes: OutcomeLoader, anchor: str, text: bool,
                  resamples: int) -> dict[str, dict[str, Any]]:
    """Per method and target: pooled values with intervals, and the paired difference from ``anchor`` in ``rows``."""
    methods = list(dict.fromkeys(r.method for r in rows))
    table: dict[str, dict[str, Any]] = {}
    for method in methods:
        for target in targets:
            cells = _by_seed(rows, method, target)
            if not cells:
                continue
            seeds = sorted(cells)
            runs = [outcomes(cells[s]) for s in seeds]
            entry: dict[str, Any] = {
                "seeds": seeds,
                "params_total": sum(cells[s].params_total for s in seeds) / len(seeds),
                "compression_ratio": sum(cells[s].compression_ratio for s in seeds) / len(seeds),
                "recover_lr": sorted({cells[s].recover_lr for s in seeds} - {None}),
                "recover_steps": cells[seeds[0]].recover_steps,
                **_training(cells[s] for s in seeds),
                **{stat: value_interval(runs, stat, resamples=resamples).to_dict() for stat in ("accuracy", "loss")},
            }
            if text:
                entry["perplexity"] = _exp_interval(entry["loss"])
            timed = [cells[s].speed for s in seeds if cells[s].speed is not None]
            if timed:  # decode speed, measured side by side with the dense model (bsi.analysis.speed)
                entry["ms_per_token"] = sum(speed.ms_per_token for speed in timed) / len(timed)
                entry["speedup"] = sum(speed.speedup for speed in timed) / len(timed)
            ours = _by_seed(rows, anchor, target)
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
                over_seeds = {stat: values for stat, values in entry["vs_anchor"]["per_seed"].items()
                              if sum(math.isfinite(v) for v in values) >= 2}
                if over_seeds:  # the run-to-run view: a t-interval over the seeds' own differences
                    entry["vs_anchor"]["over_seeds"] = {stat: seed_interval(v).to_dict() for stat, v in over_seeds.items()}
                if text:  # exp(loss_anchor - loss_method) = perplexity_anchor / perplexity_method
                    entry["vs_anchor"]["perplexity_ratio"] = _exp_interval(entry["vs_anchor"]["loss"])
            table.setdefault(method, {})[f"{target:g}"] = entry
    return table


def study_stats(rows: Sequence[StudyRow], load: OutcomeLoader, protocols: Sequence[str], *,
                anchor: str = ANCHOR, resamples: int = 4000) -> dict[str, Any]:
    """Intervals for every (protocol, method, target) and differences from ``anchor``; plain JSON values.

    Per protocol, ``methods`` holds the recovered models and ``no_recovery``
    the models as their method left them (rows with ``recover_steps`` 0),
    each compared with ``anchor``'s model of the same kind. On a text task
    (``task`` ``"text"``) every entry also has ``perplexity`` (``exp`` of the
    loss interval) and every difference a ``perplexity_ratio`` (anchor /
    method, ``exp`` of the loss difference's interval), and
    ``perplexity_protocol`` is the dense row's protocol record.
    """
    cache: dict[str, Outcomes] = {}

    def outcomes(row: StudyRow) -> Outcomes:
        if row.outcomes not in cache:
            cache[row.outcomes] = load(row)
        return cache[row.outcomes]

    text = is_text_study(rows)
    out: dict[str, Any] = {"anchor": anchor, "task": "text" if text else "qa", "protocols": {}}
    dense = [r for r in rows if r.is_reference and r.outcomes]
    if dense:
        runs = [outcomes(r) for r in sorted(dense, key=lambda r: r.seed)]
        out["dense"] = {"seeds": sorted(r.seed for r in dense), "params_total": dense[0].params_total,
                        **{stat: value_interval(runs, stat, resamples=resamples).to_dict() for stat in ("accuracy", "loss")}}
        if text:
            out["dense"]["perplexity"] = _exp_interval(out["dense"]["loss"])
            out["perplexity_protocol"] = next((r.perplexity_protocol for r in dense if r.perplexity_protocol), None)
    for protocol in protocols:
        mine = [r for r in rows_of(rows, protocol) if not r.is_reference]
        targets = sorted({r.target for r in mine}, reverse=True)
        out["protocols"][protocol] = {
            "targets": targets,
            "methods": _method_table([r for r in mine if r.recovered], targets, outcomes, anchor, text, resamples),
            "no_recovery": _method_table([r for r in mine if not r.recovered], targets, outcomes, anchor, text,
                                         resamples),
        }
    return out


def methods_by_loss(methods: Mapping[str, Mapping[str, Any]], target: str) -> list[str]:
    """The methods of one protocol's statistics that ran at ``target``, lowest pooled loss first.

    ``methods`` is ``stats["protocols"][protocol]["methods"]`` of a sweep's
    ``stats.json`` (method -> target, as written, e.g. ``"0.4"`` -> its
    pooled statistics). The order compares the estimates only: two
    neighbours in it may be within noise of each other, which the paired
    intervals (``vs_anchor``) say.
    """
    ran = [method for method in methods if target in methods[method]]
    return sorted(ran, key=lambda method: methods[method][target]["loss"]["estimate"])


# ------------------------------------------------------------------ tables
def interval_text(entry: Mapping[str, Any], scale: float, digits: int, signed: bool = False) -> str:
    """``estimate [low, high]`` of an interval's dict, times ``scale``; ``signed``: a difference, with its sign, in
    **bold** when its interval excludes 0 (the tables' mark)."""
    if not math.isfinite(entry["estimate"]):
        return "-"
    sign = "+" if signed else ""
    spec = ".2e" if abs(scale * entry["estimate"]) >= 1e5 else f".{digits}f"  # e-notation: a collapsed model's perplexity
    text = _estimate_and_bounds(entry, f"{{:{sign}{spec}}}", scale)
    return f"**{text}**" if signed and entry.get("excludes_zero") else text


def _estimate_and_bounds(entry: Mapping[str, Any], fmt: str, scale: float = 1.0) -> str:
    """``estimate [low, high]``, each value times ``scale`` written with ``fmt``."""
    low, estimate, high = (fmt.format(scale * entry[key]) for key in ("low", "estimate", "high"))
    return f"{estimate} [{low}, {high}]"


def _loss_digits(value: float) -> int:
    return 3 if abs(value) < 10 else 2


def _cell(entry: Mapping[str, Any] | None, text: bool) -> str:
    """One model's values in a table cell: accuracy / loss, or on a text task perplexity / loss."""
    if entry is None:
        return ""
    first = interval_text(entry["perplexity"], 1, _ppl_digits(entry["perplexity"]["estimate"])) if text \
        else interval_text(entry["accuracy"], 100, 1)
    return f"{first} / {interval_text(entry['loss'], 1, _loss_digits(entry['loss']['estimate']))}"


def difference_text(diff: Mapping[str, Any] | None, text: bool = False) -> str:
    """A difference from the anchor in a cell: accuracy points / loss, or on a text task loss / perplexity ratio.

    Each interval is bold where it excludes 0, and a † follows it where the
    t-interval over the seeds' own differences (``over_seeds``, two seeds or
    more) excludes 0 as well.
    """
    if diff is None:
        return ""

    def runs(stat: str) -> str:  # the t-interval over seeds excludes 0 too
        return "†" if diff.get("over_seeds", {}).get(stat, {}).get("excludes_zero") else ""

    if text:
        return f"{interval_text(diff['loss'], 1, 3, True)}{runs('loss')} / {_ratio(diff['perplexity_ratio'])}"
    return (f"{interval_text(diff['accuracy'], 100, 1, True)}{runs('accuracy')} / "
            f"{interval_text(diff['loss'], 1, 3, True)}{runs('loss')}")


def _ratio(entry: Mapping[str, Any]) -> str:
    if not math.isfinite(entry["estimate"]):
        return "-"
    text = _estimate_and_bounds(entry, "{:.3f}" if entry["estimate"] >= 1e-3 else "{:.1e}")  # e: to a collapsed model
    return f"**{text}**" if entry.get("excludes_zero") else text


def _ppl_digits(value: float) -> int:
    return 2 if abs(value) < 1000 else 1


def _heads(table: Mapping[str, Any], targets: Sequence[float]) -> list[str]:
    """Column heads: each target with the whole-model compression its models reached."""
    ratio = {t: next((table[m][f"{t:g}"]["compression_ratio"] for m in table if f"{t:g}" in table[m]), float("nan"))
             for t in targets}
    return [f"{t:g} ({ratio[t]:.2f}x)" for t in targets]


#: How the difference tables mark the run-to-run view (``vs_anchor.over_seeds`` in stats.json).
RUNS_NOTE = ("That interval resamples test problems, not training runs; with two or more seeds, † marks a "
             "difference whose 95% t-interval over the seeds' own differences excludes 0 as well (per-seed "
             "differences and that interval are in `stats.json`).")


def _tables(lines: list[str], table: Mapping[str, Any], targets: Sequence[float], anchor: str, text: bool,
            heading: str | None) -> None:
    """Append one group's values table and its differences table (recovered or not) to ``lines``."""
    head = _heads(table, targets)
    if heading:
        lines += [heading, ""]
    what = ("Perplexity and mean next-token loss (nats), pooled over the seeds, with 95% bootstrap intervals "
            "(held-out windows resampled within each seed)." if text else
            "Accuracy in % and answer-token loss, pooled over the seeds, with 95% bootstrap intervals "
            "(problems resampled within each seed).")
    lines += [f"{what} Column: share of the linear layers kept (whole-model compression).", "",
              "| method | " + " | ".join(head) + " |", "|---|" + "---|" * len(targets)]
    for method, cells in table.items():
        lines.append(f"| `{method}` | " + " | ".join(_cell(cells.get(f"{t:g}"), text) for t in targets) + " |")
    if text:
        lines += ["", f"`{anchor}` minus each method in loss (negative: `{anchor}`'s is lower), and `{anchor}`'s "
                      f"perplexity / the method's (exp of the loss difference; below 1: `{anchor}`'s is lower), paired "
                      "bootstrap 95% interval pooled over the seeds both ran; **bold**: the interval excludes 0 "
                      f"(a ratio's: 1). {RUNS_NOTE}"]
    else:
        lines += ["", f"`{anchor}` minus each method: accuracy in points (positive: `{anchor}` answers more) and "
                      f"loss (negative: `{anchor}`'s is lower), paired bootstrap 95% interval pooled over the seeds "
                      f"both ran; **bold**: the interval excludes 0. {RUNS_NOTE}"]
    lines += ["", "| method | " + " | ".join(head) + " |", "|---|" + "---|" * len(targets)]
    for method, cells in table.items():
        if method != anchor:
            lines.append(f"| `{method}` | " + " | ".join(
                difference_text((cells.get(f"{t:g}") or {}).get("vs_anchor"), text) for t in targets) + " |")
    lines.append("")


def _training_table(lines: list[str], table: Mapping[str, Any], targets: Sequence[float]) -> None:
    """The training each model saw after the fine-tune: the method's own steps to the size + the recovery's."""
    lines += ["Training after the task fine-tune, optimizer steps: the method's own path to the size + the "
              "recovery (thousands of tokens); a truncation's path trains nothing. Where bsi's gradient test "
              "ran, the share of candidate bases whose gradient term passed it (over the rounds up to the size; "
              "the rest were scored by curvature alone). Rows made before this was recorded are blank.", "",
              "| method | " + " | ".join(_heads(table, targets)) + " |", "|---|" + "---|" * len(targets)]
    for method, cells in table.items():
        row = []
        for e in (cells.get(f"{t:g}") or {} for t in targets):
            if "training_steps" not in e:
                row.append("")
                continue
            tokens = f" ({e['training_tokens'] / 1000:.0f}k)" if "training_tokens" in e else ""
            test = f"; gradient test passed {100 * e['gradient_passed']:.1f}%" if "gradient_passed" in e else ""
            row.append(f"{e['path_steps']:g} + {e['recover_steps']}{tokens}{test}")
        lines.append(f"| `{method}` | " + " | ".join(row) + " |")
    lines.append("")


def study_markdown(stats: Mapping[str, Any], descriptions: Mapping[str, str] | None = None,
                   notes: Mapping[str, str] | None = None) -> str:
    """``results.md``: per protocol, the value table with intervals, then the differences from the anchor.

    With no-recovery rows, each protocol has two pairs of tables: "with
    recovery" and "no recovery". On a text task the values are perplexity
    and mean next-token loss, and the protocol of the perplexity is stated
    first.
    """
    anchor = stats.get("anchor", ANCHOR)
    text = stats.get("task") == "text"
    lines: list[str] = []
    protocol = stats.get("perplexity_protocol")
    if text:
        lines += ["The loss is the mean next-token NLL in nats over the scored tokens of the held-out windows; the "
                  "perplexity is exp of it."]
        if protocol:
            boundaries = f"; {protocol['document_boundaries']}" if protocol.get("document_boundaries") else ""
            lines += [f"Protocol: {protocol['source']}; {protocol['description']}{boundaries}."]
        lines.append("")
    dense = stats.get("dense")
    if dense and text:
        lines += [f"Dense fine-tuned model (seeds {', '.join(map(str, dense['seeds']))}): perplexity "
                  f"{interval_text(dense['perplexity'], 1, _ppl_digits(dense['perplexity']['estimate']))}, mean next-token "
                  f"loss {interval_text(dense['loss'], 1, 4)}.", ""]
    elif dense:
        lines += [f"Dense fine-tuned model (seeds {', '.join(map(str, dense['seeds']))}): accuracy "
                  f"{interval_text(dense['accuracy'], 100, 1)} %, answer-token loss {interval_text(dense['loss'], 1, 4)}.", ""]
    for name, block in stats["protocols"].items():
        targets = block["targets"]
        table, bare = block["methods"], block.get("no_recovery") or {}
        if not table and not bare:
            continue
        lines += [f"## Protocol `{name}`", ""]
        if descriptions and name in descriptions:
            lines += [descriptions[name], ""]
        if notes and name in notes:
            lines += [notes[name], ""]
        if table:
            steps = next((e.get("recover_steps") for cells in table.values() for e in cells.values()), None)
            heading = (f"### With recovery ({steps} steps)" if steps else "### With recovery") if bare else None
            _tables(lines, table, targets, anchor, text, heading)
        if bare:
            _tables(lines, bare, targets, anchor, text, "### No recovery (each method's model as it left it, no "
                                                        "training after compression)")
        if any("training_steps" in e for cells in table.values() for e in cells.values()):
            _training_table(lines, table, targets)
        if any("speedup" in e for cells in table.values() for e in cells.values()):
            head = _heads(table, targets)
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
