"""The results that ship with bsi (``data/``): finished runs without weights and sweep folders, and how they get there.

``data/`` at the top of the repository holds measured results with their
raw data (layout: ``data/README.md``): ``data/runs/<name>/`` a finished
``bsi compress`` run without its weights (``summary.json``,
``rounds.jsonl``, ``outcomes.jsonl``) and ``data/sweeps/<name>/`` a
``bsi sweep`` folder (rows, statistics, tables, every model's per-problem
outcomes and each seed's test problems). Both are read as they are by
``bsi answers``, ``bsi sweep --merge`` and the dashboard, which opens
:data:`FIRST_RUN` and :data:`FIRST_SWEEP` on a first visit.

:func:`ship_run` and :func:`ship_sweep` copy a finished folder here,
checking first that it is complete and readable and leaving out what is
large or local (weights, the sweep's ``figure.html``, its lock file); a
sweep made before sweeps stored their test problems gets them rebuilt from
its configuration (no model needed). :func:`study_tables` is the generated
part of ``docs/results/`` (``python -m bsi.cli.docs``): a shipped sweep's
tables, exactly as its ``results.md``, which the tests recompute from the
shipped rows and outcomes. :func:`draw_sweep_figure` draws a shipped sweep's
figure for the docs (``docs/<name>.png`` and ``.html``), stamped with the
SHA-256 of the ``stats.json`` it was drawn from, so a test can tell a figure
whose data changed or does not ship.

Command line::

    python -m bsi.shipped run runs/default default --command "bsi compress --preset default --dense-recovery"
    python -m bsi.shipped sweep runs/sq-s0 study-quick --command "bsi sweep --preset study-quick"
    python -m bsi.shipped figure study-quick      # docs/study-quick.png and .html from data/sweeps/study-quick
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path

from bsi.errors import BSIError
from bsi.files import atomic_directory, atomic_write_bytes, atomic_write_json, atomic_write_text
from bsi.results import StudyRow, read_study_rows

DATA = Path(__file__).resolve().parents[1] / "data"
"""The repository's ``data/`` folder (present in a checkout; an installed wheel has none)."""

FIRST_RUN = "default"
"""The shipped run the dashboard opens on a first visit (``data/runs/<FIRST_RUN>``)."""
FIRST_SWEEP = "study-quick"
"""The shipped sweep the Compare tab opens on a first visit (``data/sweeps/<FIRST_SWEEP>``)."""

RUN_FILES = ("summary.json", "rounds.jsonl", "outcomes.jsonl")
"""What a shipped run keeps of a ``bsi compress`` folder (no weights)."""
RUN_EXTRAS = ("steps.jsonl", "spectrum/spectrum.json")
"""Kept too when the run has them: every step's loss, and a ``bsi spectrum --out spectrum`` result saved beside it."""
ROUND_RECORDS = "rounds-layers.jsonl.gz"
"""Every round's per-layer record (:data:`bsi.pipeline.runner.ROUND_RECORDS`), shipped with its floats rounded."""
RECORD_DIGITS = 4
"""Significant figures a shipped round record keeps (the Inspect tab shows four; 1.8 MB instead of 5.8 MB for ``tour``)."""
SWEEP_FILES = ("sweep.json", "results.jsonl", "stats.json", "results.md")
"""What a shipped sweep keeps besides its outcome files (not ``figure.html``: 4.7 MB of plotly, redrawn on demand)."""


def shipped_run(name: str = FIRST_RUN, root: Path = DATA) -> Path | None:
    """``data/runs/<name>`` when it holds a shipped run, else None."""
    folder = root / "runs" / name
    return folder if (folder / "summary.json").is_file() else None


def shipped_sweep(name: str = FIRST_SWEEP, root: Path = DATA) -> Path | None:
    """``data/sweeps/<name>`` when it holds a shipped sweep, else None."""
    folder = root / "sweeps" / name
    return folder if (folder / "results.jsonl").is_file() else None


def shipped_sweep_names(root: Path = DATA) -> list[str]:
    """The names of every sweep shipped in ``data/sweeps``, :data:`FIRST_SWEEP` first, then by name."""
    found = sorted(p.name for p in (root / "sweeps").glob("*") if shipped_sweep(p.name, root))
    return sorted(found, key=lambda name: name != FIRST_SWEEP)


GENERAL_TEXT = "general-text.json"
"""What each preset's run costs on general text (``bench/general_text.py --out data/general-text.json``)."""


def general_text_costs(root: Path = DATA) -> dict[str, dict]:
    """Each measured preset's row of ``data/general-text.json``, by preset name; empty when nothing was measured.

    A row holds the run's own task before and after, and lm-eval's WikiText-2
    word perplexity and bits per byte of its fine-tuned dense model
    (``dense``) and of the compressed model (``compressed``).
    """
    record = read_general_text(root / GENERAL_TEXT)
    if record is None:
        return {}
    return {row["preset"]: row | {"articles": record["articles"]} for row in record["runs"]}


def read_general_text(path: Path) -> dict | None:
    """The whole record ``bench/general_text.py`` wrote to ``path`` (runs, lm-eval version, command), or None."""
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def general_text_sentence(row: dict) -> str:
    """``On general text (WikiText-2, lm-eval word perplexity, 3 articles): 31.6 before compressing, 43,765 after.``"""
    return (f"On general text (WikiText-2, lm-eval word perplexity, {row['articles']} articles): "
            f"{row['dense']['word_perplexity']:,.1f} before compressing, {row['compressed']['word_perplexity']:,.1f} "
            "after.")


def rounded(value, digits: int = RECORD_DIGITS):
    """``value`` (JSON data) with every float rounded to ``digits`` significant figures (ints, strings, None kept)."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, list):
        return [rounded(v, digits) for v in value]
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    return value


def _provenance(command: str, source: Path) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"{command}\n# shipped from {source} on {stamp} by `python -m bsi.shipped`\n"


def ship_run(source: str | Path, name: str, command: str, root: Path = DATA) -> Path:
    """Copy the finished run in ``source`` to ``data/runs/<name>`` (replacing it), without its weights.

    Kept: :data:`RUN_FILES`, the :data:`RUN_EXTRAS` it has, and its round
    records with every float rounded to :data:`RECORD_DIGITS` significant
    figures (what the Inspect tab shows).

    The run must be finished (``summary.json``) and its answers readable
    (:func:`bsi.analysis.answers.read_run_answers`), or on a text task its
    per-window losses (:func:`_check_run_window_losses`); ``command`` is what
    made it, kept in ``command.txt``.

    Raises:
        BSIError: an unfinished or unreadable run, named with what is missing.
    """
    from bsi.analysis.answers import read_run_answers

    source = Path(source).expanduser()
    missing = [f for f in RUN_FILES if not (source / f).is_file()]
    if missing:
        raise BSIError(f"'{source}' is not a finished run (no {', '.join(missing)}): give the --out folder of a "
                       "finished `bsi compress`")
    summary = json.loads((source / "summary.json").read_text(encoding="utf-8"))
    if summary.get("task") == "text":
        _check_run_window_losses(source / "outcomes.jsonl")
    else:
        read_run_answers(source)  # readable, with both models' answers
    target = root / "runs" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_directory(target) as tmp:
        for f in (*RUN_FILES, *(f for f in RUN_EXTRAS if (source / f).is_file())):
            (tmp / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / f, tmp / f)
        if (source / ROUND_RECORDS).is_file():
            with gzip.open(source / ROUND_RECORDS, "rt", encoding="utf-8") as read, \
                    gzip.open(tmp / ROUND_RECORDS, "wt", encoding="utf-8") as write:
                write.writelines(json.dumps(rounded(json.loads(line))) + "\n" for line in read if line.strip())
        atomic_write_text(tmp / "command.txt", _provenance(command, source))
    return target


def ship_sweep(source: str | Path, name: str, command: str, root: Path = DATA) -> Path:
    """Copy the sweep in ``source`` to ``data/sweeps/<name>`` (replacing it): rows, statistics, tables, outcomes.

    Every row's outcome file must be readable and hold answers
    (:class:`bsi.analysis.answers.SweepAnswers`); each seed's test problems
    (``outcomes/problems-s<seed>.json``) are copied, or rebuilt from the
    sweep's configuration where the sweep predates them. A text sweep's
    outcome files hold each held-out window's summed loss and token count
    instead (no answers, no problems): they must be readable and cover the
    windows the row scored. The sweep's lock file and ``figure.html`` stay
    behind.

    Raises:
        BSIError: a folder that is not a finished sweep, or an unreadable outcome file.
    """
    from bsi.analysis.answers import PROBLEMS, SweepAnswers, rebuild_problems

    source = Path(source).expanduser()
    missing = [f for f in SWEEP_FILES if not (source / f).is_file()]
    if missing:
        raise BSIError(f"'{source}' is not a finished sweep (no {', '.join(missing)}): give the --out folder of a "
                       "`bsi sweep` that has written its statistics")
    rows = read_study_rows(source / "results.jsonl")
    text = any(row.is_text for row in rows)  # a text task: per-window losses, no answers
    answers = None if text else SweepAnswers(source)  # every outcome file is read below; this checks they hold answers
    config = json.loads((source / "sweep.json").read_text(encoding="utf-8"))["config"]
    target = root / "sweeps" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_directory(target) as tmp:
        for f in SWEEP_FILES:
            shutil.copyfile(source / f, tmp / f)
        (tmp / "outcomes").mkdir()
        for row in rows:
            if row.outcomes:
                if text:
                    _check_window_losses(source / row.outcomes, row)
                else:
                    answers.columns(row)  # a one-line error if unreadable
                shutil.copyfile(source / row.outcomes, tmp / row.outcomes)
        for seed in sorted({int(row.seed) for row in rows} if not text else ()):
            problems = Path("outcomes") / PROBLEMS.format(seed=seed)
            if (source / problems).is_file():
                shutil.copyfile(source / problems, tmp / problems)
            else:
                dense = next(r for r in rows if r.is_reference and int(r.seed) == seed)
                count = len(answers.columns(dense)["correct"])  # the scored problems, the answered ones first
                rebuilt = rebuild_problems(config, seed)
                atomic_write_json(tmp / problems, {k: v[:count] for k, v in rebuilt.items()})
        atomic_write_text(tmp / "command.txt", _provenance(command, source))
    return target


def _check_run_window_losses(path: Path) -> None:
    """A text run's ``outcomes.jsonl``: each line a window's summed loss and token count, dense and compressed both."""
    models: dict[str, int] = {}
    try:
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            ok = isinstance(record["loss_sum"], (int, float)) and isinstance(record["tokens"], int) \
                and record["tokens"] > 0
            if not ok:
                raise ValueError(line)
            models[record["model"]] = models.get(record["model"], 0) + 1
    except (OSError, ValueError, KeyError, TypeError):
        models = {}
    if not {"finetuned", "recovered"} <= set(models) or len(set(models.values())) != 1:
        raise BSIError(f"'{path}' is not a readable text outcome file (each evaluated model's summed loss and token "
                       "count on the same held-out windows): run the text task again")


def _check_window_losses(path: Path, row: StudyRow) -> None:
    """A text row's outcome file: one summed loss and one token count per scored window (a one-line error if not)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        windows = len(data["loss_sum"])
        ok = windows == len(data["tokens"]) == int(row.metrics.loss_examples or windows) and windows > 0
    except (OSError, ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise BSIError(f"'{path}' is not a readable text outcome file (per-window loss_sum and tokens for the "
                       f"{row.metrics.loss_examples} windows its row scored): re-run that cell of the sweep")


def study_tables(name: str = FIRST_SWEEP, root: Path = DATA) -> str:
    """The generated part of ``docs/results/<name>.md``: the shipped sweep's tables (its ``results.md``)."""
    folder = shipped_sweep(name, root)
    if folder is None:
        return f"(no shipped sweep data/sweeps/{name} yet)"
    return (folder / "results.md").read_text(encoding="utf-8").strip()


DOCS = DATA.parent / "docs"
"""Where :func:`draw_sweep_figure` writes (the repository's ``docs/``)."""
FIGURE_STAMP = "bsi-source-sha256"
"""The PNG text key (and HTML comment) that names the SHA-256 of the ``stats.json`` a docs figure was drawn from."""


ROUND_LINE = re.compile(r"round (\d+)/(\d+): .*?([\d,]+) bases kept, mean tuning loss ([\d.]+)")
"""A pruning round's line in a ``bsi compress`` or ``bsi sweep`` log (:class:`bsi.reports.RoundReport`'s text)."""


def round_losses(log_text: str) -> list[tuple[int, int, int, float]]:
    """Every round line of a log as ``(round, rounds, bases kept, mean tuning loss)``, in order.

    The mean tuning loss of round ``k + 1`` is the first measure of what
    round ``k``'s cut did: it is taken on the tuning batches right after it,
    before recovery. A path stopped midway (a sweep cut by its time budget)
    still leaves the rounds it finished here, although it leaves no cell.
    """
    found = (ROUND_LINE.search(line) for line in log_text.splitlines())
    return [(int(m[1]), int(m[2]), int(m[3].replace(",", "")), float(m[4])) for m in found if m]


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of a file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def figure_stamp(path: Path) -> str | None:
    """The source SHA-256 a docs figure (``.png`` or ``.html``) carries, or None when it carries none."""
    if path.suffix == ".png":
        from PIL import Image

        with Image.open(path) as image:
            return image.info.get(FIGURE_STAMP)
    found = path.read_text(encoding="utf-8").split(f"<!-- {FIGURE_STAMP} ", 1)
    return found[1].split(" ", 1)[0] if len(found) == 2 else None


def draw_sweep_figure(name: str, root: Path = DATA, docs: Path = DOCS) -> list[Path]:
    """Draw the shipped sweep ``data/sweeps/<name>``'s figure into ``docs/<name>.png`` and ``docs/<name>.html``.

    The figure is :func:`bsi.analysis.figures.study_figure` of the sweep's
    ``stats.json`` (accuracy and loss against whole-model size, 95% bands);
    a budget curve's is :func:`bsi.analysis.budget.budget_figure` (against the budget).
    Both files carry that file's SHA-256 (a PNG text chunk, an HTML comment):
    a figure in the docs is only as good as the data it can be traced to.
    The HTML draws with the walkthroughs' local ``plotly.min.js`` (no CDN);
    the PNG needs kaleido's Chromium (``make chromium``).
    """
    folder = shipped_sweep(name, root)
    if folder is None or not (folder / "stats.json").is_file():
        raise BSIError(f"no shipped sweep with statistics at data/sweeps/{name}: ship one with "
                       "`python -m bsi.shipped sweep FOLDER NAME --command ...` first")
    from io import BytesIO

    from PIL import Image, PngImagePlugin

    from bsi.analysis.budget import budget_figure
    from bsi.analysis.figures import study_figure

    digest = file_sha256(folder / "stats.json")
    stats = json.loads((folder / "stats.json").read_text(encoding="utf-8"))
    figure = budget_figure(stats) if "curves" in stats else study_figure(stats)
    try:
        png = figure.to_image(format="png", width=1200, height=int(figure.layout.height or 540), scale=1)
    except Exception as error:  # kaleido's errors (no browser, a crash) come in several types
        raise BSIError(f"could not draw data/sweeps/{name}'s figure as PNG ({error}); kaleido needs Chromium: "
                       "run `make chromium`") from error
    info = PngImagePlugin.PngInfo()
    info.add_text(FIGURE_STAMP, digest)
    buffer = BytesIO()
    with Image.open(BytesIO(png)) as image:
        image.save(buffer, format="PNG", pnginfo=info)
    html = figure.to_html(include_plotlyjs="walkthroughs/plotly.min.js", full_html=True)
    html = html.replace("<head>", f"<head>\n<!-- {FIGURE_STAMP} {digest} data/sweeps/{name}/stats.json -->", 1)
    png_path, html_path = docs / f"{name}.png", docs / f"{name}.html"
    atomic_write_bytes(png_path, buffer.getvalue())
    atomic_write_text(html_path, html)
    return [png_path, html_path]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bsi.shipped", description=__doc__.splitlines()[0])
    kinds = parser.add_subparsers(dest="kind", required=True)
    for kind, what in (("run", "a finished `bsi compress` run"), ("sweep", "a finished `bsi sweep` folder")):
        sub = kinds.add_parser(kind, help=f"ship {what} into data/")
        sub.add_argument("source", help="the folder to ship")
        sub.add_argument("name", help="its name under data/runs/ or data/sweeps/")
        sub.add_argument("--command", required=True, help="the command that made it (kept in command.txt)")
    figure = kinds.add_parser("figure", help="draw a shipped sweep's figure into docs/<name>.png and .html")
    figure.add_argument("name", help="the sweep's name under data/sweeps/")
    args = parser.parse_args(argv)
    try:
        if args.kind == "figure":
            for path in draw_sweep_figure(args.name):
                print(f"wrote {path}")
            return 0
        ship = ship_run if args.kind == "run" else ship_sweep
        target = ship(args.source, args.name, args.command)
    except BSIError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    size = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
    print(f"shipped {args.source} to {target} ({size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
