"""Evaluating a model folder with lm-evaluation-harness, the field's common protocol, beside bsi's own.

``bsi eval --model DIR --lm-eval TASKS`` runs lm-eval's ``hf`` model on a
folder exactly as its command line would (``lm_eval --model hf --model_args
pretrained=DIR,trust_remote_code=True``): the model loads through
transformers, a compressed folder through its own ``modeling_bsi.py``. bsi
adds its task folder (:data:`TASKS_FOLDER`) to lm-eval's search path, so two
tasks work with no network:

* ``bsi_wikitext2``: WikiText-2's test articles (the copy packaged with bsi),
  scored whole with ``loglikelihood_rolling``: word perplexity, byte
  perplexity and bits per byte, as lm-eval's own ``wikitext`` task reports
  them (that task reads the raw release from the hub; bsi ships the tokenized
  one, so the figures are close to, not equal to, published ones);
* ``bsi_embedded_math``: the embedded task's test problems (seed 0, the
  order ``bsi compress`` holds them out in), answered greedily, ``exact_match``
  on the final number.

Everything that can be checked is checked before the model loads
(:func:`check_lm_eval`, :func:`check_tasks`): lm-eval missing, a task name
lm-eval does not know, a task file it cannot read, or a task whose data
cannot be built (an lm-eval task that needs the hub, offline) each end in
one line saying what to change.

Word perplexity (per whitespace-separated word of the original text, whole
articles) and bsi's token perplexity (``bsi eval --perplexity``: per token of
the model's tokenizer, fixed windows over the joined test split) measure the
same text differently; they are reported side by side, never compared as
one number.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bsi.errors import BSIError

#: bsi's lm-eval task folder (the YAML files and their ``bsi_tasks.py``), inside the installed package
TASKS_FOLDER = Path(str(importlib.resources.files("bsi.data") / "lm_eval_tasks"))
#: the tasks that folder defines
SHIPPED_TASKS = ("bsi_wikitext2", "bsi_embedded_math")
#: what to install when lm-eval is missing
INSTALL_HINT = "pip install 'bsi[eval]' (lm-eval 0.4.13)"


def check_lm_eval() -> str:
    """lm-eval's version; a one-line error saying how to install it when it is missing."""
    try:
        import lm_eval
    except ImportError:
        raise BSIError(f"--lm-eval needs lm-evaluation-harness, which is not installed: {INSTALL_HINT}") from None
    return getattr(lm_eval, "__version__", "unknown")


def parse_tasks(text: str) -> list[str]:
    """``"a,b"`` -> ``["a", "b"]``; refuses an empty list."""
    tasks = [t.strip() for t in text.split(",") if t.strip()]
    if not tasks:
        raise BSIError(f"--lm-eval takes task names separated by commas (bsi ships {', '.join(SHIPPED_TASKS)}), "
                       f"got '{text}'")
    return tasks


def task_manager(include_path: str | Path | None = None, tasks: Sequence[str] | None = None):
    """lm-eval's ``TaskManager`` over its own tasks, bsi's folder and ``include_path`` (a folder of task YAMLs).

    ``tasks``: the tasks it will be asked for. When every one is a task bsi
    ships (and no ``include_path`` is given), lm-eval's own thousands of task
    files are left unread: indexing them takes 5-10 s on 2 cores, twice per
    ``bsi eval --lm-eval`` before. Any other task, or none named, reads them.
    Without ``include_path`` the folders indexed are the installed packages'
    own, so their index is built once per process (:func:`_packaged_tasks`);
    a user's folder is indexed on every call, as its files may have changed.
    """
    from lm_eval.tasks import TaskManager

    own_only = include_path is None and tasks is not None and all(t in SHIPPED_TASKS for t in tasks)
    if include_path is None:
        return _packaged_tasks(include_lm_evals=not own_only)
    folder = Path(include_path).expanduser()
    if not folder.is_dir():
        raise BSIError(f"--include-path '{include_path}' is not a folder: give the folder that holds your task "
                       "YAML files")
    check_task_files(folder)
    return TaskManager(include_path=[str(TASKS_FOLDER), str(folder)], include_defaults=True)


@functools.cache
def _packaged_tasks(include_lm_evals: bool):
    """lm-eval's ``TaskManager`` over bsi's task folder, and lm-eval's own tasks with ``include_lm_evals``.

    Both folders are part of installed packages and do not change while a
    process runs, so each index is built once (5-10 s on 2 cores for lm-eval's).
    """
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=[str(TASKS_FOLDER)], include_defaults=include_lm_evals)


def check_task_files(folder: Path) -> None:
    """Read every task YAML under ``folder`` as lm-eval does (``!function`` included); name the first it cannot read.

    lm-eval itself only logs such a file and leaves its task out, so the
    task would later be "unknown" with no word about why.
    """
    from lm_eval.tasks._yaml_loader import load_yaml  # the reader lm-eval's TaskManager uses

    for file in sorted(folder.rglob("*.yaml")):
        try:
            load_yaml(file, resolve_func=True)
        except Exception as err:  # YAML syntax, a missing include, a !function that does not import
            reason = " ".join(str(err).split())[:240] or type(err).__name__
            raise BSIError(f"lm-eval cannot read the task file '{file}' ({type(err).__name__}: {reason}); fix it "
                           "or move it out of --include-path") from None


def check_tasks(tasks: list[str], manager) -> None:
    """Refuse, before any model loads, a task lm-eval does not know or cannot build (its file or its data).

    Building a task reads its YAML and its documents: bsi's tasks build from
    the package; an lm-eval task that downloads its data fails here when
    offline, with its own reason in the message.
    """
    from lm_eval.tasks import get_task_dict

    known = set(manager.all_tasks)
    unknown = [t for t in tasks if t not in known]
    if unknown:
        raise BSIError(f"lm-eval has no task '{unknown[0]}': bsi ships {', '.join(SHIPPED_TASKS)}; a task of your own "
                       "goes in a YAML file under --include-path DIR (a file lm-eval cannot parse is left out of its "
                       "task list: check its syntax with `lm_eval validate --tasks NAME --include_path DIR`)")
    for task in tasks:
        try:
            get_task_dict([task], manager)
        except Exception as err:  # lm-eval raises whatever its YAML, template or dataset code raised
            reason = " ".join(str(err).split()) or type(err).__name__
            raise BSIError(f"lm-eval cannot build task '{task}' ({type(err).__name__}: {reason[:300]}); fix its "
                           "YAML file, or give its data locally (lm-eval tasks that download need network)") from None


def has_chat_template(path: str | Path) -> bool:
    """Whether the model folder's tokenizer has a chat template (its own file, or in ``tokenizer_config.json``)."""
    folder = Path(path).expanduser()
    if (folder / "chat_template.jinja").is_file():
        return True
    try:
        return bool(json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


def is_bsi_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder written by ``bsi compress`` or ``bsi export`` (its code is bsi's own)."""
    return (Path(path).expanduser() / "bsi_config.json").is_file()


@dataclass
class HarnessResult:
    """What lm-eval measured: per task, each metric's value (and its standard error where lm-eval gives one)."""

    model: str
    tasks: list[str]
    limit: int | None
    lm_eval_version: str
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    samples: dict[str, int] = field(default_factory=dict)  # documents scored per task

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "tasks": self.tasks, "limit": self.limit, "lm_eval_version": self.lm_eval_version,
                "metrics": self.metrics, "samples": self.samples}

    def lines(self) -> list[str]:
        """One line per task: its metrics, and how many documents it scored."""
        out = []
        for task in self.tasks:
            values = self.metrics.get(task, {})
            shown = ", ".join(f"{name} {value:,.4g}" for name, value in values.items() if not name.endswith("_stderr"))
            out.append(f"{task}: {shown} ({self.samples.get(task, '?')} documents, lm-eval {self.lm_eval_version})")
        return out


def metrics_of(results: dict[str, Any], tasks: list[str]) -> tuple[dict[str, dict[str, float]], dict[str, int]]:
    """The metrics of ``simple_evaluate``'s result per task (``"word_perplexity,none"`` -> ``"word_perplexity"``)."""
    metrics: dict[str, dict[str, float]] = {}
    for task in tasks:
        values = {}
        for key, value in results["results"].get(task, {}).items():
            name, _, _ = key.partition(",")
            if isinstance(value, (int, float)) and name not in ("alias", "sample_len"):  # a stderr "N/A" is text
                values[name] = float(value)
        metrics[task] = values
    samples = {task: int(n.get("effective", n.get("original", 0))) if isinstance(n, dict) else int(n)
               for task, n in results.get("n-samples", {}).items()}
    return metrics, samples


def run_lm_eval(model: str, tasks: list[str], *, limit: int | None = None, include_path: str | Path | None = None,
                device: str = "cpu", dtype: str = "auto", batch_size: int = 1, trust_remote_code: bool = False,
                chat_template: bool | None = None, manager: Any = None) -> HarnessResult:
    """Evaluate the model folder ``model`` on lm-eval ``tasks`` through lm-eval's ``hf`` model; checks first.

    Args:
        model: a model folder (a bsi output folder loads with
            ``trust_remote_code=True``, its code being bsi's) or a hub id.
        limit: documents per task (lm-eval's ``--limit``; None: all).
        chat_template: prompt generation tasks through the tokenizer's chat
            template (lm-eval's ``--apply_chat_template``), as bsi prompts;
            rolling log-likelihood tasks score the text alone either way.
            None: when the folder's tokenizer has one (bsi's own rule).
        manager: a :func:`task_manager` that has checked ``tasks`` already
            (:func:`check_tasks`); None builds and checks one.
    """
    version = check_lm_eval()
    if manager is None:
        manager = task_manager(include_path, tasks)
        check_tasks(tasks, manager)
    import lm_eval

    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    model_args = {"pretrained": str(model), "trust_remote_code": trust_remote_code or is_bsi_folder(model),
                  "dtype": dtype}
    results = lm_eval.simple_evaluate(model="hf", model_args=model_args, tasks=tasks, task_manager=manager,
                                      limit=limit, device=device, batch_size=batch_size,
                                      apply_chat_template=has_chat_template(model) if chat_template is None
                                      else chat_template, log_samples=False)
    metrics, samples = metrics_of(results, tasks)
    return HarnessResult(model=str(model), tasks=tasks, limit=limit, lm_eval_version=version, metrics=metrics,
                         samples=samples)


def result_json(result: HarnessResult) -> str:
    return json.dumps(result.to_dict(), indent=2)
