"""``bsi compare``: what several models answer to the same prompts, side by side, against a stated reference.

Each model (a built-in name, a model folder, or a folder written by ``bsi
compress``) answers every prompt greedily with the same new-token budget
(deterministic; generation stops early only at the end of the model's turn or
its answer line), one model in memory at a time. The prompts and the table
are :mod:`bsi.analysis.compare`'s.

**The reference.** A compressed model is compared fairly only with the model
it was made from: the run's *fine-tuned* dense model, not the source model
before the task fine-tune (that would credit the fine-tune's gain, or blame
its loss, on the compression). When a run folder is among the models (or is
named with ``--reference``), :func:`run_reference` finds that model (in the
fine-tune cache, ``$BSI_CACHE/finetuned/<key>``, the key recomputed from the
run's configuration) and it becomes the first column.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bsi.analysis.compare import Prompt
from bsi.config import PipelineConfig
from bsi.errors import BSIError
from bsi.method.surgery import model_parameters
from bsi.models import load_model_and_tokenizer, resolve_device, resolve_dtype
from bsi.pipeline.evaluate import generate_answers
from bsi.pipeline.runner import finetune_cache_folder, saved_run_finetune_key


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

    summary = run_summary(folder)
    config = PipelineConfig.from_dict(summary["config"])
    if config.skip_finetune or config.finetune.steps == 0:
        return Reference(config.model, str(folder), f"`{config.model}`, the dense model `{folder}` compressed (the run "
                                                    "had no fine-tune stage)")

    path = finetune_cache_folder(saved_run_finetune_key(config, summary), cache_dir)
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
