"""``bsi compare``: what several models answer to the same prompts, side by side.

Numbers (accuracy, loss) say how much a compressed model lost; reading its
answers next to the original's says *how* it fails. Each model (a built-in
name, a model folder, or a folder written by ``bsi compress``) answers every
prompt greedily with the same new-token budget (deterministic; generation
stops early only at the end of the model's turn), one model in memory at a
time. The result is a markdown table (one row per prompt, one column per
model, sizes in the header) and the same data as JSON.

Prompts file: ``.jsonl`` with a ``question`` (or ``prompt``) field per line,
or plain text with one prompt per line.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bsi.errors import BSIError
from bsi.files import json_object
from bsi.pipeline.evaluate import generate_answers
from bsi.models import load_model_and_tokenizer
from bsi.method.surgery import model_parameters


def read_prompts(path: str | Path) -> list[str]:
    """Prompts from a ``.jsonl`` file (``question`` or ``prompt`` field) or a text file (one per line)."""
    path = Path(path)
    if not path.is_file():
        raise BSIError(f"prompts file '{path}' does not exist")
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if path.suffix == ".jsonl":
        prompts = []
        for number, line in enumerate(lines, start=1):
            row = json_object(line, number, path)
            text = row.get("question", row.get("prompt"))
            if not isinstance(text, str) or not text.strip():
                raise BSIError(f"{path} line {number} has no 'question' or 'prompt' text")
            prompts.append(text.strip())
    else:
        prompts = [line.strip() for line in lines]
    if not prompts:
        raise BSIError(f"prompts file '{path}' holds no prompt")
    return prompts


def compare_models(models: Sequence[str], prompts: Sequence[str], *, max_new_tokens: int = 64,
                   device: str = "auto", dtype: str = "auto") -> dict[str, Any]:
    """Answers of every model to every prompt: ``{"prompts", "models": [{"name", "params", "outputs"}]}``."""
    from bsi.models import resolve_device, resolve_dtype

    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    result: dict[str, Any] = {"prompts": list(prompts), "max_new_tokens": max_new_tokens, "models": []}
    for spec in models:
        model, tokenizer = load_model_and_tokenizer(spec, dtype=torch_dtype, device=dev)
        outputs = generate_answers(model, tokenizer, list(prompts), max_new_tokens=max_new_tokens, batch_size=8)
        result["models"].append({"name": spec, "params": model_parameters(model), "outputs": outputs})
        del model
    return result


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>") or " "


def comparison_markdown(result: dict[str, Any]) -> str:
    """One row per prompt, one column per model (its size in the header)."""
    head = ["prompt"] + [f"{m['name']} ({m['params'] / 1e6:.2f}M params)" for m in result["models"]]
    lines = ["| " + " | ".join(_cell(h) for h in head) + " |", "|" + "---|" * len(head)]
    for i, prompt in enumerate(result["prompts"]):
        lines.append("| " + " | ".join([_cell(prompt)] + [_cell(m["outputs"][i]) for m in result["models"]]) + " |")
    return "\n".join(lines) + "\n"
