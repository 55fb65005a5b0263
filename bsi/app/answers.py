"""Answers tab: what the models answered, problem by problem, marked right or wrong.

Two views, both reading what runs and sweeps already store, through
:mod:`bsi.analysis.answers` (the same reader as ``bsi answers``):

* **A run**: its test problems with the dense reference's answer and the
  compressed model's side by side, each marked, filterable by category
  (``lost``: the dense model right, the compressed one wrong; ``gained``;
  ``both-right``; ``both-wrong``), with the counts. The reference is the
  run's fine-tuned dense model, or the same trained with the recovery's steps
  when the run measured it (``--dense-recovery``); the status line says which.
* **A sweep**: one test problem and every method's answer at every size; and
  the problems one method answers right at a size where every other chosen
  method is wrong.

Every handler returns either a complete view or one line saying what to
change (:class:`~bsi.errors.BSIError`), never a half-filled one.
"""

from __future__ import annotations

from collections.abc import Sequence

from bsi.analysis.answers import (
    CATEGORIES,
    CATEGORY_MEANINGS,
    REFERENCES,
    RunAnswers,
    SweepAnswers,
    read_run_answers,
    read_sweep_answers,
)
from bsi.data import extract_answer
from bsi.errors import BSIError

ALL = "all"
RUN_HEADERS = ["#", "question", "task's answer", "dense answer", "dense", "compressed answer", "compressed",
               "category"]
PROBLEM_HEADERS = ["model", "answer", "mark"]


def mark(correct: bool | None) -> str:
    """A right/wrong mark for a table cell (blank: not answered)."""
    return "" if correct is None else ("✓ right" if correct else "✗ wrong")


def final_number(answer: str | None) -> str:
    """The number a worked answer ends with (its ``#### N``), what an answer is marked against."""
    return "" if not answer else (extract_answer(answer) or answer)


def _folder(text: str | None, what: str) -> str:
    folder = (text or "").strip()
    if not folder:
        raise BSIError(f"type the folder of {what}")
    return folder


# --------------------------------------------------------------------------------------------- a run
def category_choices(answers: RunAnswers) -> list[tuple[str, str]]:
    """The filter's choices, each with its count: ``("lost (4)", "lost")``; ``all`` first."""
    counts = answers.counts()
    return [(f"all ({len(answers.rows)})", ALL)] + [(f"{name} ({counts[name]})", name) for name in CATEGORIES]


def run_status(answers: RunAnswers) -> str:
    """One line: how many problems, which reference, both accuracies and every category's count and meaning."""
    dense, compressed = answers.accuracy()
    counts = answers.counts()
    parts = ", ".join(f"**{name}** {counts[name]} ({CATEGORY_MEANINGS[name]})" for name in CATEGORIES)
    return (f"{len(answers.rows)} test problems of `{answers.folder}` · reference: **{answers.reference_label}** · "
            f"right: dense {dense:.0%}, compressed {compressed:.0%} · {parts}")


def run_rows(answers: RunAnswers, which: str | None = None) -> list[list]:
    """The table's rows (:data:`RUN_HEADERS`) of one category (``all``/None: every problem)."""
    chosen = answers.only(None if which in (None, ALL) else which)
    return [[row.index, row.question or "", final_number(row.reference_answer), row.dense_answer or "",
             mark(row.dense_correct), row.answer or "", mark(row.correct), row.category or ""] for row in chosen]


def run_view(folder: str, reference: str = "finetuned", which: str = ALL):
    """(status, rows, filter choices) for the run in ``folder``; BSIError with one line for a folder that cannot answer."""
    answers = read_run_answers(_folder(folder, "a run (`bsi compress --out`, or *Save to folder*)"), reference)
    return run_status(answers), run_rows(answers, which), category_choices(answers)


# ------------------------------------------------------------------------------------------- a sweep
def sweep_choices(sweep: SweepAnswers) -> dict:
    """What the sweep offers to pick from: seeds, methods, sizes and how many problems the first seed has."""
    seed = sweep.fullest_seed  # the view opens on a seed that holds every method it can
    return {"seeds": sweep.seeds, "seed": seed, "methods": sweep.methods_of(seed), "targets": sweep.targets(),
            "count": sweep.problem_count(seed)}


def problem_view(sweep: SweepAnswers, index: int, seed: int | None = None) -> tuple[str, list[list]]:
    """(the problem as a line, one row per model: label, answer, mark) for test problem ``index``."""
    if index is None or float(index) != int(index):
        raise BSIError("Problem: type a whole number")
    problem = sweep.problem(int(index), seed)
    right = sum(bool(a.correct) for a in problem.answers)
    question = problem.question or "(the sweep did not keep its questions)"
    gold = final_number(problem.reference_answer)
    text = (f"**Problem {problem.index}** (seed {problem.seed}): {question}" + (f" · task's answer **{gold}**" if gold
                                                                                 else "") +
            f" · {right} of {len(problem.answers)} models answer right")
    rows = [[a.label, a.answer or "", mark(a.correct)] for a in problem.answers]
    return text, rows


def beats_view(sweep: SweepAnswers, method: str, others: Sequence[str], target: float | None,
               seed: int | None = None) -> tuple[str, list[list], list[str]]:
    """(a line with the counts, one row per problem ``method`` alone gets right among ``others``, the headers)."""
    if not method:
        raise BSIError("choose the method whose answers you look for")
    others = [m for m in (others or []) if m != method]
    if not others:
        raise BSIError("choose at least one other method to compare with")
    if target is None:
        raise BSIError("choose a size")
    target = float(target)
    wins = sweep.beats(method, others, target, seed)
    counts = sweep.beats_counts(method, others, target, seed)
    problems = sweep.problems(seed)
    questions, golds = problems.get("question") or [], problems.get("answer") or []
    rows = []
    for index in wins:
        answers = sweep.problem(index, seed)
        cells = [answers.at(name, target) for name in (method, *others)]
        rows.append([index, questions[index] if index < len(questions) else "",
                     final_number(golds[index]) if index < len(golds) else "",
                     *[(cell.answer or "") if cell else "" for cell in cells]])
    right = ", ".join(f"{name} {n}" for name, n in counts["right"].items())
    text = (f"At {target:g} of the linear layers: **{len(wins)}** of {counts['answered']} problems answered right by "
            f"**{method}** and wrong by every one of {', '.join(others)} (right answers: {right}).")
    headers = ["#", "question", "task's answer", *(f"{name} answer" for name in (method, *others))]
    return text, rows, headers


# -------------------------------------------------------------------------------------------- layout
def render(run_folder: str = "", sweep_folder: str = ""):
    """Lay out the Answers tab; both views open on the given folders (the shipped run and study)."""
    import gradio as gr

    gr.Markdown("What the models answered, problem by problem, marked against the task's answer. "
                "`bsi answers` prints the same from the command line.")
    with gr.Tab("A run"):
        with gr.Row():
            run_box = gr.Textbox(value=run_folder, label="Run folder (`bsi compress --out`, or Save to folder)",
                                 scale=4, elem_id="answers-run-folder")
            reference = gr.Radio([(label, key) for key, label in REFERENCES.items()], value="finetuned",
                                 label="Reference", scale=3)
            run_load = gr.Button("Load", variant="primary", scale=1, elem_id="answers-run-load")
        run_status_md = gr.Markdown(elem_id="answers-run-status")
        which = gr.Radio([ALL, *CATEGORIES], value=ALL, label="Show", elem_id="answers-filter")
        run_table = gr.Dataframe(headers=RUN_HEADERS, value=[], interactive=False, wrap=True, max_height=600,
                                 label="Answers (dense reference | compressed)", elem_id="answers-run-table",
                                 column_widths=["4%", "26%", "6%", "22%", "6%", "22%", "6%", "8%"])

    with gr.Tab("A sweep"):
        with gr.Row():
            sweep_box = gr.Textbox(value=sweep_folder, label="Sweep folder (`bsi sweep --out`, or the shipped study)",
                                   scale=4, elem_id="answers-sweep-folder")
            seed = gr.Dropdown([], label="Seed", scale=1, interactive=True)
            sweep_load = gr.Button("Load", variant="primary", scale=1, elem_id="answers-sweep-load")
        sweep_status = gr.Markdown(elem_id="answers-sweep-status")
        with gr.Row():
            index = gr.Number(value=0, precision=0, label="Problem (0-based, test-set order)", scale=1,
                              elem_id="answers-problem")
            show = gr.Button("Show every method's answer", scale=1, elem_id="answers-problem-show")
        problem_md = gr.Markdown(elem_id="answers-problem-text")
        problem_table = gr.Dataframe(headers=PROBLEM_HEADERS, value=[], interactive=False, wrap=True, max_height=520,
                                     label="Every method at every size", elem_id="answers-problem-table",
                                     column_widths=["22%", "70%", "8%"])
        gr.Markdown("**What does one method still get right that the others do not?**")
        with gr.Row():
            method = gr.Dropdown([], label="Method", interactive=True, elem_id="answers-method")
            others = gr.Dropdown([], multiselect=True, label="against", interactive=True, elem_id="answers-others")
            size = gr.Dropdown([], label="Size (share of the linear layers kept)", interactive=True,
                               elem_id="answers-size")
            find = gr.Button("List the problems", elem_id="answers-beats")
        beats_md = gr.Markdown(elem_id="answers-beats-text")
        beats_table = gr.Dataframe(value=[], interactive=False, wrap=True, max_height=520, label="Problems",
                                   elem_id="answers-beats-table")

    def on_run(folder, ref, shown):
        try:
            status, rows, choices = run_view(folder, ref, shown)
        except BSIError as err:
            return f"**Error:** {err}", gr.update(choices=[ALL, *CATEGORIES], value=ALL), {"data": [], "headers": RUN_HEADERS}
        return status, gr.update(choices=choices, value=shown if shown in dict(map(reversed, choices)) else ALL), \
            {"data": rows, "headers": RUN_HEADERS}

    def on_filter(folder, ref, shown):
        try:
            _, rows, _ = run_view(folder, ref, shown)
        except BSIError as err:
            return f"**Error:** {err}", {"data": [], "headers": RUN_HEADERS}
        return gr.skip(), {"data": rows, "headers": RUN_HEADERS}

    run_load.click(on_run, [run_box, reference, which], [run_status_md, which, run_table])
    reference.input(on_run, [run_box, reference, which], [run_status_md, which, run_table])
    which.input(on_filter, [run_box, reference, which], [run_status_md, run_table])

    empty_problem = {"data": [], "headers": PROBLEM_HEADERS}

    def on_sweep(folder):
        blank = (gr.update(choices=[], value=None),) * 4
        try:
            sweep = read_sweep_answers(_folder(folder, "a sweep (`bsi sweep --out`)"))
            offer = sweep_choices(sweep)
            text, rows = problem_view(sweep, 0, offer["seed"])
        except BSIError as err:
            return (f"**Error:** {err}", *blank, "", empty_problem)
        methods = offer["methods"]
        status = (f"{len(sweep.rows)} evaluated models of `{sweep.folder}` ({sweep.protocol} protocol): "
                  f"{', '.join(methods)} at {', '.join(f'{t:g}' for t in offer['targets'])}; seeds "
                  f"{', '.join(map(str, offer['seeds']))}; {offer['count']} answered problems per seed")
        first = "bsi" if "bsi" in methods else methods[0]
        shared = [t for t in offer["targets"] if all(t in sweep.targets(m) for m in methods)]  # every method has it
        return (status, gr.update(choices=offer["seeds"], value=offer["seed"]),
                gr.update(choices=methods, value=first),
                gr.update(choices=methods, value=[m for m in methods if m != first]),
                gr.update(choices=offer["targets"], value=(shared or offer["targets"])[0]), text, rows)

    def on_problem(folder, seed_value, number):
        try:
            text, rows = problem_view(read_sweep_answers(_folder(folder, "a sweep")), number, seed_value)
        except BSIError as err:
            return f"**Error:** {err}", empty_problem
        return text, {"data": rows, "headers": PROBLEM_HEADERS}

    def on_beats(folder, seed_value, chosen, against, target):
        try:
            text, rows, headers = beats_view(read_sweep_answers(_folder(folder, "a sweep")), chosen, against, target,
                                             seed_value)
        except BSIError as err:
            return f"**Error:** {err}", {"data": [], "headers": ["#"]}
        return text, {"data": rows, "headers": headers}

    sweep_outputs = [sweep_status, seed, method, others, size, problem_md, problem_table]
    sweep_load.click(on_sweep, sweep_box, sweep_outputs)
    show.click(on_problem, [sweep_box, seed, index], [problem_md, problem_table])
    index.submit(on_problem, [sweep_box, seed, index], [problem_md, problem_table])
    find.click(on_beats, [sweep_box, seed, method, others, size], [beats_md, beats_table])
    return {"run": (on_run, [run_box, reference, which], [run_status_md, which, run_table]),
            "sweep": (on_sweep, sweep_box, sweep_outputs)}


__all__ = ["run_view", "run_rows", "run_status", "category_choices", "problem_view", "beats_view", "sweep_choices",
           "mark", "final_number", "render"]
