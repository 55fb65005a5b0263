"""The generated parts of the documentation: flag tables from the parsers, presets and the module map from the package.

``python -m bsi.cli.docs`` (``make docs``) rewrites them in place;
``python -m bsi.cli.docs --check`` only names the stale files, and
``tests/test_docs.py`` fails while any is stale. Each generated part sits
between two markers in a Markdown file, so the prose around it stays
hand-written::

    <!-- generated: flags eval (python -m bsi.cli.docs) -->
    | flag | default | meaning |
    ...
    <!-- end of generated part -->

The generators (:data:`GENERATORS`):

* ``flags COMMAND``: one table per argument group of ``bsi COMMAND``, read
  from the parser itself: the flag, its default as ``--help`` shows it (see
  :class:`bsi.cli.HelpFormatter`), its help text and choices. Other commands
  than ``compress`` list the configuration flags they share with it in one
  sentence instead of repeating the tables.
* ``json-only``: the configuration fields that have no flag;
* ``presets``: what every preset of :data:`bsi.config.PRESETS` runs, from
  :func:`bsi.config.make_config` (and ``bsi sweep``'s additions).
* ``modules``: the package's module map, one row per module with the first
  line of its docstring, read with :mod:`ast` (nothing is imported), grouped
  by sub-package.
* ``defaults``: the table "the paper and bsi's defaults" of the README, from
  :func:`bsi.teaching.defaults_table_markdown` (the one generator that
  imports torch, through :mod:`bsi.teaching`).
* ``walkthroughs``: the README's list of walkthroughs, each with its
  rendered page and the run time ``make walkthroughs`` measured
  (``docs/walkthroughs/times.json``, worded by ``notebooks/build.py``).
* ``preset-costs``: every preset's measured wall time on 2 CPU cores and
  what it gives up for it, from :data:`bsi.config.PRESET_COSTS`
  (docs/benchmarks.md), so that each figure is stated once.
* ``shipped NAME``: the tables of a sweep shipped in ``data/sweeps/NAME``.
* ``general-text``: what each preset costs on general text (lm-eval's
  WikiText-2 word perplexity of each run and its dense model), from
  ``data/general-text.json``, which ``bench/general_text.py`` writes.
* ``runs-side-by-side NAME ...`` and ``text-runs-side-by-side NAME ...``:
  one preset on several models, one row per run shipped in ``data/runs``.
* ``sweeps-side-by-side NAME ...``: one sweep preset on several models, each
  method at each size, from the ``stats.json`` of each sweep shipped in
  ``data/sweeps``, and the order of the methods by loss on each model.
* ``sweep-seeds NAME [METHOD ...]``: a shipped sweep's pooled cells, then the
  anchor minus each named method seed by seed with the t-interval over the
  seeds (the run-to-run interval), from its ``stats.json``.
* ``sweep-log-rounds NAME ROUND ...``: the mean tuning loss of the named
  rounds in each ``sweep-<label>.log`` shipped with a sweep.
* ``run-profiles NAME ...``: where whole ``bsi compress`` runs spent their
  time, one column per ``data/speed/NAME.json`` from ``bench/run_profile.py``.
* ``speed-evaluation NAME ...``: the evaluation's variants (decode loop,
  gold draft, bf16) timed by ``bench/speed.py``, from ``data/speed/NAME.json``.
* ``whatif-speed NAME``: the dashboard's What-if latencies (rule redraw,
  measure, eps, prepare) and their share of a full run of the same size,
  timed by ``bench/whatif.py``, from ``data/speed/NAME.json``.

Only ``defaults``, ``preset-costs`` and ``sweeps-side-by-side`` import torch
(through :mod:`bsi.teaching`, :mod:`bsi.progress` and the statistics of
:mod:`bsi.analysis.study`).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = ("docs/cli.md", "docs/architecture.md", "docs/benchmarks.md", "README.md", "docs/results/study-quick.md",
             "docs/ecosystem.md", "docs/results/text.md", "docs/results/gemma3-270m-study-quick.md",
             "docs/results/paper-40x12-one-change-h100.md", "docs/results/study.md", "docs/dashboard.md")
"""The files with generated parts, relative to the repository root."""

START = re.compile(r"^<!-- generated: (?P<what>[^()]+?) \(python -m bsi\.cli\.docs\) -->$", re.MULTILINE)
END = "<!-- end of generated part -->"

#: Argument groups that hold the configuration's flags (bsi.cli.flags.add_config_flags), with their headings.
CONFIG_GROUPS = {"run": "Run", "stage 1: task fine-tune": "Stage 1: task fine-tune",
                 "stage 2: compression": "Stage 2: compression", "stage 3: recovery": "Stage 3: recovery"}
OWN_GROUPS = {"options": "Command", "optional arguments": "Command", "positional arguments": "Arguments"}
GENERIC_METAVARS = ("INT", "FLOAT", "STR")

#: Sub-packages in the order of the layers (docs/architecture.md); others follow alphabetically.
PACKAGE_ORDER = ("config", "data", "method", "analysis", "pipeline", "cli", "app")  # the layers, bottom up


# ------------------------------------------------------------------ flags
def split_default(text: str) -> tuple[str, str]:
    """``"sigmas per layer (default: 16)"`` -> ``("sigmas per layer", "16")``; ``(required)`` counts too.

    Only a last, balanced parenthesis that starts with ``default:`` or is
    ``required`` is taken; a help without one gives ``(text, "")``.
    """
    text = text.strip()
    if not text.endswith(")"):
        return text, ""
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(text[i], 0)
        if depth == 0:
            inner = text[i + 1:-1]
            if inner == "required":
                return text[:i].rstrip(), "required"
            if inner.startswith("default:"):
                return text[:i].rstrip(), inner.removeprefix("default:").strip()
            return text, ""
    return text, ""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _flag_cell(action: argparse.Action) -> str:
    names = action.option_strings or [action.metavar or action.dest]
    if isinstance(action, argparse.BooleanOptionalAction):
        names = [n for n in names if not n.startswith("--no-")]
    shown = ", ".join(f"`{n}`" for n in names)
    metavar = action.metavar if action.option_strings and action.nargs != 0 else None
    if isinstance(metavar, str) and metavar not in GENERIC_METAVARS and action.choices is None:
        shown = shown[:-1] + f" {metavar}" + ("..." if action.nargs in ("+", "*") else "") + "`"
    return shown


def flag_row(action: argparse.Action, formatter: argparse.HelpFormatter) -> str:
    """One table row: the flag, its default as ``--help`` shows it, what it means (and its choices)."""
    meaning, default = split_default(formatter._expand_help(action))
    if not default:
        default = "off" if action.nargs == 0 and action.const is True else "-"
    if default not in ("required", "off", "on", "-") and " " not in default:
        default = f"`{default}`"
    choices = [str(c) for c in action.choices or ()]
    if choices and not all(re.search(rf"(?<![\w-]){re.escape(c)}(?![\w-])", meaning) for c in choices):
        meaning += f"; one of {', '.join(f'`{c}`' for c in choices)}"
    return f"| {_flag_cell(action)} | {_cell(default)} | {_cell(meaning)} |"


def _groups(parser: argparse.ArgumentParser) -> list[tuple[str, list[argparse.Action]]]:
    """(title, actions) of every argument group that holds a flag, ``--help`` left out."""
    out = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.help != argparse.SUPPRESS and "-h" not in a.option_strings]
        if actions:
            out.append((group.title or "", actions))
    return out


def command_parser(command: str) -> argparse.ArgumentParser:
    """The parser of ``bsi COMMAND``, built exactly as ``bsi`` builds it."""
    from bsi.cli import _subparser, build_parser

    parser = _subparser(build_parser(), command)
    if parser is None:
        raise KeyError(f"no command {command!r}")
    return parser


def flag_tables(command: str) -> str:
    """The flags of ``bsi COMMAND`` as Markdown tables, one per argument group."""
    parser = command_parser(command)
    formatter = parser._get_formatter()
    groups = _groups(parser)
    config = [(t, a) for t, a in groups if t in CONFIG_GROUPS]
    own = [(t, a) for t, a in groups if t not in CONFIG_GROUPS]
    shown = groups if command == "compress" else own
    blocks = []
    for title, actions in shown:
        heading = CONFIG_GROUPS.get(title) or OWN_GROUPS.get(title, title[:1].upper() + title[1:])
        rows = "\n".join(flag_row(a, formatter) for a in actions)
        blocks.append((f"**{heading}**\n\n" if len(shown) > 1 else "") + f"| flag | default | meaning |\n|---|---|---|\n{rows}")
    if config and command != "compress":
        blocks.append(_shared_config_sentence(command, config))
    return "\n\n".join(blocks)


def _shared_config_sentence(command: str, config: list[tuple[str, list[argparse.Action]]]) -> str:
    """What the command takes of ``compress``'s configuration flags, in one sentence."""
    compress = {o for t, actions in _groups(command_parser("compress")) if t in CONFIG_GROUPS
                for a in actions for o in a.option_strings[:1]}
    mine = {a.option_strings[0] for _, actions in config for a in actions}
    left_out = sorted(compress - mine)
    extra = sorted(mine - compress)
    text = f"`bsi {command}` also takes the configuration flags of [`bsi compress`](#bsi-compress)"
    if left_out:
        text += f" except {', '.join(f'`{f}`' for f in left_out)}"
    if extra:
        text += f", and {', '.join(f'`{f}`' for f in extra)}"
    return text + "."


def json_only() -> str:
    """The configuration fields that have no flag (``option(cli=False)``), as a Markdown list."""
    from bsi.cli.flags import config_fields
    from bsi.config import NESTED, SECTIONS, PipelineConfig, flat_fields

    hidden = []
    for section in ("", *SECTIONS):
        cls = PipelineConfig if not section else NESTED[("PipelineConfig", section)]
        shown = {f.name for f in config_fields(section)}
        hidden += [((f"{section}." if section else "") + f.name, f.metadata.get("help", ""))
                   for f in flat_fields(cls) if f.name not in shown and f.name not in SECTIONS]
    return "\n".join(f"* `{name}`: {help_text}" for name, help_text in hidden)


# ------------------------------------------------------------------ presets
def preset_table() -> str:
    """One row per preset: its model, pruning schedule, size, fine-tune, recovery and evaluation."""
    from bsi.config import PRESETS, SWEEP_PRESETS, make_config, make_sweep_config

    rows = ["| preset | model | pruning | size | fine-tune | recovery | evaluation |", "|---|---|---|---|---|---|---|"]
    for name in PRESETS:
        c = make_config(name)
        k = c.compress
        size = f"target {k.size.ratio:g}" if k.size.mode == "target" else f"KeepRatio {k.size.ratio:g}"
        sweep = SWEEP_PRESETS.get(name)
        if sweep:
            study = make_sweep_config(name)
            extra = "".join(f", {m} also {', '.join(f'{t:g}' for t in ts)}" for m, ts in study.extra_targets.items())
            methods = "" if "methods" not in sweep else f"methods {', '.join(study.methods)}, "
            size += (f"; `bsi sweep`: {methods}targets {', '.join(f'{t:g}' for t in study.targets)}{extra}, seeds "
                     f"{', '.join(map(str, study.seeds))}, protocols {', '.join(study.protocols)}")
        recovery = f"{c.recover.steps} steps at lr {c.recover.lr:g}"
        if sweep and make_sweep_config(name).lr_grid:
            recovery += f" (`bsi sweep`: lr chosen from {', '.join(f'{x:g}' for x in make_sweep_config(name).lr_grid)})"
        if sweep and make_sweep_config(name).also_unrecovered:
            recovery += " (`bsi sweep`: and none)"
        if c.data == "wikitext-2" or c.task == "text":
            windows = "every held-out window" if c.eval_windows is None else f"the first {c.eval_windows} held-out windows"
            evaluation = f"`{c.data}`: perplexity on {windows} of {c.window} tokens"
        else:
            evaluation = f"{c.eval_examples} problems, max length {c.max_length}, {c.max_new_tokens} new tokens"
        rows.append(
            f"| `{name}` | `{c.model}` | {k.rounds} rounds of {k.round_length} iterations ({k.profiling_iters} "
            f"profiling), {k.score}, {k.curvature} curvature, {k.bases} bases | {size} | "
            f"{c.finetune.steps} steps at lr {c.finetune.lr:g} | {recovery} | {evaluation} |")
    return "\n".join(rows)


# ------------------------------------------------------------------ the module map
def markdown_inline(text: str) -> str:
    """reStructuredText inline markup to Markdown: ``:mod:`~a.b``` -> `` `b` ``, double back-quotes -> single."""
    def role(match: re.Match) -> str:
        short, target = match.groups()
        return f"`{target.rsplit('.', 1)[-1] if short else target}`"

    return re.sub(r":[a-z]+:`(~?)([^`]+)`", role, text).replace("``", "`")


def module_row(path: Path, label: str) -> str:
    """A module's row: ``label``, its lines, the first line of its docstring and its public classes (read with ast).

    A package's row (its ``__init__.py``) counts the lines of all its modules.
    """
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    lines = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in path.parent.glob("*.py")) \
        if path.name == "__init__.py" and path.parent.name != "bsi" else len(text.splitlines())
    doc = ast.get_docstring(tree)
    if not doc:
        raise ValueError(f"{path} has no docstring: its first line is what the module map says of it")
    summary = markdown_inline(doc.strip().splitlines()[0].rstrip("."))
    classes = [node.name for node in tree.body if isinstance(node, ast.ClassDef) and not node.name.startswith("_")]
    return f"| {label} | {lines:,} | {_cell(summary)} | {', '.join(f'`{c}`' for c in classes)} |"


def module_map(root: Path = ROOT) -> str:
    """The module map of the ``bsi`` package: top-level modules, then each sub-package's, one row each."""
    package = root / "bsi"
    rows = ["| module | lines | what it is | classes |", "|---|--:|---|---|"]
    rows += [module_row(p, f"`bsi/{p.name}`") for p in _modules(package)]
    subpackages = sorted((p for p in package.iterdir() if (p / "__init__.py").is_file()),
                         key=lambda p: (PACKAGE_ORDER.index(p.name) if p.name in PACKAGE_ORDER else len(PACKAGE_ORDER),
                                        p.name))
    for sub in subpackages:
        rows.append(module_row(sub / "__init__.py", f"**`bsi/{sub.name}/`**"))
        rows += [module_row(p, f"`{p.name}`") for p in _modules(sub)]
    return "\n".join(rows)


def _modules(folder: Path) -> list[Path]:
    """A folder's modules, ``__init__.py`` first for the top level, then by name (``__main__`` left out)."""
    files = sorted(p for p in folder.glob("*.py") if p.name != "__main__.py")
    if folder.name != "bsi":
        files = [p for p in files if p.name != "__init__.py"]
    return sorted(files, key=lambda p: (p.name != "__init__.py", p.name))


def walkthrough_list(root: Path = ROOT) -> str:
    """One line per teaching notebook: its title, its rendered page once there is one, its measured run time.

    Read from ``notebooks/src`` and ``docs/walkthroughs/times.json`` through
    ``notebooks/build.py`` (the same words the notebooks open with), so the
    README says no time that was not measured.
    """
    spec = importlib.util.spec_from_file_location("notebooks_build", root / "notebooks" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    times = build.load_times(root / "docs" / "walkthroughs" / "times.json")
    lines = []
    for source in build.sources():
        title = build.parse_cells(source.read_text(encoding="utf-8"))[0][1].splitlines()[0].lstrip("# ").strip()
        page = root / "docs" / "walkthroughs" / f"{source.stem}.md"
        shown = f"[{title}](docs/walkthroughs/{page.name})" if page.is_file() else f"{title} (not rendered yet)"
        when = build.runtime_line(source.stem, times) or "Run time: not measured yet."
        lines.append(f"* {shown} — {when}")
    return "\n".join(lines)


def preset_cost_table() -> str:
    """One row per preset of :data:`bsi.config.PRESET_COSTS`: what was timed, its wall times, when, what it gives up.

    Links are relative to docs/ (the table sits in docs/benchmarks.md).
    """
    from bsi.config import PRESET_COSTS
    from bsi.units import duration

    rows = ["| preset | timed | fine-tune and conversion cached | fine-tune cached | empty cache, fine-tune included | "
            "measured | what it gives up |", "|---|---|---|---|---|---|---|"]
    for name, cost in PRESET_COSTS.items():
        warm, cached, uncached = (duration(s) if s else "-"
                                  for s in (cost.warm_seconds, cost.cached_seconds, cost.uncached_seconds))
        measured = cost.measured or ("measured in parts" if cost.source else "-")
        if cost.source:
            measured = f"[{measured}]({cost.source.removeprefix('docs/')})"
        rows.append(f"| `{name}` | `{cost.command}` | {warm} | {cached} | {uncached} | {measured} | "
                    f"{_cell(cost.gives_up)} |")
    return "\n".join(rows)


def whatif_speed(name: str) -> str:
    """``bench/whatif.py``'s latencies of the What-if tab, from ``data/speed/<name>.json``, with their ratio to a full run.

    One row per latency: the seconds, and the share of the full run of the
    same size timed in the same process (``-`` where the file has none).
    """
    from bsi.units import duration

    result = json.loads((ROOT / "data" / "speed" / f"{name}.json").read_text(encoding="utf-8"))
    full = result.get("full_run_s")

    def row(label: str, seconds: float) -> str:
        shown = f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"
        share = f"{seconds / full:.2%} ({full / seconds:,.0f}x faster)" if full else "-"
        return f"| {label} | {shown} | {share} |"

    redraw = result["redraw_s"]
    rows = ["| what | time | share of a full run |", "|---|---|---|",
            row(f"rule redraw, median of {redraw['count']} settings", redraw["median"]),
            row("rule redraw, the slowest", redraw["max"])]
    rows += [row(f"measure: {label}", seconds) for label, seconds in result["measure_s"].items()]
    rows += [row(f"eps: {label}", seconds) for label, seconds in result["eps_s"].items()]
    caches = result["caches"]
    names = {"finetune": "fine-tune", "conversion": "conversion"}
    cached = " and ".join(names.get(k, k) for k, v in caches.items() if v) or "nothing"
    rows.append(row(f"prepare ({cached} cached)", result["prepare_s"]))
    if full:
        rows.append(f"| the full run of the same size (the baseline) | {duration(full)} | 100% |")
    return "\n".join(rows)


def defaults_table() -> str:
    """The table "the paper and bsi's defaults", links relative to the repository root (the README)."""
    from bsi.teaching import defaults_table_markdown

    return defaults_table_markdown("docs/")


def shipped_tables(name: str) -> str:
    """The tables of the sweep shipped in ``data/sweeps/<name>`` (its ``results.md``; see :mod:`bsi.shipped`)."""
    from bsi.shipped import study_tables

    return study_tables(name, ROOT / "data")


def _own_task(metrics: dict | None, task: str) -> str:
    """A run's metric on its own task: accuracy and loss (qa) or token perplexity (text); "-" when not evaluated."""
    if not metrics or metrics.get("loss") is None:
        return "-"
    if task == "text":
        return f"perplexity {metrics['perplexity']:.2f}"
    return f"{100 * metrics['accuracy']:.0f}% / {metrics['loss']:.4f}"


def general_text_table(path: str = "data/general-text.json") -> str:
    """What each preset costs on general text, from ``bench/general_text.py``'s JSON: one row per run.

    Each row: the preset, the task it compressed for, its size, its own task
    before and after, and lm-eval's WikiText-2 word perplexity and bits per
    byte of its fine-tuned dense model and of the compressed model.
    """
    from bsi.shipped import read_general_text

    record = read_general_text(ROOT / path)
    if record is None:
        return f"Not measured yet: `python bench/general_text.py --runs FOLDER ... --out {path}` measures it."
    rows = ["| preset | compressed for | whole model | its own task: dense -> compressed | WikiText-2 word perplexity: "
            "dense -> compressed | bits per byte |", "|---|---|---|---|---|---|"]
    for run in record["runs"]:
        own = f"{_own_task(run['before'], run['task'])} -> {_own_task(run['after'], run['task'])}"
        dense, compressed = run["dense"], run["compressed"]
        rows.append(f"| `{run['preset']}` | {run['data']} ({run['task']}) | {run['compression_ratio']:.2f}x | {own} "
                    f"| {dense['word_perplexity']:,.1f} -> **{compressed['word_perplexity']:,.1f}** "
                    f"| {dense['bits_per_byte']:.3f} -> {compressed['bits_per_byte']:.3f} |")
    shipped = record.get("embedded_as_shipped")
    tail = (f"The embedded model as shipped, before any fine-tune: word perplexity {shipped['word_perplexity']:.2f}, "
            f"{shipped['bits_per_byte']:.3f} bits per byte. " if shipped else "")
    rows += ["", f"{tail}lm-eval {record['lm_eval_version']}, task `{record['task']}`, the first "
                 f"{record['articles']} WikiText-2 test articles, {record['date']}; own task: accuracy / answer-token "
                 "loss (qa) or token perplexity (text) from the run's `summary.json`. Measured with "
                 f"`{record['command']}`."]
    return "\n".join(rows)


def _interval(stat: dict, scale: float, digits: int) -> str:
    """A paired difference as ``+e [low, high]`` (``scale``: 100 for points), "within noise" when it holds 0."""
    text = (f"{stat['estimate'] * scale:+.{digits}f} [{stat['low'] * scale:+.{digits}f}, "
            f"{stat['high'] * scale:+.{digits}f}]")
    return text + ("" if stat["excludes_zero"] else ", within noise")


def runs_side_by_side(*names: str) -> str:
    """The same preset on several models, one row per run shipped in ``data/runs/<name>``, from its ``summary.json``.

    Each row: the model, its size before, the whole-model ratio and the
    compressible layers' share left; accuracy / answer-token loss of the
    fine-tuned dense model, of that model given the compressed model's
    recovery steps (the equal-budget reference, ``--dense-recovery``; "-"
    without it) and of the compressed model; and the paired differences
    (compressed minus each reference) with their 95% intervals over the
    run's test problems.
    """
    rows = ["| model | parameters | whole model | linear layers left | dense, fine-tuned | dense, + the same "
            "recovery steps | compressed | compressed - fine-tuned dense: points [95%] | compressed - equal-budget "
            "dense: points [95%] | loss [95%] | run |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        summary = json.loads((ROOT / "data" / "runs" / name / "summary.json").read_text(encoding="utf-8"))
        task, paired = summary["task"], summary["paired"]
        equal = paired.get("recovered - dense_recovered")
        rows.append(f"| `{summary['model']}` | {summary['params_before'] / 1e6:.0f}M | "
                    f"{summary['compression_ratio']:.2f}x | {summary['compressible_ratio']:.0%} | "
                    f"{_own_task(summary['metrics_before'], task)} | "
                    f"{_own_task(summary.get('metrics_dense_recovered'), task)} | "
                    f"{_own_task(summary['metrics_after'], task)} | "
                    f"{_interval(paired['recovered - finetuned']['accuracy'], 100, 0)} | "
                    f"{_interval(equal['accuracy'], 100, 0) if equal else '-'} | "
                    f"{_interval(equal['loss'], 1, 4) if equal else '-'} | "
                    f"[{name}](../data/runs/{name}/summary.json) |")
    return "\n".join(rows)


def text_runs_side_by_side(*names: str) -> str:
    """The text preset on several models, one row per run shipped in ``data/runs/<name>``, from its ``summary.json``.

    As :func:`runs_side_by_side`, in the text task's terms: perplexity (mean
    next-token loss in nats) of the fine-tuned dense model, of that model
    given the compressed model's recovery steps, and of the compressed model,
    and the paired differences in loss with their 95% intervals over the
    held-out windows.
    """
    rows = ["| model | parameters | whole model | linear layers left | dense, fine-tuned | dense, + the same "
            "recovery steps | compressed | compressed - fine-tuned dense: loss [95%] | compressed - equal-budget "
            "dense: loss [95%] | windows | run |", "|---|---|---|---|---|---|---|---|---|---|---|"]

    def shown(metrics: dict | None) -> str:
        return "-" if not metrics else f"{metrics['perplexity']:.2f} ({metrics['loss']:.4f})"

    for name in names:
        summary = json.loads((ROOT / "data" / "runs" / name / "summary.json").read_text(encoding="utf-8"))
        paired = summary["paired"]
        equal = paired.get("recovered - dense_recovered")
        rows.append(f"| `{summary['model']}` | {summary['params_before'] / 1e6:.0f}M | "
                    f"{summary['compression_ratio']:.2f}x | {summary['compressible_ratio']:.0%} | "
                    f"{shown(summary['metrics_before'])} | {shown(summary.get('metrics_dense_recovered'))} | "
                    f"{shown(summary['metrics_after'])} | {_interval(paired['recovered - finetuned']['loss'], 1, 4)} | "
                    f"{_interval(equal['loss'], 1, 4) if equal else '-'} | {summary['metrics_after']['loss_examples']} | "
                    f"[{name}](../data/runs/{name}/summary.json) |")
    return "\n".join(rows)


def _sweep_cells(name: str) -> tuple[str, list[int], dict[str, dict[str, dict]], str]:
    """A shipped sweep's model, seeds, protocol-``tuned`` cells (method -> size -> statistics) and anchor method."""
    folder = ROOT / "data" / "sweeps" / name
    stats = json.loads((folder / "stats.json").read_text(encoding="utf-8"))
    sweep = json.loads((folder / "sweep.json").read_text(encoding="utf-8"))
    cells = stats["protocols"]["tuned"]["methods"]
    ordered = [stats["anchor"], *sweep["settings"]["methods"]]  # the anchor first, then the sweep's own order
    cells = {method: cells[method] for method in dict.fromkeys(ordered) if method in cells}
    return sweep["config"]["model"], stats["dense"]["seeds"], cells, stats["anchor"]


def _points_and_loss(stat: dict) -> str:
    """A paired difference of accuracy (points) and loss as ``+p [lo, hi] / +l [lo, hi]``, bold where it excludes 0."""
    from bsi.analysis.study import interval_text

    return (f"{interval_text(stat['accuracy'], 100, 1, signed=True)} / "
            f"{interval_text(stat['loss'], 1, 3, signed=True)}")


def sweep_seeds(name: str, *compared: str) -> str:
    """A shipped sweep's protocol-``tuned`` cells in two compact tables, from its ``stats.json``.

    The first: each method's accuracy and answer-token loss pooled over the
    seeds at every size (no intervals: the sweep's own tables carry them). The
    second, for the ``compared`` methods (all but the anchor when none are
    named): the anchor (``bsi``) minus the method seed by seed, then the 95%
    t-interval over those per-seed differences, the run-to-run interval that
    the pooled bootstrap (which resamples problems, not training runs) leaves
    out; **bold** where it excludes 0.
    """
    _, seeds, cells, anchor = _sweep_cells(name)
    sizes = sorted({size for method in cells for size in cells[method]}, key=float, reverse=True)

    def ratio(size: str) -> str:
        return f"{next(cells[m][size]['compression_ratio'] for m in cells if size in cells[m]):.2f}x"

    rows = ["| method | " + " | ".join(f"{size} ({ratio(size)})" for size in sizes) + " |",
            "|---|" + "---|" * len(sizes)]
    for method, by_size in cells.items():
        rows.append(f"| `{method}` | " + " | ".join(
            f"{100 * by_size[size]['accuracy']['estimate']:.1f}% / {by_size[size]['loss']['estimate']:.3f}"
            if size in by_size else "" for size in sizes) + " |")
    rows += ["", f"`{anchor}` minus the method, seed by seed ({', '.join(map(str, seeds))}), then the 95% t-interval "
                 "over the seeds: accuracy in points; loss (**bold**: the t-interval excludes 0).", "",
             f"| `{anchor}` minus | " + " | ".join(sizes) + " |", "|---|" + "---|" * len(sizes)]
    for method in compared or [m for m in cells if m != anchor]:
        texts = []
        for size in sizes:
            vs = cells[method].get(size, {}).get("vs_anchor")
            if not vs or "per_seed" not in vs:
                texts.append("")
                continue
            accuracy = ", ".join(f"{100 * d:+.1f}" for d in vs["per_seed"]["accuracy"])
            loss = ", ".join(f"{d:+.3f}" for d in vs["per_seed"]["loss"])
            over = vs["over_seeds"]
            texts.append(f"{accuracy} {_t_interval(over['accuracy'], 100, 1)}; {loss} {_t_interval(over['loss'], 1, 3)}")
        rows.append(f"| `{method}` | " + " | ".join(texts) + " |")
    return "\n".join(rows)


def _t_interval(entry: dict, scale: float, digits: int) -> str:
    """``[low, high]`` of an interval over seeds, signed, times ``scale``; **bold** where it excludes 0."""
    text = f"[{scale * entry['low']:+.{digits}f}, {scale * entry['high']:+.{digits}f}]"
    return f"**{text}**" if entry.get("excludes_zero") else text


def sweeps_side_by_side(*names: str) -> str:
    """One sweep preset on several models, from each shipped sweep's ``stats.json`` (protocol ``tuned``).

    A first table: each method at each size (the share of the linear layers
    kept) with, per model, its pooled accuracy and answer-token loss and the
    anchor method (``bsi``) minus it, paired 95% bootstrap intervals pooled
    over that sweep's seeds (bold: the interval excludes 0), and † where the
    t-interval over that sweep's own seeds excludes 0 too. A second: the
    methods in order of loss at each size on each model, and whether the
    orders agree, so a change of ranking between the models is stated, not
    left for the reader to find.
    """
    from bsi.analysis.study import difference_text, methods_by_loss

    sweeps = [_sweep_cells(name) for name in names]
    anchor = sweeps[0][3]
    sizes = sorted({size for _, _, cells, _ in sweeps for method in cells for size in cells[method]},
                   key=float, reverse=True)
    methods = list(dict.fromkeys(method for _, _, cells, _ in sweeps for method in cells))
    header = "| linear layers kept | method | " + " | ".join(
        f"`{model}` (seeds {', '.join(map(str, seeds))}): accuracy % / loss | {anchor} - method: points / loss [95%]"
        for model, seeds, _, _ in sweeps) + " |"
    rows = [header, "|---|---|" + "---|---|" * len(sweeps)]
    for size in sizes:
        ratios = " / ".join(
            f"{next(cells[m][size]['compression_ratio'] for m in cells if size in cells[m]):.2f}x"
            if any(size in cells[m] for m in cells) else "-" for _, _, cells, _ in sweeps)
        for method in methods:
            if not any(size in cells.get(method, {}) for _, _, cells, _ in sweeps):
                continue
            row = f"| {size} ({ratios}) | `{method}` |"
            for _, _, cells, _ in sweeps:
                cell = cells.get(method, {}).get(size)
                if cell is None:
                    row += " | |"
                    continue
                row += (f" {100 * cell['accuracy']['estimate']:.1f} / {cell['loss']['estimate']:.3f} | "
                        f"{difference_text(cell['vs_anchor']) if 'vs_anchor' in cell else '(the anchor)'} |")
            rows.append(row)
    if any(len(seeds) > 1 for _, seeds, _, _ in sweeps):
        rows += ["", "†: with two seeds or more, the 95% t-interval over the seeds' own differences excludes 0 as "
                     "well, so the difference holds across training runs, not only across the test problems drawn."]
    rows += ["", "| linear layers kept | " + " | ".join(f"`{model}`: lowest loss first" for model, _, _, _ in sweeps)
             + " | the same order? |", "|---|" + "---|" * (len(sweeps) + 1)]
    for size in sizes:
        orders = [methods_by_loss(cells, size) for _, _, cells, _ in sweeps]
        common = [method for method in orders[0] if all(method in order for order in orders)]
        same = all([m for m in order if m in common] == common for order in orders)
        rows.append(f"| {size} | " + " | ".join(" < ".join(f"`{m}`" for m in order) for order in orders)
                    + f" | {'yes' if same else '**no**'} |")
    rows += ["", "The orders compare the estimates only: neighbours in an order can be within noise of each other "
                 "(the first table says which), and only methods that ran on every model count for \"the same order\"."]
    return "\n".join(rows)


def _tuned_cells(name: str, seeds: set[int] | None = None) -> tuple[dict, list]:
    """A shipped sweep's protocol-``tuned`` statistics per method and size, and its rows (only ``seeds`` if given)."""
    from bsi.analysis.study import folder_loader, study_stats
    from bsi.results import read_study_rows

    folder = ROOT / "data" / "sweeps" / name
    rows = [r for r in read_study_rows(folder / "results.jsonl") if seeds is None or r.seed in seeds]
    return study_stats(rows, folder_loader(folder), ["tuned"])["protocols"]["tuned"]["methods"], rows


def equal_training(same: str, equal: str, method: str) -> str:
    """``method`` against the anchor (``bsi``) with the same recovery and with the same training, seed by seed.

    ``same`` is a shipped sweep where every method got the same recovery
    steps; ``equal`` one made with ``--match-training`` on some of its seeds,
    where ``method`` also recovered for the anchor's own tuning steps up to
    each size. Both are read from their rows and outcomes, restricted to the
    seeds ``equal`` holds (the same test problems, the same anchor models),
    so the two differences are paired the same way. Paired 95% bootstrap
    intervals over the test problems (**bold**: excludes 0).
    """
    from bsi.analysis.study import interval_text

    equal_cells, equal_rows = _tuned_cells(equal)
    seeds = {r.seed for r in equal_rows}
    same_cells, same_rows = _tuned_cells(same, seeds)
    anchor = next(iter(equal_cells))
    sizes = sorted(set(equal_cells.get(method, {})) & set(same_cells.get(method, {})), key=float, reverse=True)

    def training(rows: list, who: str, size: str) -> str:
        row = next(r for r in rows if r.method == who and f"{r.target:g}" == size and r.recovered)
        path = "" if row.run.path_steps is None else f"{row.run.path_steps} + "
        return f"{path}{row.run.recover_steps}"

    def shown(cell: dict) -> str:
        return f"{100 * cell['accuracy']['estimate']:.1f}% / {cell['loss']['estimate']:.3f}"

    def by_seed(cell: dict) -> str:  # each seed's own difference: how far one run moves (with two seeds or more)
        per_seed = cell["vs_anchor"].get("per_seed", {})
        if len(seeds) < 2 or not per_seed:
            return ""
        points = ", ".join(f"{100 * d:+.1f}" for d in per_seed["accuracy"])
        losses = ", ".join(f"{d:+.3f}" for d in per_seed["loss"])
        return f"; per seed {points} / {losses}"

    rows = [f"| size | `{anchor}`: steps, accuracy / loss | `{method}`, the same recovery: steps, accuracy / loss | "
            f"`{anchor}` minus it | `{method}`, the same training: steps, accuracy / loss | `{anchor}` minus it |",
            "|---|---|---|---|---|---|"]
    for size in sizes:
        mine, same_cell, equal_cell = equal_cells[anchor][size], same_cells[method][size], equal_cells[method][size]
        rows.append(f"| {size} ({equal_cell['compression_ratio']:.2f}x) | {training(equal_rows, anchor, size)}: "
                    f"{shown(mine)} | {training(same_rows, method, size)}: {shown(same_cell)} | "
                    f"{_points_and_loss(same_cell['vs_anchor'])}{by_seed(same_cell)} | "
                    f"{training(equal_rows, method, size)}: {shown(equal_cell)} | "
                    f"{_points_and_loss(equal_cell['vs_anchor'])}{by_seed(equal_cell)} |")
    def anchor_losses(rows: list, seed: int) -> dict[str, float]:
        return {f"{r.target:g}": r.metrics.loss for r in rows
                if r.method == anchor and r.protocol == "tuned" and r.seed == seed and r.recovered}

    def same_models(seed: int) -> bool:  # the anchor's losses of one seed agree to the 4 digits shown, at shared sizes
        mine, theirs = anchor_losses(equal_rows, seed), anchor_losses(same_rows, seed)
        return all(abs(mine[size] - theirs[size]) <= 1e-4 * abs(theirs[size]) for size in set(mine) & set(theirs))

    alike = [s for s in sorted(seeds) if same_models(s)]
    unlike = [s for s in sorted(seeds) if s not in alike]
    loss_at = (f"{interval_text(same_cells[anchor][sizes[0]]['loss'], 1, 4)} and "
               f"{interval_text(equal_cells[anchor][sizes[0]]['loss'], 1, 4)} at {sizes[0]}, pooled")
    if not unlike:
        models = f"`{anchor}`'s models are the same in both sweeps, to the digits shown ({loss_at})."
    else:
        models = (f"`{anchor}`'s models are the same in both sweeps on seed{'s' if len(alike) != 1 else ''} "
                  f"{', '.join(map(str, alike)) or 'none'}, and differ on seed{'s' if len(unlike) > 1 else ''} "
                  f"{', '.join(map(str, unlike))}, made again: the whole path drifted from the fine-tune on "
                  f"({loss_at}; the folders' command.txt say where each seed ran). Each difference is between the "
                  f"models of one sweep (the `{anchor}` column: `{equal}`'s).")
    rows += ["", f"Seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, sorted(seeds)))} (pooled intervals resample "
                 "the test problems of every seed; \"per seed\": each seed's own difference, in seed order); steps: "
                 "the method's own "
                 f"tuning up to the size + its recovery, after the task fine-tune (the same-recovery rows were made "
                 f"before path steps were recorded: `{method}`'s path trains nothing). {models}"]
    return "\n".join(rows)


def score_ablation(ablations: str, methods: str, *others: str) -> str:
    """The anchor (``bsi``) against one-change ablations of its score, size by size, on the seeds ``ablations`` holds.

    ``ablations`` is a shipped sweep with the anchor and the ``methods``
    (comma-separated: ``bsi-curvature,bsi-grad-tested``); each of ``others`` is
    ``FOLDER:METHOD``, a method taken from another shipped sweep of the same
    preset, restricted to the same seeds (the same test problems and the same
    anchor models, as the anchor's rows in both say). Per cell: accuracy /
    loss, then the anchor minus the method with its paired 95% bootstrap
    interval over the test problems (**bold**: excludes 0), and the share of
    the tested gradient terms that passed the z-test along the path where
    the score tests them.
    """
    cells, rows = _tuned_cells(ablations)
    seeds = {r.seed for r in rows}
    anchor = next(iter(cells))
    compared = [(m, cells[m], rows) for m in methods.split(",")]
    fewer = []  # a note for each method taken from a sweep that lacks some of these seeds
    for other in others:
        name, method = other.split(":")
        other_cells, other_rows = _tuned_cells(name, seeds)
        compared.insert(0, (method, other_cells[method], other_rows))
        held = sorted({r.seed for r in other_rows if r.method == method})
        if set(held) != seeds:
            fewer.append(f"`{method}` and the `{anchor}` models it is compared with: seed{'s' if len(held) > 1 else ''} "
                         f"{', '.join(map(str, held))}, all that `{name}` holds")
    sizes = sorted(cells[anchor], key=float, reverse=True)
    first = next(r for r in rows if r.method == anchor and r.recovered)

    def passed(rows: list, who: str, size: str) -> str:
        """The share of tested gradient terms that passed, the largest over the seeds' paths ("" if untested)."""
        runs = [r.run for r in rows if r.method == who and f"{r.target:g}" == size and r.recovered and r.run]
        shares = [run.gradient_passed for run in runs if run.gradient_passed is not None
                  and math.isfinite(run.gradient_passed)]
        if not shares:
            return ""
        return f"; {100 * max(shares):.1f}% passed"

    def shown(cell: dict) -> str:
        return f"{100 * cell['accuracy']['estimate']:.1f}% / {cell['loss']['estimate']:.3f}"

    lines = [f"| size | `{anchor}`: accuracy / loss | " + " | ".join(
        f"`{m}` | `{anchor}` minus it" for m, _, _ in compared) + " |", "|---|---|" + "---|---|" * len(compared)]
    for size in sizes:
        cell = cells[anchor][size]
        line = f"| {size} ({cell['compression_ratio']:.2f}x) | {shown(cell)}{passed(rows, anchor, size)} |"
        for method, theirs, their_rows in compared:
            if size not in theirs:
                line += " - | - |"
                continue
            line += (f" {shown(theirs[size])}{passed(their_rows, method, size)} | "
                     f"{_points_and_loss(theirs[size]['vs_anchor'])} |")
        lines.append(line)
    lines += ["", f"Seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, sorted(seeds)))}"
                  + "".join(f"; {note}" for note in fewer) + ". "
                  f"{first.metrics.examples} test problems for accuracy per seed; the same recovery for every method "
                  f"({first.run.recover_steps if first.run else '?'} steps after its path)"
                  + ("; \"passed\": the largest share of tested gradient terms that passed on any seed's path."
                     if len(seeds) > 1 else ".")]
    return "\n".join(lines)


def sweep_log_rounds(name: str, *shown: str) -> str:
    """The mean tuning loss of chosen rounds from each ``sweep-<label>.log`` shipped in ``data/sweeps/<name>``.

    One row per log (its label: protocol and method), one column per round
    in ``shown`` (default 1, 2 and 3), then the last round it finished. The
    loss during round ``k`` follows the cut of round ``k - 1``, so a jump
    from round 1 to round 2 is the first cut's cost. A path stopped before a
    shown round leaves "-".
    """
    from bsi.shipped import round_losses

    folder = ROOT / "data" / "sweeps" / name
    logs = sorted(folder.glob("sweep-*.log"))
    wanted = [int(x) for x in shown] or [1, 2, 3]
    rows = ["| log | " + " | ".join(f"round {k}" for k in wanted) + " | last round it finished | bases kept then |",
            "|---|" + "---|" * (len(wanted) + 2)]
    for log in logs:
        rounds = round_losses(log.read_text(encoding="utf-8"))
        if not rounds:
            continue
        by_round = {r[0]: r for r in rounds}
        last = rounds[-1]
        rows.append(f"| `{log.name}` | " + " | ".join(f"{by_round[k][3]:.3f}" if k in by_round else "-"
                                                      for k in wanted)
                    + f" | {last[0]} of {last[1]}: {last[3]:.3f} | {last[2]:,} |")
    return "\n".join(rows)


def run_profiles(*names: str) -> str:
    """Where whole ``bsi compress`` runs spent their time, side by side, from ``bench/run_profile.py``'s JSON files.

    ``names`` are files ``data/speed/<name>.json``; one column per file,
    one row per part of the run (indented under the part it belongs to),
    each cell its sampled seconds and its share of that run.
    """
    profiles = [json.loads((ROOT / "data" / "speed" / f"{name}.json").read_text(encoding="utf-8")) for name in names]
    parts = list(profiles[0]["parts"])
    rows = ["| part of the run | " + " | ".join(f"`{name}`: seconds (share)" for name in names) + " |",
            "|---|" + "---|" * len(names)]
    for label in parts:
        depth = profiles[0]["parts"][label].get("depth", 0)
        cells = [f"{p['parts'][label]['seconds']:.0f} ({p['parts'][label]['share']:.1%})" if label in p["parts"]
                 else "-" for p in profiles]
        rows.append(f"| {'&nbsp;' * 4 * depth}{label} | " + " | ".join(cells) + " |")
    rows.append("| whole run, sampled / wall | " + " | ".join(
        f"{p['seconds']:.0f} / {p['wall_s']:.0f}" if p.get("wall_s") else f"{p['seconds']:.0f} / -"
        for p in profiles) + " |")
    return "\n".join(rows)


def speed_evaluation(*names: str) -> str:
    """``bench/speed.py --sections evaluate`` results, one row per variant and model, from ``data/speed/<name>.json``.

    Each variant's median time, its speed-up over the file's baseline (the
    decode loop without a draft) and how many answers, marks and how much
    loss differ from the baseline's on the same problems.
    """
    rows = ["| model | evaluation | time (median) | speed-up | answers that differ | marks that differ | accuracy | "
            "loss - baseline's |", "|---|---|---|---|---|---|---|---|"]
    for name in names:
        result = json.loads((ROOT / "data" / "speed" / f"{name}.json").read_text(encoding="utf-8"))
        evaluation = result["evaluate"]
        for variant, timing in evaluation["timings"].items():
            quality, ratio = evaluation["quality"][variant], evaluation["ratios"].get(variant)
            rows.append(f"| `{name}` ({evaluation['problems']} problems) | {variant} | {timing['median_s']:.2f} s | "
                        f"{'baseline' if ratio is None else f'{ratio:.2f}x'} | {quality['answers_differ']} | "
                        f"{quality['correct_differ']} | {100 * quality['accuracy']:.0f}% | "
                        f"{quality['loss_difference']:+.1e} |")
    return "\n".join(rows)


def suite_durations(*names: str, rows: int = 15) -> str:
    """Where test runs spent their time, side by side, from ``bench/test_durations.py``'s JSON files.

    ``names`` are files ``data/speed/<name>.json``; one column per run, one
    row per test file (the first run's ``rows`` longest, then the rest
    together), each cell the seconds its tests took (setup, call and
    teardown), then the seconds inside tests and the wall time pytest printed.
    A file the suite no longer has (merged into another since) is named
    without code quotes, and says so.
    """
    from bsi.units import duration

    def name_of(file: str) -> str:
        return f"`{file}`" if (ROOT / file).exists() else f"{file} (no longer in the suite)"

    runs = [json.loads((ROOT / "data" / "speed" / f"{name}.json").read_text(encoding="utf-8")) for name in names]
    files = list(runs[0]["files"])
    shown = set(files[:rows])
    lines = ["| test file | " + " | ".join(f"`{name}` ({r['workers']} worker{'s' if r['workers'] > 1 else ''}): s"
                                          for name, r in zip(names, runs)) + " |", "|---|" + "---|" * len(runs)]
    for file in files[:rows]:
        lines.append(f"| {name_of(file)} | " + " | ".join(f"{r['files'].get(file, 0):.1f}" for r in runs) + " |")
    lines.append(f"| the other {len(files) - len(shown)} files | " + " | ".join(
        f"{sum(s for f, s in r['files'].items() if f not in shown):.1f}" for r in runs) + " |")
    lines.append("| inside tests, all files | " + " | ".join(f"{r['seconds_in_tests']:.0f}" for r in runs) + " |")
    lines.append("| wall time (pytest) | " + " | ".join(f"{duration(r['wall_s'])}" for r in runs) + " |")
    lines.append("| result | " + " | ".join(r["summary"] for r in runs) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------ filling the files
GENERATORS: dict[str, Callable[..., str]] = {"flags": flag_tables, "json-only": json_only, "presets": preset_table,
                                             "modules": module_map, "defaults": defaults_table,
                                             "walkthroughs": walkthrough_list, "preset-costs": preset_cost_table,
                                             "shipped": shipped_tables, "general-text": general_text_table,
                                             "runs-side-by-side": runs_side_by_side,
                                             "text-runs-side-by-side": text_runs_side_by_side,
                                             "sweeps-side-by-side": sweeps_side_by_side, "sweep-seeds": sweep_seeds,
                                             "sweep-log-rounds": sweep_log_rounds, "run-profiles": run_profiles,
                                             "speed-evaluation": speed_evaluation, "test-durations": suite_durations,
                                             "whatif-speed": whatif_speed, "equal-training": equal_training,
                                             "score-ablation": score_ablation}


def generate(what: str) -> str:
    """The content of the generated part named ``what`` (``flags eval``, ``presets``, ``modules``)."""
    name, *args = what.split()
    if name not in GENERATORS:
        raise ValueError(f"unknown generated part '{what}': use one of {', '.join(GENERATORS)}")
    return GENERATORS[name](*args)


def render(text: str) -> str:
    """``text`` with every generated part regenerated (the prose around them untouched)."""
    out, position = [], 0
    for start in START.finditer(text):
        end = text.find(END, start.end())
        if end < 0:
            raise ValueError(f"'{start.group()}' has no '{END}' after it")
        out += [text[position:start.end()], "\n\n", generate(start["what"]), "\n\n"]
        position = end
    return "".join(out) + text[position:]


def stale(root: Path = ROOT) -> list[str]:
    """The files of :data:`DOC_FILES` whose generated parts differ from what the code generates now."""
    return [name for name in DOC_FILES
            if render((root / name).read_text(encoding="utf-8")) != (root / name).read_text(encoding="utf-8")]


def main(argv: list[str] | None = None) -> int:
    """Regenerate the generated parts of :data:`DOC_FILES` in place (``--check``: only report stale files)."""
    parser = argparse.ArgumentParser(prog="python -m bsi.cli.docs", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file is stale")
    args = parser.parse_args(argv)
    from bsi.files import atomic_write_text

    changed = stale()
    if args.check:
        for name in changed:
            print(f"{name} is stale: run `make docs` (python -m bsi.cli.docs)", file=sys.stderr)
        return 1 if changed else 0
    for name in changed:
        atomic_write_text(ROOT / name, render((ROOT / name).read_text(encoding="utf-8")))
        print(f"regenerated {name}")
    if not changed:
        print("the generated parts of " + ", ".join(DOC_FILES) + " are current")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
