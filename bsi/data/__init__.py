"""Task data: math word problems, prompts, token labels and mini-batches.

A task is a list of :class:`Example` (a question and a worked answer whose
last line is ``#### <number>``, the GSM8K format) split into train and test.
:func:`load_task` reads one from

* ``"embedded-math"``: grade-school word problems generated on the fly
  (:func:`generate_math_problems`), so bsi runs with no download;
* a local ``.jsonl`` file, one JSON object per line (GSM8K's own
  ``train.jsonl`` works as it is);
* a ``datasets`` hub name such as ``"openai/gsm8k"`` (needs network access).

A *text task* (:mod:`~bsi.data.text`) is plain text for language modelling:
:func:`load_text_task` reads ``"wikitext-2"`` (shipped inside bsi), a text
file, a folder of ``.txt`` files, a JSONL file with a ``text`` field or a hub
id, tokenizes it once into a training stream cut into windows and a
held-out stream, and :class:`TextBatchStream` serves the training windows
with the same keys as :class:`BatchStream`.

The modules: :mod:`~bsi.data.examples` (the data types),
:mod:`~bsi.data.problems` (the generator), :mod:`~bsi.data.tasks` (loading),
:mod:`~bsi.data.batches` (prompts, labels, batches),
:mod:`~bsi.data.answers` (reading the final number) and
:mod:`~bsi.data.text` (text tasks). Everything public is
importable from ``bsi.data`` itself.
"""

from bsi.data.answers import answers_match, extract_answer
from bsi.data.batches import (
    IGNORE_INDEX,
    PROCESS_SEED_STRIDE,
    BatchStream,
    BatchUse,
    EncodedExamples,
    build_prompt,
    collate,
    encode_answer,
    encode_example,
    encode_prompt,
    end_of_turn_text,
    epoch_permutation,
    pad_id,
    stop_token_ids,
)
from bsi.data.examples import Example, TaskData
from bsi.data.problems import DEFAULT_TRAIN_SIZE, EMBEDDED_TASK, generate_math_problems
from bsi.data.tasks import MAX_LINE_BYTES, load_task, read_jsonl
from bsi.data.text import (
    DEFAULT_HELD_OUT_FRACTION,
    DEFAULT_TEXT_FIELD,
    DEFAULT_WINDOW,
    EOS_SEPARATOR,
    WIKITEXT_2,
    WIKITEXT_2_RELEASE,
    TextBatchStream,
    TextCorpus,
    TextTask,
    check_window,
    context_token,
    cut_windows,
    is_text_run,
    is_text_task,
    join_documents,
    load_text_task,
    looks_like_text,
    read_text_corpus,
    set_aside_windows,
    split_tail,
    tokenize_corpus,
    wikitext_2_folder,
)

__all__ = [
    "DEFAULT_TRAIN_SIZE", "EMBEDDED_TASK", "IGNORE_INDEX", "MAX_LINE_BYTES", "PROCESS_SEED_STRIDE", "BatchStream", "BatchUse",
    "EncodedExamples", "Example", "TaskData",
    "answers_match", "build_prompt", "collate", "encode_answer", "encode_example", "encode_prompt", "end_of_turn_text",
    "extract_answer", "generate_math_problems", "load_task", "pad_id", "read_jsonl", "stop_token_ids",
    # text tasks
    "DEFAULT_HELD_OUT_FRACTION", "DEFAULT_TEXT_FIELD", "DEFAULT_WINDOW", "EOS_SEPARATOR", "WIKITEXT_2",
    "WIKITEXT_2_RELEASE", "TextBatchStream", "TextCorpus", "TextTask", "check_window", "context_token", "cut_windows",
    "epoch_permutation", "is_text_run", "is_text_task", "join_documents", "load_text_task", "looks_like_text", "read_text_corpus",
    "set_aside_windows", "split_tail", "tokenize_corpus", "wikitext_2_folder",
]
