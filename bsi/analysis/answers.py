"""What the models answered, problem by problem: a run's dense and compressed answers, a sweep's every method.

Accuracy says how many test problems a compressed model still answers;
reading the answers says which ones, and how it fails on the others. Every
run keeps both models' answers on its test problems (``outcomes.jsonl``,
:func:`bsi.pipeline.runner.outcome_lines`) and every sweep keeps every
evaluated model's answers (``outcomes/<protocol>-<method>-<target>-s<seed>.json``,
aligned columns in test-set order). This module reads them back as typed
rows, with no model and no torch:

* :func:`read_run_answers`: a run's problems, each with its question, the
  task's reference answer, the dense model's answer and the compressed
  model's, each marked right or wrong, and the problem's *category*:
  ``lost`` (the dense model was right, the compressed one is wrong),
  ``gained`` (the reverse), ``both-right``, ``both-wrong``;
  :meth:`RunAnswers.counts` and :meth:`RunAnswers.only` count and filter them.
  The dense model is the run's fine-tuned one, or, when the run trained it
  with the same recovery steps (``--dense-recovery``), that one if asked.
* :func:`read_sweep_answers`: a sweep's rows with their answers;
  :meth:`SweepAnswers.problem` gives one test problem's answers by every
  method at every size, and :meth:`SweepAnswers.beats` lists the problems
  one method answers right at a size where every other named method is
  wrong.

The ``bsi answers`` command and the dashboard's Answers views both show
these. A folder that cannot answer (no outcomes, a text task where nothing
is answered) is a one-line :class:`~bsi.errors.BSIError` saying what to give.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bsi.errors import BSIError
from bsi.files import json_object
from bsi.results import REFERENCE as SWEEP_REFERENCE
from bsi.results import StudyRow, read_study_rows

#: The categories of a problem answered by both models, in the order they are shown.
CATEGORIES = ("lost", "gained", "both-right", "both-wrong")
#: What each category means (shown beside its count).
CATEGORY_MEANINGS = {
    "lost": "the dense model answers right, the compressed one wrong",
    "gained": "the compressed model answers right, the dense one wrong",
    "both-right": "both answer right",
    "both-wrong": "both answer wrong",
}
#: The dense references a run can hold (``outcomes.jsonl``'s ``model``), and how a table names them.
REFERENCES = {
    "finetuned": "the run's fine-tuned dense model",
    "dense_recovered": "the run's fine-tuned dense model trained with the same recovery steps (--dense-recovery)",
}
COMPRESSED = "recovered"  # the compressed model's name in outcomes.jsonl
PROBLEMS = "problems-s{seed}.json"  # a sweep's test problems of one seed, beside the outcome files


def category(dense_correct: bool | None, correct: bool | None) -> str | None:
    """``lost`` / ``gained`` / ``both-right`` / ``both-wrong`` from two marks; None when either was not answered."""
    if dense_correct is None or correct is None:
        return None
    if dense_correct and correct:
        return "both-right"
    if dense_correct:
        return "lost"
    return "gained" if correct else "both-wrong"


@dataclass(frozen=True)
class AnswerRow:
    """One test problem of a run: the question, the task's answer, and both models' answers, marked.

    ``reference_answer`` is the task's worked answer (its last line
    ``#### <number>``); None for runs made before runs stored it.
    ``dense_answer`` / ``answer`` are the dense and the compressed model's
    generated answers, ``dense_correct`` / ``correct`` their marks.
    """

    index: int
    question: str | None
    reference_answer: str | None
    dense_answer: str | None
    dense_correct: bool | None
    answer: str | None
    correct: bool | None

    @property
    def category(self) -> str | None:
        return category(self.dense_correct, self.correct)


@dataclass(frozen=True)
class RunAnswers:
    """A run's answered test problems, dense against compressed (``rows`` in test-set order)."""

    folder: Path
    reference: str  # a key of REFERENCES: which dense model the rows compare with
    rows: tuple[AnswerRow, ...]

    @property
    def reference_label(self) -> str:
        """Which dense model this compares with, in words (every table says it)."""
        return REFERENCES[self.reference]

    def counts(self) -> dict[str, int]:
        """How many problems fall in each category (every category present, 0 included)."""
        out = dict.fromkeys(CATEGORIES, 0)
        for row in self.rows:
            if row.category is not None:
                out[row.category] += 1
        return out

    def only(self, which: str | None) -> tuple[AnswerRow, ...]:
        """The rows of one category (``None``: all of them)."""
        if which is None:
            return self.rows
        check_category(which)
        return tuple(row for row in self.rows if row.category == which)

    def accuracy(self) -> tuple[float, float]:
        """The dense and the compressed model's accuracy over these rows."""
        n = len(self.rows) or 1
        return sum(bool(r.dense_correct) for r in self.rows) / n, sum(bool(r.correct) for r in self.rows) / n


def check_category(which: str) -> str:
    """``which`` if it names a category, else a one-line error listing them."""
    if which not in CATEGORIES:
        raise BSIError(f"unknown category '{which}': use one of {', '.join(CATEGORIES)}")
    return which


def _read_jsonl(path: Path) -> list[dict]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json_object(line, number, path) for number, line in enumerate(lines, start=1) if line.strip()]


def read_run_answers(folder: str | Path, reference: str = "finetuned") -> RunAnswers:
    """The answered test problems of the run in ``folder`` (a ``bsi compress --out`` folder).

    Args:
        reference: ``finetuned`` (the fine-tuned dense model) or
            ``dense_recovered`` (the same trained with the recovery's steps,
            in runs made with ``--dense-recovery``).

    Raises:
        BSIError: the folder is not a run, holds no ``outcomes.jsonl``, is a
            text task (nothing answered), or lacks the asked reference.
    """
    root = Path(folder).expanduser()
    if reference not in REFERENCES:
        raise BSIError(f"unknown reference '{reference}': use one of {', '.join(REFERENCES)}")
    if not root.is_dir():
        raise BSIError(f"'{folder}' is not a folder: give the --out folder of a `bsi compress` run")
    path = root / "outcomes.jsonl"
    if not path.is_file():
        what = "a sweep: use --problem N or --beats" if (root / "results.jsonl").is_file() else \
            "give the --out folder of a finished `bsi compress` run"
        raise BSIError(f"'{folder}' holds no outcomes.jsonl (the answers of a run): {what}")
    by_model: dict[str, dict[int, dict]] = {}
    for line in _read_jsonl(path):
        if not {"model", "index"} <= set(line):
            raise BSIError(f"{path} has a line without 'model' and 'index': it is not a run's outcomes file")
        by_model.setdefault(line["model"], {})[int(line["index"])] = line
    if reference not in by_model:
        held = ", ".join(sorted(by_model)) or "nothing"
        advice = "run it again with --dense-recovery" if reference == "dense_recovered" else \
            "run it again (its dense model was not evaluated)"
        raise BSIError(f"'{folder}' holds no answers of {REFERENCES[reference]} (it holds {held}): {advice}")
    if COMPRESSED not in by_model:
        raise BSIError(f"'{folder}' holds no answers of the compressed model: the run did not evaluate it "
                       "(eval_examples 0?); run it again with --eval-examples N")
    dense, compressed = by_model[reference], by_model[COMPRESSED]
    rows = tuple(
        AnswerRow(index, line.get("question"), line.get("reference_answer") or dense[index].get("reference_answer"),
                  dense[index].get("prediction"), dense[index].get("correct"), line.get("prediction"),
                  line.get("correct"))
        for index, line in sorted(compressed.items())
        if index in dense and line.get("correct") is not None and dense[index].get("correct") is not None)
    if not rows:
        raise BSIError(f"'{folder}' holds no answered problem (a text task, or loss-only evaluation): nothing to "
                       "compare answer by answer; its perplexity is in summary.json")
    return RunAnswers(root, reference, rows)


# -------------------------------------------------------------------------------------------------- sweeps
@dataclass(frozen=True)
class ModelAnswer:
    """One sweep model's answer to one problem: which method, protocol, size and seed, and whether it is right."""

    method: str
    protocol: str
    target: float  # share of the compressible layers kept (1.0: the dense model)
    compression_ratio: float  # whole model, before / after
    recovered: bool
    answer: str | None
    correct: bool | None
    budget: int | None = None  # a budget curve's total training after the fine-tune (None: not a budget curve)

    @property
    def label(self) -> str:
        """``bsi @ 0.4 (1.90x)``, ``dense``, ``bsi @ 0.4 (1.90x, no recovery)``, ``bsi @ 0.4 (1.90x, 32 steps)``."""
        if self.method == SWEEP_REFERENCE:
            return SWEEP_REFERENCE
        state = f", {self.budget} steps" if self.budget is not None else "" if self.recovered else ", no recovery"
        return f"{self.method} @ {self.target:g} ({self.compression_ratio:.2f}x{state})"


@dataclass(frozen=True)
class ProblemAnswers:
    """One test problem of a sweep's seed, with every evaluated model's answer (dense first, then by method, size)."""

    seed: int
    index: int
    question: str | None
    reference_answer: str | None
    answers: tuple[ModelAnswer, ...]

    def at(self, method: str, target: float, recovered: bool = True) -> ModelAnswer | None:
        """The answer of ``method`` at ``target`` (None: not in the sweep)."""
        return next((a for a in self.answers if a.method == method and a.target == target and a.recovered == recovered),
                    None)


class SweepAnswers:
    """A sweep folder's answers: every row of ``results.jsonl`` with its outcome file's answers and marks.

    Args:
        folder: a ``bsi sweep --out`` folder (or a shipped copy of one).
        protocol: the engine methods' protocol shown (the truncation methods
            and the dense rows belong to every protocol); default ``tuned``,
            or, in a sweep that ran no ``tuned`` rows, its first protocol by name.

    Raises:
        BSIError: no ``results.jsonl``; no outcome files; outcome files with
            no answers (a text sweep, or one made before answers were kept).
    """

    def __init__(self, folder: str | Path, protocol: str | None = None) -> None:
        self.folder = Path(folder).expanduser()
        path = self.folder / "results.jsonl"
        if not path.is_file():
            what = "a run: use `bsi answers RUN`" if (self.folder / "outcomes.jsonl").is_file() else \
                "give the --out folder of a `bsi sweep` (or data/sweeps/...)"
            raise BSIError(f"'{folder}' holds no sweep results (no results.jsonl): {what}")
        rows = read_study_rows(path)
        protocols = sorted({r.protocol for r in rows if r.protocol not in (None, SWEEP_REFERENCE, "published")})
        if protocol is None:  # a sweep without `tuned` rows (e.g. `--protocols paper`) opens on its first protocol
            protocol = "tuned" if "tuned" in protocols or not protocols else protocols[0]
        if protocols and protocol not in protocols:
            raise BSIError(f"'{folder}' holds no {protocol} rows: use --protocol {' or '.join(protocols)}")
        self.protocol = protocol
        self.rows = [r for r in rows if r.protocol in (SWEEP_REFERENCE, "published", protocol)]
        if not any(r.outcomes for r in self.rows):
            raise BSIError(f"'{folder}' holds no per-problem outcomes (a sweep made before they were kept): nothing "
                           "to show answer by answer")
        self._columns: dict[str, dict[str, list]] = {}
        if not any(any(c is not None for c in self.columns(r)["correct"]) for r in self.rows[:1] + self.rows[-1:]):
            raise BSIError(f"'{folder}' holds no answers (a text task, or loss-only evaluation): its outcomes are "
                           "losses only")

    @property
    def seeds(self) -> list[int]:
        return sorted({int(r.seed) for r in self.rows})

    @property
    def methods(self) -> list[str]:
        """The compressed methods, in the order of the sweep's rows."""
        return list(dict.fromkeys(r.method for r in self.rows if not r.is_reference))

    def methods_of(self, seed: int) -> list[str]:
        """The compressed methods with a row for ``seed`` (a partly run seed holds fewer than :attr:`methods`)."""
        return [m for m in self.methods if any(r.method == m and int(r.seed) == seed for r in self.rows)]

    @property
    def fullest_seed(self) -> int:
        """The first seed holding the most methods: where a view across methods finds them all."""
        return max(self.seeds, key=lambda s: (len(self.methods_of(s)), -s))

    def targets(self, method: str | None = None) -> list[float]:
        """The sizes of ``method`` (every compressed row's when None), largest first."""
        return sorted({float(r.target) for r in self.rows if not r.is_reference
                       and (method is None or r.method == method)}, reverse=True)

    def columns(self, row: StudyRow) -> dict[str, list]:
        """A row's outcome columns (``correct``, ``prediction``, ...), read once."""
        name = row.outcomes
        if not name:
            return {"correct": [], "prediction": []}
        if name not in self._columns:
            try:
                data = json.loads((self.folder / name).read_text(encoding="utf-8"))
            except (OSError, ValueError) as err:
                raise BSIError(f"'{self.folder}': cannot read {name} ({err}); copy the sweep again, outcomes/ "
                               "included") from None
            data.setdefault("prediction", [None] * len(data.get("correct", [])))
            self._columns[name] = data
        return self._columns[name]

    def _seed(self, seed: int | None) -> int:
        if seed is None:
            return self.seeds[0]
        if seed not in self.seeds:
            raise BSIError(f"'{self.folder}' holds no seed {seed}: it holds seed(s) {', '.join(map(str, self.seeds))}")
        return seed

    def problem_count(self, seed: int | None = None) -> int:
        """How many answered test problems the seed's dense row holds."""
        seed = self._seed(seed)
        dense = next((r for r in self.rows if r.is_reference and r.seed == seed), None)
        if dense is None:
            raise BSIError(f"'{self.folder}' holds no dense row for seed {seed}")
        return sum(c is not None for c in self.columns(dense)["correct"])

    def problems(self, seed: int | None = None) -> dict[str, list]:
        """The seed's test problems (``question``, ``answer`` lists) from ``outcomes/problems-s<seed>.json``; {} if absent."""
        path = self.folder / "outcomes" / PROBLEMS.format(seed=self._seed(seed))
        if not path.is_file():
            return {}
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise BSIError(f"cannot read {path} ({err}); delete it to show the answers without the questions") from None

    def problem(self, index: int, seed: int | None = None) -> ProblemAnswers:
        """Every model's answer to test problem ``index`` (0-based, test-set order) of ``seed`` (default: the first)."""
        seed = self._seed(seed)
        count = self.problem_count(seed)
        if not (isinstance(index, int) and 0 <= index < count):
            raise BSIError(f"problem {index} is not among seed {seed}'s {count} answered problems: give 0 to {count - 1}")
        answers = []
        for row in self._ordered(seed):
            columns = self.columns(row)
            ratio = 1.0 if row.compression_ratio is None else float(row.compression_ratio)
            answers.append(ModelAnswer(row.method, row.protocol, float(row.target), ratio, row.recovered,
                                       columns["prediction"][index], columns["correct"][index], row.budget))
        problems = self.problems(seed)
        question = (problems.get("question") or [None] * (index + 1))[index]
        answer = (problems.get("answer") or [None] * (index + 1))[index]
        return ProblemAnswers(seed, index, question, answer, tuple(answers))

    def _ordered(self, seed: int) -> list[StudyRow]:
        """The seed's rows with outcomes: dense first, then methods in sweep order, each largest size first."""
        order = {m: i for i, m in enumerate([SWEEP_REFERENCE, *self.methods])}
        rows = [r for r in self.rows if r.seed == seed and r.outcomes]
        return sorted(rows, key=lambda r: (order[r.method], -float(r.target), not r.recovered, r.budget or 0))

    def _row(self, method: str, target: float, seed: int) -> StudyRow:
        for row in self.rows:
            if row.method == method and float(row.target) == target and row.seed == seed and row.recovered \
                    and row.outcomes:
                return row
        sizes = ", ".join(f"{t:g}" for t in self.targets(method)) or "none"
        raise BSIError(f"'{self.folder}' holds no {method} model at {target:g} for seed {seed} "
                       f"({method}'s sizes: {sizes})")

    def beats(self, method: str, others: Sequence[str], target: float, seed: int | None = None) -> list[int]:
        """The problems (indices) ``method`` answers right at ``target`` where every one of ``others`` is wrong there.

        Raises:
            BSIError: a method or size not in the sweep (named, with what is there).
        """
        seed = self._seed(seed)
        for name in (method, *others):
            if name not in self.methods:
                raise BSIError(f"'{self.folder}' holds no method '{name}': it holds {', '.join(self.methods)}")
        if not others:
            raise BSIError("name at least one method to compare with (--beats basel,svd-llm)")
        mine = self.columns(self._row(method, target, seed))["correct"]
        theirs = [self.columns(self._row(m, target, seed))["correct"] for m in others]
        return [i for i, right in enumerate(mine) if right and all(t[i] is False for t in theirs)]

    def beats_counts(self, method: str, others: Sequence[str], target: float, seed: int | None = None) -> dict[str, Any]:
        """The counts behind :meth:`beats`: problems answered, right by ``method``, right by each other, and the wins."""
        seed = self._seed(seed)
        wins = self.beats(method, others, target, seed)
        right = {name: sum(bool(c) for c in self.columns(self._row(name, target, seed))["correct"])
                 for name in (method, *others)}
        return {"answered": self.problem_count(seed), "right": right, "wins": len(wins)}


def read_sweep_answers(folder: str | Path, protocol: str | None = None) -> SweepAnswers:
    """The answers of the sweep in ``folder`` (see :class:`SweepAnswers`)."""
    return SweepAnswers(folder, protocol)


def rebuild_problems(config: dict[str, Any], seed: int | None = None) -> dict[str, list]:
    """The test problems a run or sweep configuration evaluates on, rebuilt from its data (no model): question/answer lists.

    For run and sweep folders that hold no problems file: the split is a pure
    function of the data, ``test_size`` and the seed.
    """
    from bsi.data import load_task

    try:
        task = load_task(config["data"], question_field=config.get("question_field", "question"),
                         answer_field=config.get("answer_field", "answer"), test_size=config["test_size"],
                         train_size=config.get("train_size"), seed=config["seed"] if seed is None else seed,
                         validation_size=config.get("validation_size", 0))
    except (KeyError, OSError) as err:
        raise BSIError(f"cannot rebuild the test problems from the configuration ({err})") from None
    return {"question": [e.question for e in task.test], "answer": [e.answer for e in task.test]}
