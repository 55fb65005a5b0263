"""``bsi compare``: what several models answer to the same prompts, side by side, against a stated reference.

Numbers (accuracy, loss) say how much a compressed model lost; reading its
answers next to the original's says *how* it fails. Each model (a built-in
name, a model folder, or a folder written by ``bsi compress``) answers every
prompt greedily with the same new-token budget (deterministic; generation
stops early only at the end of the model's turn or its answer line), one
model in memory at a time.

**The reference.** A compressed model is compared fairly only with the model
it was made from: the run's *fine-tuned* dense model, not the source model
before the task fine-tune (that would credit the fine-tune's gain, or blame
its loss, on the compression). When a run folder is among the models (or is
named with ``--reference``), :func:`run_reference` finds that model (in the
fine-tune cache, ``$BSI_CACHE/finetuned/<key>``, the key recomputed from the
run's configuration) and it becomes the first column. Every table starts
with a line saying which reference it used.

**Marks.** A prompt with a reference answer (the task's format: a worked
answer whose last line is ``#### <number>``, or just the number) gets a
right/wrong mark per model, by the final number, as a run's evaluation marks
its test problems.

Prompts file: ``.jsonl`` with a ``question`` (or ``prompt``) field per line
and an optional ``answer``, or plain text with one prompt per line. The
result is a markdown table (one row per prompt, one column per model, sizes
in the header) and the same data as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
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


def read_prompts(path: str | Path) -> list[str]:
    """The prompt texts of a prompts file (see :func:`read_marked_prompts`, which also checks the answers)."""
    return [p.text for p in read_marked_prompts(path)]


@dataclass(frozen=True)
class Reference:
    """The dense model a run compressed: ``model`` (a folder or a name) and how a table names it."""

    model: str
    run: str  # the run folder it belongs to
    description: str


def run_summary(folder: str | Path) -> dict[str, Any]:
    """A run folder's ``summary.json`` (with its ``config``); a one-line error when ``folder`` is not a run."""
    path = Path(folder).expanduser() / "summary.json"
    if not path.is_file():
        raise BSIError(f"'{folder}' is not a run folder (no summary.json): give the --out folder of a `bsi compress` "
                       "run, whose fine-tuned dense model is the reference")
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise BSIError(f"cannot read {path} ({err}): is the run complete?") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("config"), dict):
        raise BSIError(f"{path} holds no run configuration ('config'): give the --out folder of a `bsi compress` run")
    return summary


def is_run(folder: str | Path) -> bool:
    """True for a folder written by ``bsi compress`` (it holds ``summary.json``)."""
    return (Path(folder).expanduser() / "summary.json").is_file()


def run_reference(folder: str | Path, cache_dir: str | Path | None = None) -> Reference:
    """The run's fine-tuned dense model, the fair reference for its compressed model (checked, not loaded).

    It is the stage-1 result in the fine-tune cache, found by the key
    :func:`bsi.pipeline.runner.finetune_cache_key` computes from the run's
    configuration and dtype (a run made without the fine-tune stage compressed
    its source model: that is then the reference).

    Raises:
        BSIError: ``folder`` is not a run, or its fine-tuned model is not in
            this machine's cache (with the command that makes it again).
    """
    from bsi.config import PipelineConfig
    from bsi.models import cache_root

    summary = run_summary(folder)
    config = PipelineConfig.from_dict(summary["config"])
    if config.skip_finetune or config.finetune.steps == 0:
        return Reference(config.model, str(folder), f"`{config.model}`, the dense model `{folder}` compressed (the run "
                                                    "had no fine-tune stage)")
    from bsi.pipeline.runner import saved_run_finetune_key

    path = cache_root(cache_dir) / "finetuned" / saved_run_finetune_key(config, summary)
    if not (path / "config.json").is_file():
        raise BSIError(f"the fine-tuned dense model of '{folder}' is not in this machine's cache ({path}): run its "
                       f"configuration once to make it (`bsi compress --preset {config.preset or 'default'} ...` with "
                       "the same settings fine-tunes it first), or compare without it")
    return Reference(str(path), str(folder), f"the fine-tuned dense model of `{folder}` (the model it compressed, "
                                             f"from the fine-tune cache: `{path}`)")


def find_reference(models: Sequence[str], reference: str | None = None,
                   cache_dir: str | Path | None = None) -> Reference | None:
    """The reference of a comparison: ``reference``'s (a run folder), else the first run folder's among ``models``.

    Raises:
        BSIError: ``reference`` is not a run folder, its fine-tuned model is
            not cached, or the run folders among ``models`` come from
            different fine-tunes (no one reference for all).
    """
    if reference is not None:
        return run_reference(reference, cache_dir)
    runs = [m for m in models if is_run(m)]
    if not runs:
        return None
    found = [run_reference(r, cache_dir) for r in runs]
    if len({f.model for f in found}) > 1:
        raise BSIError(f"{' and '.join(runs)} come from different fine-tuned models: compare one run at a time, or "
                       "name the reference with --reference RUN")
    return found[0]


def compare_models(models: Sequence[str], prompts: Sequence[str | Prompt], *, max_new_tokens: int = 64,
                   device: str = "auto", dtype: str = "auto", reference: Reference | None = None) -> dict[str, Any]:
    """Answers of every model to every prompt, marked where a prompt has a reference answer.

    Returns ``{"reference", "prompts", "answers", "max_new_tokens", "models": [{"name", "params", "outputs",
    "correct"}]}``: the ``reference`` model (when given) answers first, as the first model; ``answers`` holds
    each prompt's reference answer (None: unmarked), ``correct`` each model's marks (None: unmarked).
    """
    from bsi.models import load_model_and_tokenizer, resolve_device, resolve_dtype
    from bsi.method.surgery import model_parameters
    from bsi.pipeline.evaluate import generate_answers

    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    marked = [p if isinstance(p, Prompt) else Prompt(p) for p in prompts]
    texts = [p.text for p in marked]
    result: dict[str, Any] = {
        "reference": None if reference is None else {"model": reference.model, "run": reference.run,
                                                     "description": reference.description},
        "prompts": texts, "answers": [p.answer for p in marked], "max_new_tokens": max_new_tokens, "models": []}
    named = reference is not None and reference.model in models  # the user named the reference model too
    columns = ([(reference.model, f"{reference.model} (reference)" if named else
                 f"reference: dense model of {reference.run}")] if reference is not None else []) + \
        [(spec, spec) for spec in models if reference is None or spec != reference.model]
    for spec, name in columns:
        model, tokenizer = load_model_and_tokenizer(spec, dtype=torch_dtype, device=dev)
        outputs = generate_answers(model, tokenizer, texts, max_new_tokens=max_new_tokens, batch_size=8)
        result["models"].append({"name": name, "params": model_parameters(model), "outputs": outputs,
                                 "correct": [p.marks(o) for p, o in zip(marked, outputs)]})
        del model
    return result


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
