"""What several models answered to the same prompts, as a table against a stated reference: prompts in, Markdown out.

Numbers (accuracy, loss) say how much a compressed model lost; reading its
answers next to the original's says *how* it fails. This module reads the
prompts and writes the table; :mod:`bsi.pipeline.compare` loads the models,
finds the fair reference (a run's fine-tuned dense model) and has each model
answer.

**Marks.** A prompt with a reference answer (the task's format: a worked
answer whose last line is ``#### <number>``, or just the number) gets a
right/wrong mark per model, by the final number, as a run's evaluation marks
its test problems.

Prompts file: ``.jsonl`` with a ``question`` (or ``prompt``) field per line
and an optional ``answer``, or plain text with one prompt per line. The
result is a markdown table (one row per prompt, one column per model, sizes
in the header) and the same data as JSON. Every table starts with a line
saying which reference it used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bsi.data.answers import answers_match, extract_answer
from bsi.errors import BSIError
from bsi.files import json_object


@dataclass(frozen=True)
class Prompt:
    """One prompt and, when the prompts file gives one, its reference ``answer`` (marked by its final number)."""

    text: str
    answer: str | None = None

    @property
    def gold(self) -> str | None:
        """The final number of the reference answer (None: no answer, nothing to mark)."""
        return None if self.answer is None else extract_answer(self.answer)

    def marks(self, output: str) -> bool | None:
        """Whether ``output`` ends with the reference answer's number; None when there is no reference answer."""
        gold = self.gold
        return None if gold is None else answers_match(extract_answer(output), gold)


def read_marked_prompts(path: str | Path) -> list[Prompt]:
    """The prompts of a ``.jsonl`` file (``question`` or ``prompt``, optional ``answer``) or a text file (one a line).

    Raises:
        BSIError: a missing or empty file, a line without a prompt, or an
            ``answer`` with no final number to mark against (one line naming
            the file, the line and the format).
    """
    path = Path(path)
    if not path.is_file():
        raise BSIError(f"prompts file '{path}' does not exist")
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    prompts = []
    if path.suffix == ".jsonl":
        for number, line in enumerate(lines, start=1):
            row = json_object(line, number, path)
            text = row.get("question", row.get("prompt"))
            if not isinstance(text, str) or not text.strip():
                raise BSIError(f"{path} line {number} has no 'question' or 'prompt' text")
            answer = row.get("answer")
            if answer is not None and (isinstance(answer, bool) or not isinstance(answer, (str, int, float))
                                       or extract_answer(str(answer)) is None):
                raise BSIError(f"{path} line {number}: the answer {json.dumps(answer)} has no final number to mark "
                               "against; write it as the task does ('... #### 42') or as '42', or leave 'answer' out")
            prompts.append(Prompt(text.strip(), None if answer is None else str(answer)))
    else:
        prompts = [Prompt(line.strip()) for line in lines]
    if not prompts:
        raise BSIError(f"prompts file '{path}' holds no prompt")
    return prompts


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>") or " "


def reference_line(result: dict[str, Any]) -> str:
    """The table's first line: which reference the comparison used (or that it had none)."""
    reference = result.get("reference")
    if reference is None:
        return ("Reference: none (no run folder among the models): the models are shown as given. To compare a "
                "compressed model with the model it was made from, name its run folder.")
    return f"Reference: {reference['description']}."


def _marked(output: str, correct: bool | None) -> str:
    return _cell(output) if correct is None else f"{_cell(output)}<br>**{'right' if correct else 'wrong'}**"


def comparison_markdown(result: dict[str, Any]) -> str:
    """The reference line, then one row per prompt, one column per model (its size in the header), marks and counts."""
    answers = result.get("answers") or [None] * len(result["prompts"])
    with_answers = any(a is not None for a in answers)
    head = ["prompt"] + (["task's answer"] if with_answers else []) + \
        [f"{m['name']} ({m['params'] / 1e6:.2f}M params)" for m in result["models"]]
    lines = [reference_line(result), "", "| " + " | ".join(_cell(h) for h in head) + " |", "|" + "---|" * len(head)]
    for i, prompt in enumerate(result["prompts"]):
        given = [_cell(answers[i] or "")] if with_answers else []
        cells = [_marked(m["outputs"][i], (m.get("correct") or [None] * len(answers))[i]) for m in result["models"]]
        lines.append("| " + " | ".join([_cell(prompt), *given, *cells]) + " |")
    if with_answers:
        marked = sum(a is not None for a in answers)
        counts = [f"**{sum(bool(c) for c in m.get('correct') or [])} of {marked} right**" for m in result["models"]]
        lines.append("| " + " | ".join(["marked prompts", "", *counts]) + " |")
    return "\n".join(lines) + "\n"
