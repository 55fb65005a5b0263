"""lm-evaluation-harness tasks shipped with bsi: WikiText-2 and the embedded math task, read from bsi itself.

lm-eval (``pip install "bsi[eval]"``) finds the tasks when given this folder::

    lm_eval --model hf --model_args pretrained=runs/default,trust_remote_code=True \\
        --include_path "$(python -c 'import bsi.lm_eval; print(bsi.lm_eval.TASKS_FOLDER)')" \\
        --tasks bsi_wikitext2 --limit 8

(``bsi eval --lm-eval bsi_wikitext2`` does the same). Nothing is downloaded:
the documents come from the WikiText-2 copy packaged with bsi and from bsi's
problem generator, through lm-eval's ``custom_dataset`` hook (the functions
below each return a ``datasets.DatasetDict`` with a ``test`` split).

* ``bsi_wikitext2``: every article of WikiText-2's test split, scored whole
  with ``loglikelihood_rolling`` and reported as lm-eval's WikiText metrics
  (word perplexity, byte perplexity, bits per byte), with lm-eval's own
  detokenizer and word count. bsi ships the *tokenized* release (rare words
  are ``<unk>``), lm-eval's own ``wikitext`` task reads the *raw* one: the
  figures are close to, not equal to, published ``wikitext`` figures.
* ``bsi_embedded_math``: the test problems of ``bsi compress`` (seed 0, in
  the same order), answered greedily; ``exact_match`` is 1 when the final
  number equals the gold one, compared as ``bsi eval`` compares them. Add
  ``--apply_chat_template`` to prompt as bsi does (the question as the
  user's turn of the model's chat template).
"""

from __future__ import annotations

import re
from typing import Any

import datasets
from lm_eval.tasks.wikitext.preprocess_wikitext import process_results as wikitext_process_results
from lm_eval.tasks.wikitext.preprocess_wikitext import wikitext_detokenizer

from bsi.data import answers_match, extract_answer
from bsi.data.problems import embedded_task
from bsi.data.text import wikitext_2_folder

__all__ = ["embedded_math_test", "score_answer", "split_articles", "wikitext_2_test", "wikitext_detokenizer",
           "wikitext_process_results"]

#: a WikiText article starts at a level-one heading line `` = Title = `` (sections are `` = = Section = = ``)
_ARTICLE_HEADING = re.compile(r"^ = [^=].* = $")


def split_articles(text: str) -> list[str]:
    """WikiText's articles, in order: each begins at its level-one heading line and runs to the next one."""
    articles: list[list[str]] = []
    for line in text.splitlines(keepends=True):
        if _ARTICLE_HEADING.match(line.rstrip("\n")) or not articles:
            articles.append([])
        articles[-1].append(line)
    return [joined for joined in ("".join(lines).strip("\n") for lines in articles) if joined.strip()]


def wikitext_2_test(**_: Any) -> datasets.DatasetDict:
    """The articles of the packaged WikiText-2 test split as lm-eval documents (field ``page``)."""
    text = (wikitext_2_folder() / "test.txt").read_text(encoding="utf-8")
    return datasets.DatasetDict({"test": datasets.Dataset.from_dict({"page": split_articles(text)})})


def embedded_math_test(test_size: int = 100, seed: int = 0, **_: Any) -> datasets.DatasetDict:
    """The embedded task's test problems (those ``bsi compress --seed SEED`` holds out), fields question/answer/gold."""
    test = embedded_task(test_size, train_size=1, seed=seed).test
    return datasets.DatasetDict({"test": datasets.Dataset.from_dict({
        "question": [e.question for e in test],
        "answer": [e.answer for e in test],
        "gold": [extract_answer(e.answer) or "" for e in test],
    })})


def score_answer(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """``exact_match``: 1.0 when the generated answer's final number equals the problem's (bsi's comparison)."""
    return {"exact_match": float(answers_match(extract_answer(results[0]), doc["gold"]))}
