"""``bsi sweep``: a comparison study of every method at every size, with seeds, protocols and intervals.

The grid is seeds x methods x targets (x protocols for the engine methods,
see :data:`bsi.config.PROTOCOLS`). Every cell goes through the same three
stages as ``bsi compress``: the task fine-tune (cached per seed), the
method, and a recovery fine-tune of the same length for every method. What
makes a cell's result comparable:

* **One run per method, every size.** A method is run once per seed (and
  protocol) with all its targets as the run's sizes (``compress.stops``):
  the engine prunes along one path and each size is the state at the end of
  the round that reaches it; a truncation method computes its bases once and
  truncates a copy per size. Each size is then recovered and evaluated on
  its own.
* **Equal recovery budgets.** Every method recovers for the same steps. With
  an ``lr_grid`` its learning rate is chosen from the grid by the loss on a
  validation set carved from the training data (never the test problems),
  at the ``lr_targets``, by the first seed that runs there (a later seed,
  in the same command or another, reuses the choice recorded in the folder);
  the choice and the validation losses are recorded in the cell's row.
* **Seeds and per-problem outcomes.** The run seed reaches the splits, the
  fine-tune, the batches, the probes and the auxiliary vectors. Every
  evaluated model's outcomes (correct or not, answer-token loss, per problem)
  are saved under ``outcomes/``; ``stats.json`` and ``results.md`` give
  paired bootstrap intervals of each method's difference from ``bsi``
  (:mod:`bsi.analysis.study`).

Outputs in ``--out DIR``, rewritten atomically after every cell:
``results.jsonl`` (one row per evaluated model; the dense reference of each
seed first), ``outcomes/*.json``, ``stats.json``, ``results.md``,
``figure.html`` (accuracy and loss against model size, with interval bands),
``sweep.json`` (the settings). An interrupted sweep continues where it
stopped: finished cells are skipped (a method's run is repeated, without
re-evaluating its finished sizes). A folder holding a sweep with other
settings is refused rather than mixed; more seeds, methods or targets may be
added to a finished one.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from bsi.analysis.answers import PROBLEMS
from bsi.analysis.study import PUBLISHED, folder_loader, study_markdown, study_stats
from bsi.config import (
    PROTOCOLS,
    BaselineConfig,
    PipelineConfig,
    RecoverConfig,
    SweepConfig,
    is_engine_method,
    resolve_config,
)
from bsi.data import is_text_run
from bsi.errors import BSIError
from bsi.files import atomic_write_json, atomic_write_text, check_output_dir, folder_lock
from bsi.models import resolve_autocast, resolve_device, resolve_dtype
from bsi.pipeline.distributed import from_environment
from bsi.pipeline.evaluate import Evaluation, Metrics
from bsi.pipeline.methods import get_method
from bsi.pipeline.runner import DenseReference, Pipeline, Report
from bsi.pipeline.stages import DENSE_RECOVERY
from bsi.reports import RoundReport, SizeReport, StageReport, TrainingTally
from bsi.results import DENSE_TRAINED, REFERENCE, DecodeSpeed, MethodRun, StudyRow, read_study_rows

OUTCOMES = "outcomes"
#: The pipeline settings of a text task only: a question/answer sweep's fingerprint leaves them out.
TEXT_SETTINGS = ("task", "text_field", "window", "held_out_fraction", "eval_windows", "eval_stride")


@dataclass(frozen=True)
class CellReport:
    """One cell of the grid finished (or was found finished: ``skipped``)."""

    index: int  # 1-based position in the grid
    total: int
    row: StudyRow
    skipped: bool = False


@dataclass(frozen=True)
class LearningRateReport:
    """A recovery learning rate was chosen: the validation loss after recovery at each rate of the grid."""

    method: str
    protocol: str
    target: float
    losses: dict  # lr -> validation answer-token loss
    chosen: float


def cell_key(protocol: str, method: str, target: float, seed: int, recovered: bool = True,
             budget: int | None = None) -> str:
    """``tuned/bsi@0.4/s0``: a cell's name (the protocol is ``published`` for truncation methods).

    A model evaluated before recovery (``also_unrecovered``) is its own cell, ``tuned/bsi@0.4/s0/no-recovery``;
    in a budget curve each budget is, ``tuned/bsi@0.4/s0/b32`` (``recovered`` is then not part of the name).
    """
    if budget is not None:
        return f"{protocol}/{method}@{target:g}/s{seed}/b{budget}"
    return f"{protocol}/{method}@{target:g}/s{seed}" + ("" if recovered else "/no-recovery")


def row_key(row: StudyRow) -> str:
    """The cell a row of ``results.jsonl`` belongs to."""
    return cell_key(row.protocol, row.method, row.target, row.seed, row.recovered, row.budget)


def problems_file(seed: int) -> str:
    """A seed's test problems (questions and the task's answers, in test order), relative to the sweep folder.

    Written with the seed's dense row; not part of any row, so a sweep's
    fingerprint and the merge's comparison of results do not see it. A sweep
    folder without this file is rebuilt from its data (:func:`bsi.analysis.answers.rebuild_problems`).
    """
    return f"{OUTCOMES}/{PROBLEMS.format(seed=seed)}"


def sweep_results(folder: str | Path) -> Path:
    """``folder``'s ``results.jsonl``; a one-line error when it has none (a folder to merge must hold results)."""
    path = Path(folder) / "results.jsonl"
    if not path.is_file():
        raise BSIError(f"'{folder}' holds no sweep results (no results.jsonl): give the --out folder of the sweep "
                       "run elsewhere")
    return path


def parse_list(text: str, kind: type, flag: str, *, may_be_empty: bool = False) -> list:
    """``"0.8,0.6"`` -> [0.8, 0.6] for a comma-separated flag, with a one-line error naming ``flag``.

    With ``may_be_empty``, ``none`` (or an empty value) gives an empty list: the setting switched off.
    """
    if may_be_empty and text.strip().lower() in ("", "none"):
        return []
    try:
        values = [kind(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise BSIError(f"{flag} must be comma-separated {kind.__name__} values, got '{text}'") from None
    if not values:
        raise BSIError(f"{flag} needs at least one value, got '{text}'")
    return values


class Sweep:
    """The study grid over one model and task.

    Args:
        config: the shared pipeline settings (per cell the sweep sets the seed,
            the method's score, the sizes and, for the engine methods, the
            protocol's settings).
        settings: methods, targets, seeds, protocols, learning-rate grid (:class:`~bsi.config.SweepConfig`).
        out_dir: where the outputs go (new, or a previous sweep to resume or extend).
        overrides: the settings the user gave explicitly (the command's flags): they win over a
            protocol's, as in ``bsi compress`` (preset, then protocol, then flags).
    """

    def __init__(self, config: PipelineConfig, settings: SweepConfig, out_dir: str | Path, *,
                 overrides: dict[str, Any] | None = None, cache_dir: str | Path | None = None) -> None:
        self.config = config
        self.overrides = overrides or {}
        self.settings = settings
        self.baseline = BaselineConfig.from_dict(settings.baseline)
        for method in settings.methods:
            get_method(method)
        self.is_text = is_text_run(config)
        if settings.lr_grid and not config.validation_size:
            raise BSIError("choosing the recovery learning rate (lr_grid) needs a validation set: give validation_size "
                           "(--validation-size N), held out of the training data")
        if self.is_text and config.eval_windows == 0:
            raise BSIError("a sweep compares evaluated models: eval_windows must not be 0 (leave it out to score "
                           "every held-out window)")
        if not self.is_text and config.eval_examples == 0 and not config.eval_loss_examples:
            raise BSIError("a sweep compares evaluated models: eval_examples (or eval_loss_examples) must be > 0")
        if config.dense_recovery:
            raise BSIError("--dense-recovery is a setting of `bsi compress` (one run's equal-budget reference); a sweep "
                           "compares methods with one another under the same recovery: leave it out")
        if settings.also_unrecovered and config.recover.steps == 0:
            raise BSIError("also_unrecovered adds rows before recovery, but recover_steps is 0: every row is already "
                           "unrecovered; drop --also-unrecovered or give --recover-steps")
        self.out_dir = check_output_dir(out_dir)
        self.cache_dir = cache_dir
        self.dist = from_environment()  # several processes compute every cell together; rank 0 writes and times
        self._load()
        self.started = time.perf_counter()

    def _load(self) -> None:
        """Read the folder's finished rows (checked against this sweep); :meth:`run` and :meth:`merge` read again.

        They read again under the folder's lock, so that rows another process
        added since this object was made are kept, not overwritten.
        """
        self.rows: list[StudyRow] = []
        self.lr_choices: dict[tuple[str, str, float], float] = {}
        self.dense: dict[int, Metrics] = {}
        found = self._read_rows()
        self._check_fingerprint(found, f"'{self.out_dir}' holds", "use a new --out folder to run this one")
        here = self.execution()
        self._check_precision(found, here["device"], here["dtype"], "this run would compute")
        for row in found:
            self._add_row(row)

    def _exclusive(self):
        """The folder's lock (:func:`bsi.files.folder_lock`), taken by the process that writes (rank 0)."""
        return folder_lock(self.out_dir, "bsi sweep") if self.dist.is_main else contextlib.nullcontext()

    # ---------------------------------------------------------------- files
    @property
    def results_path(self) -> Path:
        return self.out_dir / "results.jsonl"

    def fingerprint(self) -> str:
        """Hash of everything but the grid (methods, targets, seeds, protocols may grow): other settings, other sweep.

        Where a run executes is not part of it: ``device`` and ``dtype`` are
        hashed as their default ``auto``, so one sweep's seeds may run on
        different machines (a CPU here, a GPU there). What they resolve to is
        recorded in every row instead, and :meth:`_check_precision` refuses
        to put two precisions in one folder (``auto`` is float32 on a CPU but
        bfloat16 on a GPU).
        """
        grid = ("methods", "targets", "extra_targets", "seeds", "protocols", "protocol_targets", "speed_repeats",
                "speed_tokens", "also_unrecovered")
        settings = {k: v for k, v in self.settings.to_dict().items() if k not in grid}
        for later in ("match_training", "budgets", "budget_targets"):  # off: sweeps made before them keep their hash
            if not settings.get(later):
                settings.pop(later, None)
        settings["baseline"] = self.baseline.to_dict()  # resolved: a changed default is another sweep
        config = self.config.to_dict() | {"seed": None, "preset": None, "device": "auto", "dtype": "auto"}
        config.pop("autocast")  # where it runs, like the dtype (recorded per row); sweeps made before it keep their hash
        config.pop("dense_recovery")  # bsi compress's alone (refused here): sweeps made before it keep their hash
        if not self.is_text:  # the text settings change nothing else (and sweeps made before them keep their hash)
            for key in TEXT_SETTINGS:
                config.pop(key)
        config["compress"] = {k: v for k, v in config["compress"].items()
                              if k not in ("score", "target_ratio", "stops", "size_mode", "keep_ratio")}
        blob = json.dumps({"config": config, "settings": settings, "version": 2}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def _read_rows(self, folder: Path | None = None) -> list[StudyRow]:
        path = self.results_path if folder is None else sweep_results(folder)
        if not path.is_file():
            return []
        return read_study_rows(path)  # a bad line: fix or delete the file

    def merge(self, other: str | Path) -> list[str]:
        """Add the finished cells of ``other``, a folder of this same sweep run elsewhere; returns their names.

        This is how one study's seeds run on several machines (a seed on a
        GPU, another on a CPU): each machine runs its seeds into a copy of
        the folder, and the copies are merged back. Cells already here are
        skipped when the two rows agree and refused when they differ. Nothing
        is written unless every row and outcome file of ``other`` checks out
        (same fingerprint, same precision, outcomes readable); the outcome
        files are copied before ``results.jsonl`` is rewritten, so an
        interruption leaves the folder as it was. The summaries (statistics,
        tables, figure) are rewritten.
        """
        with self._exclusive():
            self._load()
            return self._merge(Path(other))

    def _merge(self, source: Path) -> list[str]:
        theirs = self._read_rows(source)  # a one-line error when it holds none
        self._check_fingerprint(theirs, f"'{source}' holds", "only folders of the same sweep merge")
        for row in theirs:  # one precision in the merged folder
            self._check_precision(self.rows, row.device, row.dtype, f"'{source}' holds rows computed")
        here = {row_key(r): r for r in self.rows}
        new: list[StudyRow] = []
        for row in theirs:
            key = row_key(row)
            if key in here:
                if not self._same_result(here[key], row, source):
                    raise BSIError(f"cell {key} is in both folders with different results: remove it from one of "
                                   f"'{source}' or '{self.out_dir}' first")
                continue
            new.append(row)
        outcomes = {}
        for row in new:
            try:
                text = (source / row.outcomes).read_text(encoding="utf-8")
                json.loads(text)
            except (OSError, ValueError) as err:
                raise BSIError(f"'{source}': the outcomes of cell {row_key(row)} cannot be read ({err}); "
                               "copy the folder again, outcomes/ included") from None
            outcomes[row.outcomes] = text
            if row.is_reference and (source / problems_file(row.seed)).is_file():
                outcomes[problems_file(row.seed)] = (source / problems_file(row.seed)).read_text(encoding="utf-8")
        for name, text in outcomes.items() if self.dist.is_main else ():
            atomic_write_text(self.out_dir / name, text)
        for row in new:
            self._add_row(row)
        self.write()
        return [row_key(r) for r in new]

    def _same_result(self, mine: StudyRow, theirs: StudyRow, source: Path) -> bool:
        """Whether a cell computed twice (here and in ``source``) gave the same result.

        The rows must agree on everything but their wall times
        (:meth:`~bsi.results.StudyRow.result`: how long it took is not what it
        gave; compared as JSON, so a text row's NaN accuracy equals itself),
        and the two outcome files on every problem. A cell recomputed on
        another machine of the same kind is expected to agree: the merge is
        also how that is checked.
        """
        if json.dumps(mine.result(), sort_keys=True) != json.dumps(theirs.result(), sort_keys=True):
            return False
        name = mine.outcomes  # the same in both rows, now
        if name is None:  # no outcome files: the rows are the result
            return True
        try:
            return (json.loads((self.out_dir / name).read_text(encoding="utf-8"))
                    == json.loads((source / name).read_text(encoding="utf-8")))
        except (OSError, ValueError):  # an unreadable file cannot be shown to agree
            return False

    def _add_row(self, row: StudyRow) -> None:
        """Hold a finished row: a dense reference after the others (and its metrics), a recorded lr choice."""
        if row.is_reference:
            self.rows.insert(sum(r.is_reference for r in self.rows), row)
            self.dense[row.seed] = row.metrics
        else:
            self.rows.append(row)
        if row.run is not None and (row.run.lr_choice or {}).get("chosen_here"):
            self.lr_choices.setdefault((row.protocol, row.method, row.target), row.run.recover_lr)

    def _check_fingerprint(self, rows: list[StudyRow], holder: str, advice: str) -> None:
        """Refuse ``rows`` of another sweep (``holder``: "'folder' holds"; ``advice``: what to do instead)."""
        mine = self.fingerprint()
        if any(row.fingerprint != mine for row in rows):
            raise BSIError(f"{holder} a sweep made with other settings (model, data, schedule, recovery or "
                           f"learning-rate grid); {advice}")

    def execution(self) -> dict[str, str]:
        """Where this process runs the sweep: ``{"device": "cpu" | "cuda", "dtype": "float32" | ...}`` (resolved).

        A float32 run whose training steps multiply in bf16 (``autocast``)
        records ``float32+bf16-autocast``: another precision, never mixed
        with plain float32 rows in one folder.
        """
        device = resolve_device(self.config.device)
        dtype = resolve_dtype(self.config.dtype, device)
        autocast = resolve_autocast(self.config.autocast, dtype)
        label = str(dtype).removeprefix("torch.")
        if autocast is not None:
            label += f"+{str(autocast).removeprefix('torch.').replace('bfloat16', 'bf16')}-autocast"
        return {"device": device.type, "dtype": label}

    def _check_precision(self, rows: list[StudyRow], device: str | None, dtype: str | None, what: str) -> None:
        """Refuse to put a row computed in ``dtype`` on ``device`` (a row's, or this run's :meth:`execution`, as
        ``what`` says) beside ``rows`` of another precision.

        Rows made before bsi recorded their ``dtype`` are not checked.
        """
        if not dtype:
            return
        theirs = sorted({row.dtype for row in rows if row.dtype} - {dtype})
        if theirs:
            flag = (f"--dtype {theirs[0]}" if "autocast" not in theirs[0]
                    else f"--dtype {theirs[0].split('+')[0]} --autocast on")
            raise BSIError(f"'{self.out_dir}' holds rows computed in {theirs[0]}, and {what} in {dtype} "
                           f"(on {device}): one folder holds one precision; pass {flag} to extend "
                           "it, else use a new --out folder")

    def write(self, *, summaries: bool = True) -> None:
        """Rewrite the settings and results (and with ``summaries`` the statistics, table and figure), atomically.

        Rank 0 only. The statistics take a few seconds (bootstrap intervals
        for every cell), so they follow every method's run, the rows every cell.
        """
        from bsi.analysis.figures import study_figure

        if not self.dist.is_main:
            return
        atomic_write_json(self.out_dir / "sweep.json", {"config": self.config.to_dict(),
                                                        "settings": self.settings.to_dict(),
                                                        "fingerprint": self.fingerprint()})
        atomic_write_text(self.results_path, "".join(json.dumps(r.to_dict(), sort_keys=True) + "\n" for r in self.rows))
        if not summaries:
            return
        stats = self.stats()
        atomic_write_json(self.out_dir / "stats.json", stats)
        if self.settings.budgets:
            from bsi.analysis.budget import budget_figure, budget_markdown

            note = self.schedule_note(self.settings.protocols[0])
            atomic_write_text(self.out_dir / "results.md", budget_markdown(stats, note))
            atomic_write_text(self.out_dir / "figure.html",
                              budget_figure(stats).to_html(include_plotlyjs=True, full_html=True))
            return
        descriptions = {p: f"{PROTOCOLS[p]['description']}." for p in self.settings.protocols}
        notes = {p: self.schedule_note(p) for p in self.settings.protocols}
        atomic_write_text(self.out_dir / "results.md", study_markdown(stats, descriptions, notes))
        atomic_write_text(self.out_dir / "figure.html",
                          study_figure(stats).to_html(include_plotlyjs=True, full_html=True))

    def stats(self) -> dict[str, Any]:
        """The folder's statistics: a study's (:func:`study_stats`), or a budget curve's (:func:`budget_stats`)."""
        if self.settings.budgets:
            from bsi.analysis.budget import budget_stats

            return budget_stats(self.rows, folder_loader(self.out_dir))
        return study_stats(self.rows, folder_loader(self.out_dir), self.settings.protocols)

    # ----------------------------------------------------------------- grid
    def runs(self) -> list[tuple[int, str, str]]:
        """``(seed, method, protocol)`` of every run, seeds outermost (the first one run chooses learning rates)."""
        out = []
        matched = self.settings.match_training  # its rows give the truncations their training: it runs first
        methods = sorted(self.settings.methods, key=lambda m: m != matched) if matched else self.settings.methods
        for seed in self.settings.seeds:
            for method in methods:
                protocols = self.settings.protocols if is_engine_method(method) else (PUBLISHED,)
                out += [(seed, method, p) for p in protocols]
        return out

    @property
    def variants(self) -> tuple[bool, ...]:
        """Which models of each cell are evaluated: ``(False, True)`` before and after recovery, or ``(True,)``.

        ``True`` stands for "the sweep's recovery"; when that is 0 steps the
        recovered model *is* the unrecovered one, and its rows say so.
        """
        recovers = self.config.recover.steps > 0
        return (False, True) if self.settings.also_unrecovered else (recovers,)

    def cells(self) -> list[str]:
        budgets = self.settings.budgets
        if budgets:  # a budget curve: the dense model trained for each budget, then every method's sizes
            return [*(cell_key(REFERENCE, DENSE_TRAINED, 1.0, s, budget=b) for s in self.settings.seeds
                      for b in budgets),
                    *(cell_key(p, m, t, s, budget=b) for s, m, p in self.runs()
                      for t in self.settings.evaluated_targets_of(m, p) for b in budgets)]
        return [cell_key(p, m, t, s, r and self.config.recover.steps > 0) for s, m, p in self.runs()
                for t in self.settings.targets_of(m, p) for r in self.variants]

    def done(self) -> set[str]:
        return {row_key(r) for r in self.rows}

    def config_for(self, seed: int, method: str, protocol: str, sizes: Sequence[float] | None = None) -> PipelineConfig:
        """The pipeline settings of one run (:func:`bsi.config.resolve_config` on the sweep's shared configuration).

        The seed, the sizes (default: all of the method's); for an engine
        method also the protocol's settings, this protocol's
        ``protocol_settings`` and the flags the user gave (which win over the
        protocol's, as in ``bsi compress``), then what the method fixes.
        """
        sizes = tuple(sizes or self.settings.targets_of(method, protocol))
        if not is_engine_method(method):  # a truncation method: the published one under every protocol
            return resolve_config(base=self.config, overrides={"seed": seed}, sizes=sizes)
        given = {k: v for k, v in self.overrides.items() if k not in ("seed", "protocol")}
        return resolve_config(base=self.config, overrides=given | {"seed": seed}, method=method, protocol=protocol,
                              protocol_settings=self.settings.protocol_settings.get(protocol, {}), sizes=sizes)

    def schedule_note(self, protocol: str) -> str:
        """One paragraph: what the engine methods of ``protocol`` and the shared recovery ran with."""
        config = self.config_for(self.settings.seeds[0], "bsi", protocol)
        c, r = config.compress, config.recover
        held = f"the last {config.validation_size} training windows" if self.is_text else \
            f"{config.validation_size} training problems"
        lr = (f"lr chosen from {', '.join(f'{x:g}' for x in self.settings.lr_grid)} by validation loss "
              f"({held} held out)" if self.settings.lr_grid else f"lr {r.lr:g}")
        unrecovered = " Every method's models are also evaluated before recovery." if self.settings.also_unrecovered else ""
        budgets = self.settings.budgets
        recovery = (f"a recovery up to each budget ({', '.join(map(str, budgets))} optimizer steps in all after the "
                    f"fine-tune, {r.warmup_steps} of warm-up)" if budgets else f"{r.steps} recovery steps")
        if self.is_text:
            scored = "every held-out window" if config.eval_windows is None else \
                f"the first {config.eval_windows} held-out windows"
            evaluation = f"perplexity on {scored} of {config.window} tokens of {config.data} per seed"
        else:
            evaluation = (f"{config.eval_examples} test problems answered and {config.scored_examples} scored for the "
                          "loss per seed")
        return (f"Engine methods: {c.bases} bases, {c.rounds} rounds of {c.round_length} iterations "
                f"({c.profiling_iters} profiling) passing every size, {c.curvature} curvature, {c.selection_rule} "
                f"selection, cut cap {c.max_cut_factor:g}, {c.aux_rank} auxiliary vectors. Every method: "
                f"{recovery} training {r.train}, {lr}{self._matching_note()}.{unrecovered} Seeds "
                f"{', '.join(map(str, self.seeds_held()))}; {evaluation}.{self.execution_note()}")

    def _matching_note(self) -> str:
        """With ``match_training``: what the truncations' recovery adds ('' without it)."""
        matched = self.settings.match_training
        if not matched:
            return ""
        return (f"; every truncation also recovers for {matched}'s own tuning steps up to its size, so that both "
                "saw the same optimizer steps after the fine-tune (each row's training is in the training table)")

    def seeds_held(self) -> list[int]:
        """The seeds the folder's rows hold (merged ones included), else the settings' seeds (nothing run yet)."""
        return sorted({int(row.seed) for row in self.rows}) or list(self.settings.seeds)

    def execution_note(self) -> str:
        """Where the rows were computed, e.g. `` Computed in float32: seeds 0, 1 on cpu, seed 2 on cuda.`` ('' if unrecorded)."""
        seeds: dict[str, set[int]] = {}
        for row in self.rows:
            if row.device:
                seeds.setdefault(row.device, set()).add(row.seed)
        if not seeds:
            return ""
        dtypes = sorted({row.dtype for row in self.rows if row.dtype})
        where = ", ".join(f"seed{'s' if len(s) > 1 else ''} {', '.join(map(str, sorted(s)))} on {device}"
                          for device, s in sorted(seeds.items(), key=lambda item: min(item[1])))
        return f" Computed in {' and '.join(dtypes)}: {where}."

    # ------------------------------------------------------------------ run
    def run(self) -> Iterator[Report | CellReport | LearningRateReport]:
        """Run what is missing; yields every pipeline report, a LearningRateReport per choice, a CellReport per cell.

        The folder is held for this run (another sweep on it is refused until
        the run ends or its generator is closed) and read again first.
        """
        with self._exclusive():
            self._load()
            yield from self._run_missing()
            if self.dist.is_main and not (self.out_dir / "results.md").is_file():
                self.write()  # every cell was done but a run stopped before its summaries: write them now

    def _run_missing(self) -> Iterator[Report | CellReport | LearningRateReport]:
        cells = self.cells()
        position = {key: i for i, key in enumerate(cells, start=1)}
        for seed in self.settings.seeds:
            if seed not in self.dense:
                yield from self._reference(seed)
        budgets = self.settings.budgets
        for seed in self.settings.seeds if budgets else ():
            names = {b: cell_key(REFERENCE, DENSE_TRAINED, 1.0, seed, budget=b) for b in budgets}
            done = self.done()
            for b in budgets:
                if names[b] in done:
                    row = next(r for r in self.rows if row_key(r) == names[b])
                    yield CellReport(position[names[b]], len(cells), row, skipped=True)
            missing_budgets = [b for b in budgets if names[b] not in done]
            if missing_budgets:
                yield from self._dense_trained(seed, missing_budgets, lambda b, names=names: position[names[b]],
                                               len(cells))
                self.write()
        recovers = self.config.recover.steps > 0
        for seed, method, protocol in self.runs():
            targets = self.settings.evaluated_targets_of(method, protocol)
            keys = {(t, v): cell_key(protocol, method, t, seed, budget=v) for t in targets for v in budgets} \
                if budgets else {(t, v): cell_key(protocol, method, t, seed, v and recovers)
                                 for t in targets for v in self.variants}
            done = self.done()
            missing = {key for key in keys if keys[key] not in done}
            for key, name in keys.items():
                if key not in missing:
                    row = next(r for r in self.rows if row_key(r) == name)
                    yield CellReport(position[name], len(cells), row, skipped=True)
            # bases sharded across processes cannot be copied mid-path: one run per size then
            sharded = self.config.fsdp and self.dist.enabled
            groups = [{k for k in missing if k[0] == t} for t in sorted({t for t, _ in missing}, reverse=True)] \
                if sharded else ([missing] if missing else [])
            for group in groups:
                yield from self._run(seed, method, protocol, group, lambda key, keys=keys: position[keys[key]], len(cells),
                                     own_run=sharded)
                self.write()
        self.dist.barrier()  # the files are complete when any process returns

    def _reference(self, seed: int) -> Iterator[Report]:
        """Fine-tune (cached) and evaluate the dense model of one seed: its reference row and outcomes."""
        pipeline = Pipeline(PipelineConfig.from_dict(self.config.to_dict() | {"seed": seed}), cache_dir=self.cache_dir)
        dense = yield from pipeline.reference_stage()
        evaluation = dense.evaluation
        assert evaluation is not None, "a sweep evaluates its dense model"
        row = StudyRow(method=REFERENCE, protocol=REFERENCE, target=1.0, seed=seed, fingerprint=self.fingerprint(),
                       params_total=dense.params, params_before=dense.params,
                       compression_ratio=1.0, compressible_ratio=1.0, metrics=evaluation.metrics,
                       outcomes=self._save_outcomes(REFERENCE, REFERENCE, 1.0, seed, evaluation), eval_seconds=0.0,
                       # a text task: what every row's perplexity was measured on, and how
                       perplexity_protocol=dense.perplexity_protocol, **self.execution())
        if dense.test_problems and self.dist.is_main:  # what the answers answer (bsi answers, the Answers view)
            atomic_write_json(self.out_dir / problems_file(seed), {"question": [e.question for e in dense.test_problems],
                                                                   "answer": [e.answer for e in dense.test_problems]})
        self._add_row(self.dist.from_main(row))
        self.write()

    def _run(self, seed: int, method: str, protocol: str, missing: set[tuple[float, bool]], index, total: int, *,
             own_run: bool = False) -> Iterator[Report | CellReport | LearningRateReport]:
        """One method's run: compress through every size, then evaluate each missing model of each size.

        ``missing`` holds ``(target, recovered)`` pairs: the model before
        recovery (``recovered`` False, with ``also_unrecovered``) is evaluated
        on a copy, exported exactly as recovery would export it, then the
        size is recovered and evaluated. ``own_run``: the run compresses to
        the missing sizes only (one run per size when the bases are sharded).
        """
        targets = sorted({t for t, _ in missing}, reverse=True)
        config = self.config_for(seed, method, protocol, targets if own_run else None)
        pipeline = Pipeline(config, cache_dir=self.cache_dir, method=method, baseline=self.baseline,
                            reference=self.dense[seed])
        dense = yield from pipeline.reference_stage()
        label = f"{method} ({protocol})" if is_engine_method(method) else method
        yield StageReport("compress", "start", label)
        start = time.perf_counter()
        snapshots: dict[float, nn.Module] = {}
        tuning = TrainingTally(stages=("train",))  # the engine's tuning between rounds (a truncation trains nothing)
        path: dict[float, tuple[int, int]] = {}  # per size: (optimizer steps, tokens) of the method's run up to it
        tested: list[float] = []  # per round with a gradient test: the share of the pool that passed it
        passed: dict[float, float | None] = {}  # per size: the mean share over the rounds up to it
        for report in pipeline.compress():
            yield report
            tuning.count(report)
            if isinstance(report, RoundReport) and math.isfinite(report.significant_gradients):
                tested.append(report.significant_gradients)
            if isinstance(report, SizeReport) and report.target in targets:
                last = report.target == config.compress.size.ratio  # the run ends here: no copy needed
                snapshots[report.target] = pipeline.model if last else copy.deepcopy(pipeline.model)
                path[report.target] = (tuning.steps, tuning.tokens)
                passed[report.target] = sum(tested) / len(tested) if tested else None
                if self.settings.budget_targets and len(snapshots) == len(targets):
                    break  # a budget curve's sizes are all taken: the rest of the path is not evaluated
        compress_seconds = time.perf_counter() - start
        yield StageReport("compress", "end")
        # the first seed to reach a learning-rate target chooses there; any later seed reuses the recorded choice
        choose_here = [t for t in targets if self.settings.lr_grid and self.settings.lr_target_for(t) == t
                       and (t, True) in missing and (protocol, method, t) not in self.lr_choices]
        for target in [*choose_here, *(t for t in targets if t not in choose_here)]:
            model = snapshots.pop(target)
            if self.settings.budgets:  # ``missing`` holds (target, budget) pairs
                yield from self._budget_cells(pipeline, dense, model, method, protocol, target, seed, compress_seconds,
                                              path[target], passed[target],
                                              [b for b in self.settings.budgets if (target, b) in missing], index, total)
                continue
            if (target, False) in missing:
                row = yield from self._unrecovered(pipeline, dense, model, method, protocol, target, seed,
                                                   compress_seconds, path[target], passed[target])
                yield CellReport(index((target, False)), total, row)
            if (target, True) not in missing:
                continue
            start = time.perf_counter()
            recover = self._recovery_for(method, target, seed)
            model, choice, recovery = yield from self._recover(pipeline, model, method, protocol, target, recover,
                                                               choose=target in choose_here)
            recover_seconds = time.perf_counter() - start
            start = time.perf_counter()
            evaluation = yield from pipeline.evaluate(model, "recovered")
            made = self._method_run(recover.steps, choice, compress_seconds, recover_seconds, path[target], recovery,
                                    passed[target], pipeline.notes)
            row = self._row(dense, evaluation, model, method, protocol, target, seed, made,
                            time.perf_counter() - start)
            speed = yield from self._speed(pipeline, model)
            row = self.dist.from_main(dataclasses.replace(row, speed=speed))  # rank 0's timings everywhere
            self.rows.append(row)
            self.write(summaries=False)
            yield CellReport(index((target, True)), total, row)

    def _unrecovered(self, pipeline: Pipeline, dense: DenseReference, model: nn.Module, method: str, protocol: str,
                     target: float, seed: int, compress_seconds: float, path: tuple[int, int],
                     gradient_passed: float | None):
        """Evaluate a copy of ``model`` with no recovery (exported as recovery exports it); returns its row."""
        copied = copy.deepcopy(model)
        yield from pipeline.recover(copied, dataclasses.replace(pipeline.config.recover, steps=0))
        start = time.perf_counter()
        evaluation = yield from pipeline.evaluate(copied, "unrecovered")
        made = MethodRun(recover_steps=0, compress_seconds=compress_seconds, notes=tuple(pipeline.notes),
                         path_steps=path[0], path_tokens=path[1], recover_tokens=0, gradient_passed=gradient_passed)
        row = self._row(dense, evaluation, copied, method, protocol, target, seed, made, time.perf_counter() - start)
        row = self.dist.from_main(row)
        self.rows.append(row)
        self.write(summaries=False)
        return row

    def _budget_recovery(self, budget: int, trained: int, label: str) -> RecoverConfig:
        """The recovery that brings a model with ``trained`` optimizer steps after the fine-tune to ``budget`` steps.

        The recover section's settings (learning rate, warm-up, what trains)
        with ``budget - trained`` steps; a budget below what the model's
        method already trained on its way (``label`` names it) is refused.
        """
        if trained > budget:
            raise BSIError(f"budget {budget} is below {label}'s own {trained} training steps up to that size: give "
                           f"--budgets of at least {trained}, or --budget-targets without that size")
        return dataclasses.replace(self.config.recover, steps=budget - trained)

    def _budget_cells(self, pipeline: Pipeline, dense: DenseReference, model: nn.Module, method: str, protocol: str,
                      target: float, seed: int, compress_seconds: float, path: tuple[int, int],
                      gradient_passed: float | None, budgets: Sequence[int], index, total: int):
        """A budget curve at one size: a copy of ``model`` (the method's model at ``target``) per budget.

        Each copy recovers for the budget less the method's own tuning steps
        up to this size (``path``; 0 for a truncation), so every row's
        ``path_steps + recover_steps`` equals its budget; a budget equal to
        the path is the model as its method left it (exported as recovery
        exports it).
        """
        label = f"{method} at {target:g}"
        recoveries = {b: self._budget_recovery(b, path[0], label) for b in budgets}  # refused before any training
        for k, budget in enumerate(budgets):
            candidate = model if k == len(budgets) - 1 else copy.deepcopy(model)
            recover, tally = recoveries[budget], TrainingTally(stages=("recover",))
            start = time.perf_counter()
            yield from tally.through(pipeline.recover(candidate, recover))
            recover_seconds = time.perf_counter() - start
            start = time.perf_counter()
            evaluation = yield from pipeline.evaluate(candidate, "recovered")
            made = self._method_run(recover.steps, (recover.lr, None), compress_seconds, recover_seconds, path, tally,
                                    gradient_passed, pipeline.notes)
            row = self._row(dense, evaluation, candidate, method, protocol, target, seed, made,
                            time.perf_counter() - start, budget=budget)
            row = self.dist.from_main(row)
            self.rows.append(row)
            self.write(summaries=False)
            yield CellReport(index((target, budget)), total, row)

    def _dense_trained(self, seed: int, budgets: Sequence[int], index, total: int):
        """A budget curve's dense rows: the fine-tuned dense model of ``seed`` trained for each budget, uncompressed.

        The recovery's settings and batches, everything but the embeddings
        (as ``bsi compress --dense-recovery``): what the same training buys
        without compression.
        """
        config = PipelineConfig.from_dict(self.config.to_dict() | {"seed": seed})
        pipeline = Pipeline(config, cache_dir=self.cache_dir, reference=self.dense[seed])
        dense = yield from pipeline.reference_stage()
        recoveries = {b: self._budget_recovery(b, 0, REFERENCE) for b in budgets}
        for budget in budgets:
            model, tally = copy.deepcopy(pipeline.model), TrainingTally(stages=(DENSE_RECOVERY,))
            start = time.perf_counter()
            yield from tally.through(pipeline.recover(model, recoveries[budget], stage=DENSE_RECOVERY))
            recover_seconds = time.perf_counter() - start
            start = time.perf_counter()
            evaluation = yield from pipeline.evaluate(model, "recovered")
            made = self._method_run(budget, (recoveries[budget].lr, None), 0.0, recover_seconds, (0, 0), tally, None,
                                    ())
            row = self._row(dense, evaluation, model, DENSE_TRAINED, REFERENCE, 1.0, seed, made,
                            time.perf_counter() - start, budget=budget)
            row = self.dist.from_main(row)
            self.rows.append(row)
            self.write(summaries=False)
            yield CellReport(index(budget), total, row)

    def _recovery_for(self, method: str, target: float, seed: int) -> RecoverConfig:
        """The recovery of one size: the common one; with ``match_training``, a truncation's grows to equal training.

        A truncation method trains nothing on its way to a size, an engine
        method tunes its coefficients between rounds. With ``match_training``
        naming an engine method, a truncation recovers for that method's own
        steps up to the same size (its row of the same seed, recovered, first
        protocol) plus the common recovery, so both saw the same number of
        optimizer steps after the task fine-tune.
        """
        recover = self.config.recover
        matched = self.settings.match_training
        if not matched or is_engine_method(method) or recover.steps == 0:
            return recover
        protocol = self.settings.protocols[0]
        row = next((r for r in self.rows if (r.method, r.protocol, r.seed) == (matched, protocol, seed)
                    and math.isclose(r.target, target) and r.recovered and r.run is not None), None)
        if row is None or row.run is None or row.run.path_steps is None:
            raise BSIError(f"match_training: {method} at {target:g} needs {matched}'s own training up to that size "
                           f"(seed {seed}, protocol {protocol}), and this folder has no such row that records it: add "
                           f"{target:g} to {matched}'s targets, or leave --match-training out")
        return dataclasses.replace(recover, steps=recover.steps + row.run.path_steps)

    def _recover(self, pipeline: Pipeline, model: nn.Module, method: str, protocol: str, target: float,
                 recover: RecoverConfig, *, choose: bool):
        """Recover ``model``; returns ``(recovered model, (lr, choice), its training tally)``.

        ``choice`` records a grid search. Without a grid, or with a learning
        rate chosen before, ``model`` itself is recovered; a grid search
        recovers a copy for each rate and keeps the copy with the lowest
        validation loss (and that copy's tally). ``recover``: the recovery's
        settings (:meth:`_recovery_for`).
        """
        grid = self.settings.lr_grid
        tally = TrainingTally(stages=("recover",))
        if not grid:
            yield from tally.through(pipeline.recover(model, recover))
            return model, (recover.lr, None), tally
        if not choose:
            lr = self.lr_choices.get((protocol, method, self.settings.lr_target_for(target)))
            if lr is None:
                chosen_at = self.settings.lr_target_for(target)
                raise BSIError(f"no learning rate was chosen for {method} near target {target:g} yet: it is chosen at "
                               f"target {chosen_at:g}; add {chosen_at:g} to this run's targets")
            yield from tally.through(pipeline.recover(model, dataclasses.replace(recover, lr=lr)))
            return model, (lr, {"chosen_at": self.settings.lr_target_for(target), "chosen_here": False}), tally
        losses, best = {}, None
        for lr in grid:
            candidate, tally = copy.deepcopy(model), TrainingTally(stages=("recover",))
            yield from tally.through(pipeline.recover(candidate, dataclasses.replace(recover, lr=lr)))
            loss, validation_size = pipeline.validation_loss(candidate)
            losses[lr] = loss
            if best is None or (math.isfinite(loss) and not loss >= best[0]):
                best = (loss, lr, candidate, tally)
        self.lr_choices[(protocol, method, target)] = best[1]
        yield LearningRateReport(method, protocol, target, losses, best[1])
        return best[2], (best[1], {"chosen_at": target, "chosen_here": True,
                                   "validation_loss": {f"{k:g}": v for k, v in losses.items()},
                                   "validation_examples": validation_size}), best[3]

    def _save_outcomes(self, protocol: str, method: str, target: float, seed: int, evaluation: Evaluation,
                       recovered: bool = True, budget: int | None = None) -> str:
        """Write one model's per-problem outcomes (rank 0); returns the file's path relative to the sweep folder."""
        variant = f"-b{budget}" if budget is not None else "" if recovered else "-no-recovery"
        name = f"{OUTCOMES}/{protocol}-{method}-{target:g}-s{seed}{variant}.json"
        if self.dist.is_main:
            (self.out_dir / OUTCOMES).mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.out_dir / name, evaluation.columns())
        return name

    @staticmethod
    def _method_run(steps: int, choice: tuple[float | None, dict | None], compress_seconds: float,
                    recover_seconds: float, path: tuple[int, int], recovery: TrainingTally,
                    gradient_passed: float | None, notes: Sequence[str]) -> MethodRun:
        """How a recovered model was made: the training up to its size, the recovery's steps, rate and tokens."""
        lr, lr_choice = choice
        return MethodRun(recover_steps=steps, recover_lr=lr if steps else None, lr_choice=lr_choice,
                         compress_seconds=compress_seconds, recover_seconds=recover_seconds,
                         notes=tuple(notes), path_steps=path[0], path_tokens=path[1],
                         recover_tokens=recovery.tokens, gradient_passed=gradient_passed)

    def _row(self, dense: DenseReference, evaluation: Evaluation | None, model: nn.Module, method: str, protocol: str,
             target: float, seed: int, made: MethodRun, eval_seconds: float, *, budget: int | None = None) -> StudyRow:
        """The row of ``model``, measured as ``evaluation`` (before recovery when ``made`` has no recovery steps).

        ``budget``: in a budget curve, the model's total training after the fine-tune.
        """
        from bsi.method.surgery import compressible_parameters, model_parameters

        assert evaluation is not None, "a sweep evaluates every model"
        recovered = made.recover_steps > 0
        params = model_parameters(model)
        now, compressible = compressible_parameters(model)
        return StudyRow(method=method, protocol=protocol, target=target, seed=seed, fingerprint=self.fingerprint(),
                        params_total=params, params_before=dense.params,
                        compression_ratio=dense.params / params, compressible_ratio=now / compressible,
                        metrics=evaluation.metrics, run=made, eval_seconds=eval_seconds,
                        outcomes=self._save_outcomes(protocol, method, target, seed, evaluation, recovered=recovered,
                                                     budget=budget),
                        budget=budget, **self.execution())

    def _speed(self, pipeline: Pipeline, model: nn.Module):
        """Decode speed of the recovered model against the dense one, measured side by side (None: not asked)."""
        if not self.settings.speed_repeats or not self.dist.is_main:  # one process times; others would disturb it
            return None
        from bsi.analysis.speed import measure_speeds
        from bsi.models import load_model_and_tokenizer

        yield StageReport("speed", "start")
        dense, tokenizer = load_model_and_tokenizer(self.config.model, dtype=pipeline.dtype, device=pipeline.device,
                                                    cache_dir=self.cache_dir)
        speeds = measure_speeds({REFERENCE: dense, "model": model}, tokenizer,
                                new_tokens=self.settings.speed_tokens, repeats=self.settings.speed_repeats)
        yield StageReport("speed", "end")
        return DecodeSpeed(ms_per_token=speeds["model"].ms_per_token, dense_ms_per_token=speeds[REFERENCE].ms_per_token)
