"""A finished run read back from its folder, so the dashboard can open on it before anything runs.

bsi ships a finished run of the embedded model in ``data/`` (its rounds,
per-layer scores, ranks and outcomes, without the weights; layout in
``data/README.md``) and the study's sweep. :func:`read_saved_run` reads such
a folder (or any ``bsi compress --out`` folder) into a :class:`SavedRun`:
the summary, the rounds as :class:`~bsi.reports.RoundReport` objects when
the folder holds their per-layer records (``rounds-layers.jsonl.gz``; else
their scalars only, ``rounds.jsonl``), and the loss of every step
(``steps.jsonl``) when it holds them: what
:meth:`bsi.pipeline.runner.Pipeline.save` writes. :meth:`SavedRun.fill` puts it into a
visitor's :class:`~bsi.app.state.Session`, so the Compress tab's plots, the
Inspect tab and the Answers tab show it as they would show a run just made.

Reports are frozen and their tensors are never written to, so every
visitor's session shares one :class:`SavedRun` (read once per server).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bsi.errors import BSIError
from bsi.results import RunSummary

OPENING_RUN = "tour"
"""The shipped run the Compress, Inspect and Spectra tabs open on when it holds its per-layer records
(``data/runs/tour``: what Start on the ``tour`` preset makes again); else :data:`bsi.shipped.FIRST_RUN`."""
SPECTRUM = "spectrum"
"""A saved run's sub-folder holding ``bsi spectrum --out`` output (the Spectra tab's opening view)."""
ROUND_RECORDS = "rounds-layers.jsonl.gz"
"""A run's per-layer round records (``RoundReport.to_dict()``, one round a line; :meth:`bsi.pipeline.runner.Pipeline.save`)."""
STEPS = "steps.jsonl"
"""A run's step losses (``{"stage", "step", "loss"}`` a line; :meth:`bsi.pipeline.runner.Pipeline.save`)."""
INT_VECTORS = ("basis_ids", "pool", "pruned")


def _lines(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def round_from_dict(data: dict) -> Any:
    """A :class:`~bsi.reports.RoundReport` from its ``to_dict()`` (tensors rebuilt: indices int64, values float32)."""
    import torch

    from bsi.reports import LayerRound, RoundReport

    def tensor(name: str, values: Any) -> Any:
        if values is None:
            return None
        return torch.tensor(values, dtype=torch.int64 if name in INT_VECTORS else torch.float32)

    layers = []
    for layer in data["layers"]:
        values = {k: v for k, v in layer.items() if k != "kind"}
        for name in ("basis_ids", "sigma", "grad", "hessian", "importance", "pool", "pruned"):
            values[name] = tensor(name, values.get(name))
        values["terms"] = {k: tensor(k, v) for k, v in (layer.get("terms") or {}).items()}
        layers.append(LayerRound(**values))
    scalars = {k: v for k, v in data.items() if k not in ("kind", "layers")}
    return RoundReport(layers=tuple(layers), **scalars)


@dataclass
class SavedRun:
    """A finished run as the dashboard shows it."""

    folder: Path
    summary: dict
    compact: list[dict]  # rounds.jsonl: each round's scalars and per-layer ranks
    rounds: list = field(default_factory=list)  # RoundReports with per-layer records ([] when the folder has none)
    steps: list = field(default_factory=list)  # (stage, step, loss) of every step ([] when the folder has none)

    @property
    def scalar_rounds(self) -> list:
        """The rounds as objects with the scalars the parameter plot reads (from the full records, else rounds.jsonl)."""
        return self.rounds or [SimpleNamespace(**r) for r in self.compact]

    @property
    def result(self) -> RunSummary:
        """The summary, typed."""
        return RunSummary.from_dict(self.summary)

    def headline(self) -> str:
        """One line: what this run is, its size and accuracy before and after."""
        r = self.result
        before, after = r.metrics_before, r.metrics_after
        accuracy = (f", accuracy {before.accuracy:.0%} → {after.accuracy:.0%} on {after.examples} "
                    "test problems") if before and after else ""
        return (f"`{r.model or '?'}`, preset `{r.config.get('preset', '?')}`: {r.compression_ratio:.2f}x "
                f"smaller ({r.params_before:,} → {r.params_after:,} parameters){accuracy}")

    def fill(self, session: Any) -> None:
        """Show this run in ``session`` (only when the visitor has no run of their own yet)."""
        if session.summary is not None or session.running or session.rounds:
            return
        session.rounds = list(self.rounds)
        session.steps = list(self.steps)
        session.summary = self.summary
        session.params_before = self.result.params_before
        session.compressible_before = self.result.compressible_params_before
        session.log = [f"[saved] {self.headline()} (from {shown_path(self.folder)})"]


def shown_path(folder: str | Path) -> str:
    """``folder`` as the page writes it: relative to the repository when inside it (``data/runs/tour``)."""
    from bsi.shipped import DATA

    path = Path(folder).resolve()
    root = DATA.parent.resolve()
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(folder)


def opening_view(saved: SavedRun | None, error: str | None = None) -> Any:
    """The Compress tab's view before any click: the saved run's plots and a status line saying what they are.

    With no saved run (none asked for, or it could not be read: ``error``),
    the empty plots and the usual "press Start".
    """
    from bsi.analysis import figures
    from bsi.app.job import JobView, snapshot
    from bsi.app.state import Session

    if saved is None:
        status = "Ready: press **Start**." + (f" (The saved run could not be shown: {error})" if error else "")
        return JobView(status, figures.loss_figure([]), figures.params_figure([]), figures.rank_heatmap([]), "", [], [])
    session = Session()
    saved.fill(session)
    status = (f"Showing a finished run: {saved.headline()} (`{shown_path(saved.folder)}`). Inspect, Spectra and "
              "Answers show it too; press **Start** to run your own.")
    view = snapshot(session, status)
    if not saved.rounds:  # scalars only: the parameters per round still draw
        view.params = figures.params_figure(saved.scalar_rounds, session.params_before, session.compressible_before)
        view.ranks = figures.empty_figure("Ranks", "this saved run keeps no per-layer records (its final ranks are "
                                                   "in summary.json)")
    return view


def has_details(folder: str | Path | None) -> bool:
    """Whether the run in ``folder`` keeps its per-layer round records (what the Inspect tab needs)."""
    return folder is not None and (Path(folder) / ROUND_RECORDS).is_file()


def opening_folders() -> tuple[str, str, str]:
    """The shipped folders a first visit shows: (run for Compress, Inspect, Spectra; run for Answers; sweep).

    From :mod:`bsi.shipped` (``data/``; empty strings where this checkout has
    none, e.g. an installed bsi): the Answers view opens on
    :data:`~bsi.shipped.FIRST_RUN` (else on the plots' run), the plots on
    :data:`OPENING_RUN` when it keeps per-layer records, else on the same
    run; the sweep is :data:`~bsi.shipped.FIRST_SWEEP`, else the first
    shipped sweep by name.
    """
    from bsi.shipped import shipped_run, shipped_sweep, shipped_sweep_names

    first = shipped_run()
    plots_run = shipped_run(OPENING_RUN) if has_details(shipped_run(OPENING_RUN)) else first
    answers_run = first or plots_run
    names = shipped_sweep_names()  # FIRST_SWEEP first when it ships
    sweep = shipped_sweep(names[0]) if names else None
    return str(plots_run or ""), str(answers_run or ""), str(sweep or "")


def shipped_spectrum(run_dir: str | None) -> Any:
    """The spectra saved with the run in ``run_dir`` (its ``spectrum/`` folder), or None when it has none."""
    from bsi.app.spectra import load_spectrum

    folder = Path(run_dir) / SPECTRUM if run_dir else None
    if folder is None or not (folder / "spectrum.json").is_file():
        return None
    try:
        result = load_spectrum(folder)
    except BSIError:
        return None
    result.meta["model"] = f"the fine-tuned model of the run in {Path(run_dir).name}"  # not the path it was measured at
    return result


def read_saved_run(folder: str | Path) -> SavedRun:
    """Read the finished run in ``folder`` (``summary.json`` and ``rounds.jsonl``; per-layer records and steps if there).

    Raises:
        BSIError: the folder holds no finished run, or a file in it is damaged.
    """
    root = Path(folder).expanduser()
    summary_path = root / "summary.json"
    if not summary_path.is_file():
        raise BSIError(f"'{folder}' holds no finished run (no summary.json): give a `bsi compress --out` folder")
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
        compact = _lines(root / "rounds.jsonl") if (root / "rounds.jsonl").is_file() else []
        records, step_file = root / ROUND_RECORDS, root / STEPS
        rounds = [round_from_dict(r) for r in _lines(records)] if records.is_file() else []
        steps = [(s["stage"], i, float(s["loss"])) for i, s in enumerate(_lines(step_file), start=1)] \
            if step_file.is_file() else []
        RunSummary.from_dict(summary)  # every view reads it typed: a summary without sizes is refused here
    except (OSError, ValueError, KeyError, TypeError, BSIError) as err:
        raise BSIError(f"the run in '{folder}' cannot be read ({err}); copy it again") from None
    return SavedRun(root, summary, compact, rounds, steps)


__all__ = ["SavedRun", "read_saved_run", "opening_view", "round_from_dict", "opening_folders",
           "has_details", "shipped_spectrum"]
