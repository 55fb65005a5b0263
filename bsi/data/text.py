"""Text tasks: plain text, tokenized once and cut into fixed-length windows (language modelling).

A question/answer task (:mod:`bsi.data.tasks`) trains on answers and is
measured by accuracy. A *text task* trains on every token of a text and is
measured by perplexity on a held-out part of it
(:mod:`bsi.pipeline.perplexity`). Where the text comes from
(:func:`read_text_corpus`):

* ``"wikitext-2"`` (:data:`WIKITEXT_2`): WikiText-2, shipped inside bsi, so
  it needs no network. Its validation split ``valid.txt`` trains and
  calibrates; its test split ``test.txt`` is held out. It is the *tokenized*
  release (word-level, rare words replaced by ``<unk>``), not ``raw``:
  :data:`WIKITEXT_2_RELEASE` says so wherever a perplexity on it is printed.
  Source and licence (CC BY-SA 3.0): ``bsi/data/wikitext-2/LICENSE.md``.
* a text file (``.txt``, or any UTF-8 file that is not ``.jsonl``): one
  document;
* a folder: every ``.txt`` file under it, sub-folders included, one document
  each, in the order of their paths (empty files are skipped);
* a ``.jsonl`` file: one document per line, in its ``text`` field
  (``text_field`` picks another); empty texts are skipped;
* a ``datasets`` hub id, ``"name"`` or ``"name:config"`` (needs network): one
  document per row of its ``text`` column; its ``test`` split (else its
  ``validation`` split) is held out, if it has one.

How text becomes tokens (:func:`tokenize_corpus`), the protocol every number
measured on a text task rests on:

1. Each document is tokenized on its own, with no special tokens (no BOS).
2. The documents of a part are joined into one token stream, with a
   separator between two documents: by default the tokenizer's
   end-of-sequence token (:data:`EOS_SEPARATOR`), or the tokens of any text
   you choose (``separator="\\n\\n"``; ``""`` joins them with nothing).
3. The held-out part is the one the source states (WikiText-2's
   ``test.txt``, a hub dataset's test split). Otherwise it is a *held-out
   tail*: the documents are shuffled with ``seed`` (a single document stays
   as it is), joined, and the last ``held_out_fraction`` of the stream's
   tokens (rounded up) is held out (:func:`split_tail`). At most one
   document straddles the cut: its beginning trains, its end is held out.
   ``held_out_fraction=1`` holds out everything (for scoring a text only).
4. The training part is cut into non-overlapping windows of ``window``
   tokens from its first token; the shorter remainder at its end is left
   out (:func:`cut_windows`). The held-out part stays a stream: the
   perplexity protocol cuts its own windows.
5. A model whose tokenizer starts every text with a beginning-of-sequence
   token (Gemma's ``<bos>``; :func:`context_token`) was trained never to see
   a sequence without it, and predicts badly from a window that lacks it.
   For such a model every window, trained or scored, starts with that token
   as context: a window is then the token and ``window - 1`` tokens of the
   stream, and every stream token in it is predicted. A tokenizer that adds
   no such token (SmolLM2's) gets windows of the stream alone, as above.

:class:`TextBatchStream` serves the training windows the way
:class:`~bsi.data.BatchStream` serves examples: endless, in an order fixed by
its seed, resumable from its ``state_dict``, as batches with the same keys
(``input_ids``, ``attention_mask``, ``labels``) whose labels equal the input
ids. bsi's answer-token loss (:class:`bsi.pipeline.losses.AnswerTokenLoss`)
scores every position whose next label is not -100, so on these batches it
*is* the mean next-token loss over every token of a window after its first,
and every loss, curvature source and training loop of bsi works on text
unchanged.

Reading (:func:`read_text_corpus`) needs no tokenizer and checks the files
(missing, empty, binary, not UTF-8, no text field, no ``.txt`` in a folder),
so bad input is refused before a model is loaded; :func:`tokenize_corpus`
checks the window against the model's context before it tokenizes.

>>> task = load_text_task("wikitext-2", tokenizer, window=512)  # doctest: +SKIP
>>> task.train_windows.shape      # (W, 512) windows of valid.txt
>>> stream = TextBatchStream(task.train_windows, batch_size=8, seed=0)  # doctest: +SKIP
>>> next(stream)["input_ids"].shape   # (8, 512)
"""

from __future__ import annotations

import hashlib
import importlib.resources
import itertools
import math
import random
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from bsi.config import PipelineConfig
from bsi.data.batches import epoch_permutation
from bsi.data.tasks import _bounded_lines
from bsi.errors import BSIError
from bsi.files import json_object

WIKITEXT_2 = "wikitext-2"
"""Spec of the packaged text task: WikiText-2's validation (trains) and test (held out) splits."""

WIKITEXT_2_RELEASE = "WikiText-2, tokenized release: word-level, rare words as <unk>; not raw"
"""What the packaged WikiText-2 is, in one line: printed beside every perplexity measured on it."""

DEFAULT_WINDOW = 512
"""Tokens per window when none is given."""

DEFAULT_HELD_OUT_FRACTION = 0.1
"""Share of a text's tokens held out when its source states no held-out part."""

DEFAULT_TEXT_FIELD = "text"
"""JSON field (or hub column) that holds the text by default."""

EOS_SEPARATOR = "eos"
"""The ``separator`` value that joins documents with the tokenizer's end-of-sequence token (the default)."""

_BINARY_PROBE_BYTES = 8192  # a JSONL file's first bytes are searched for NUL bytes before parsing


def wikitext_2_folder() -> Path:
    """The folder of the packaged WikiText-2 (``valid.txt``, ``test.txt`` and ``LICENSE.md``).

    It lives inside the installed package (``bsi/data/wikitext-2/``), in a
    wheel as in an editable install.
    """
    return Path(str(importlib.resources.files("bsi.data") / "wikitext-2"))


# ----------------------------------------------------------------------------- reading text


@dataclass(frozen=True)
class TextCorpus:
    """Text as read from its source, before tokenization: the documents of each part.

    Attributes:
        name: short name of the source: ``"wikitext-2"``, a file or folder
            name, a hub id.
        release: one line saying what the text is (for WikiText-2,
            :data:`WIKITEXT_2_RELEASE`); printed beside every perplexity.
        train_documents: the documents of the training part, or of the whole
            text when the source states no held-out part.
        held_out_documents: the documents of the held-out part when the
            source states one (WikiText-2's ``test.txt``, a hub dataset's
            test split); ``None``: :func:`tokenize_corpus` cuts a held-out
            tail off the text.
        train_part, held_out_part: names of the stated parts (``"valid.txt"``,
            ``"test.txt"``); empty when the held-out part is a tail.
    """

    name: str
    release: str
    train_documents: tuple[str, ...]
    held_out_documents: tuple[str, ...] | None = None
    train_part: str = ""
    held_out_part: str = ""


def read_text_corpus(spec: str = WIKITEXT_2, *, text_field: str = DEFAULT_TEXT_FIELD) -> TextCorpus:
    """Read a text source (see the module docstring for the kinds of ``spec``), checking it as it goes.

    Args:
        spec: ``"wikitext-2"``, a text file, a folder of ``.txt`` files, a
            ``.jsonl`` file or a ``datasets`` hub id (``"name:config"`` picks
            a config).
        text_field: the JSON field (or hub column) that holds the text.

    Raises:
        BSIError: one line saying what to change: a missing path, an empty
            or binary file, a file that is not UTF-8, a JSONL line without
            ``text_field``, a folder without ``.txt`` files, a hub id that
            cannot be loaded (for instance offline).
    """
    if spec == WIKITEXT_2:
        folder = wikitext_2_folder()
        missing = [name for name in ("valid.txt", "test.txt") if not (folder / name).is_file()]
        if missing:
            raise BSIError(f"the packaged WikiText-2 lacks {', '.join(missing)} in {folder}: reinstall bsi")
        return TextCorpus(
            name=WIKITEXT_2,
            release=WIKITEXT_2_RELEASE,
            train_documents=(_read_text_file(folder / "valid.txt"),),
            held_out_documents=(_read_text_file(folder / "test.txt"),),
            train_part="valid.txt",
            held_out_part="test.txt",
        )
    path = Path(spec).expanduser()
    if path.is_dir():
        return _read_folder(path)
    if path.is_file():
        if path.suffix.lower() == ".jsonl":
            documents = _read_jsonl_documents(path, text_field)
            return TextCorpus(name=path.name, release=f"{len(documents)} JSONL documents (field '{text_field}')",
                              train_documents=tuple(documents))
        text = _read_text_file(path)
        if not text.strip():
            raise BSIError(f"text file '{path}' holds only white space: give a file with text")
        return TextCorpus(name=path.name, release="plain text, 1 document", train_documents=(text,))
    if path.suffix.lower() in (".txt", ".jsonl", ".json") or spec.startswith((".", "~", "/")) or spec.count("/") > 1:
        raise BSIError(f"text data '{spec}' does not exist")  # a path, not a hub id ("owner/name")
    return _read_hub_corpus(spec, text_field)


def looks_like_text(spec: str, text_field: str = DEFAULT_TEXT_FIELD, question_field: str = "question") -> bool:
    """Whether a data spec names text (a text task) rather than question/answer examples.

    True for ``"wikitext-2"``, a folder, a ``.txt`` path, an existing file
    that is not ``.jsonl``, and a ``.jsonl`` file whose first record has
    ``text_field`` but not ``question_field``. False otherwise, hub ids
    included: their kind cannot be told without loading them.
    """
    if spec == WIKITEXT_2:
        return True
    path = Path(spec).expanduser()
    if path.is_dir() or path.suffix.lower() == ".txt":
        return True
    if not path.is_file():
        return False
    if path.suffix.lower() != ".jsonl":
        return True
    record = _first_record(path)
    return record is not None and text_field in record and question_field not in record


def _first_record(path: Path) -> dict[str, Any] | None:
    """The first JSON object of a JSONL file, or None when its first non-blank line is not one."""
    with path.open("rb") as handle:
        for raw in handle:
            if raw.strip():
                try:
                    return json_object(raw.decode("utf-8"), 1, path)
                except (BSIError, UnicodeDecodeError):
                    return None
    return None


def is_text_task(spec: str, kind: str = "auto", text_field: str = DEFAULT_TEXT_FIELD,
                 question_field: str = "question") -> bool:
    """Whether a run's data is a text task: ``kind`` ``"text"``/``"qa"`` says so, ``"auto"`` asks :func:`looks_like_text`.

    ``kind`` is :attr:`bsi.config.PipelineConfig.task`. Detection cannot tell
    a hub id's kind without loading it, so a hub text dataset needs
    ``kind="text"``.

    Raises:
        BSIError: in ``auto``, for a JSONL file whose first record has
            neither field (neither kind can read it), naming both flags.
    """
    if kind not in ("auto", "qa", "text"):
        raise BSIError(f"task must be one of auto, qa, text, got '{kind}'")
    if kind != "auto":
        return kind == "text"
    path = Path(spec).expanduser()
    record = _first_record(path) if path.suffix.lower() == ".jsonl" and path.is_file() else None
    if record is not None and text_field not in record and question_field not in record:
        have = ", ".join(repr(k) for k in record) or "none"
        raise BSIError(f"{path}, line 1: missing field '{question_field}' (a question/answer task), and no "
                       f"'{text_field}' (a text task) either (fields present: {have}); name yours with "
                       "--question-field/--answer-field, or with --text-field for a text")
    return looks_like_text(spec, text_field, question_field)


def is_text_run(config: PipelineConfig) -> bool:
    """Whether the run of ``config`` is a text task: :func:`is_text_task` asked with the run's data, kind and fields."""
    return is_text_task(config.data, config.task, config.text_field, config.question_field)


def _read_text_file(path: Path) -> str:
    """A file's text (UTF-8, a byte-order mark dropped), refusing empty, binary and non-UTF-8 files."""
    data = path.read_bytes()
    if not data:
        raise BSIError(f"text file '{path}' is empty: give a file that holds text")
    if b"\x00" in data:
        raise BSIError(f"'{path}' holds NUL bytes: it is a binary file, or text in an encoding other than UTF-8 "
                       "(such as UTF-16); give UTF-8 text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise BSIError(f"'{path}' is not UTF-8 text (byte {err.start} is not valid UTF-8): save it as UTF-8") from None


def _read_folder(path: Path) -> TextCorpus:
    """Every non-empty ``.txt`` file under ``path``, in path order, one document each."""
    files = sorted(p for p in path.rglob("*.txt") if p.is_file())
    if not files:
        raise BSIError(f"folder '{path}' holds no .txt files: put the text in .txt files (UTF-8), or give a file")
    documents = []
    for file in files:
        if file.stat().st_size == 0:
            continue
        text = _read_text_file(file)
        if text.strip():
            documents.append(text)
    if not documents:
        raise BSIError(f"folder '{path}' holds only empty .txt files: give text")
    return TextCorpus(name=path.name, release=f"{len(documents)} .txt files", train_documents=tuple(documents))


def _read_jsonl_documents(path: Path, text_field: str) -> list[str]:
    """The non-empty ``text_field`` of every line of a JSONL file, with one-line errors naming the line."""
    if path.stat().st_size == 0:
        raise BSIError(f"text file '{path}' is empty: give a file that holds text")
    documents = []
    with path.open("rb") as handle:
        if b"\x00" in handle.read(_BINARY_PROBE_BYTES):
            raise BSIError(f"'{path}' holds NUL bytes: it is a binary file, not UTF-8 JSON lines")
        handle.seek(0)
        for number, raw in enumerate(_bounded_lines(handle, path), start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise BSIError(f"{path}, line {number}: not UTF-8 text (byte {err.start}); save the file as UTF-8") from err
            if not line.strip():
                continue
            record = json_object(line, number, path)
            if text_field not in record:
                have = ", ".join(repr(k) for k in record) or "none"
                raise BSIError(f"{path}, line {number}: missing field '{text_field}' (fields present: {have}); "
                               "choose the field with --text-field")
            value = record[text_field]
            if not isinstance(value, str):
                raise BSIError(f"{path}, line {number}: field '{text_field}' must be a string, got {type(value).__name__}")
            if value.strip():
                documents.append(value)
    if not documents:
        raise BSIError(f"'{path}' holds no text: every '{text_field}' field is empty")
    return documents


def _read_hub_corpus(spec: str, text_field: str) -> TextCorpus:
    """A ``datasets`` hub dataset's text column (``name`` or ``name:config``); its test split is held out.

    When the hub cannot be reached (no connection within a few seconds), the
    spec is refused at once rather than after half a minute of retries; in
    offline mode (``HF_HUB_OFFLINE=1``) ``datasets`` reads its local cache.
    """
    import huggingface_hub

    from bsi.hub import hub_unreachable

    unreachable = None if huggingface_hub.is_offline_mode() else hub_unreachable()
    if unreachable:
        raise BSIError(f"unknown text data '{spec}': not '{WIKITEXT_2}', not a file or folder, and the Hugging Face hub "
                       f"cannot be reached ({unreachable}); give a local text, or set HF_HUB_OFFLINE=1 to read "
                       "the local datasets cache")
    import datasets  # lazy: importing datasets takes a second

    name, _, config = spec.partition(":")
    try:
        dataset = datasets.load_dataset(name, config or None)
    except Exception as err:  # datasets raises many types (network, file, value errors)
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise BSIError(f"unknown text data '{spec}': not '{WIKITEXT_2}', not a file or folder, and not loadable "
                       f"from the Hugging Face hub ({first})") from err
    splits = list(dataset)
    train_split = "train" if "train" in splits else splits[0]
    held_out_split = next((s for s in ("test", "validation") if s in splits and s != train_split), None)

    def documents(split: str) -> tuple[str, ...]:
        part = dataset[split]
        if text_field not in part.column_names:
            raise BSIError(f"dataset '{spec}' has no column '{text_field}' (columns: {', '.join(part.column_names)}); "
                           "choose it with --text-field")
        texts = tuple(t for t in part[text_field] if isinstance(t, str) and t.strip())
        if not texts:
            raise BSIError(f"dataset '{spec}': every '{text_field}' of its {split} split is empty")
        return texts

    held_out = documents(held_out_split) if held_out_split else None
    return TextCorpus(
        name=spec,
        release=f"hub dataset, column '{text_field}'",
        train_documents=documents(train_split),
        held_out_documents=held_out,
        train_part=f"{train_split} split" if held_out else "",
        held_out_part=f"{held_out_split} split" if held_out else "",
    )


# ----------------------------------------------------------------------------- tokens and windows


def check_window(window: int, context: int | None = None) -> None:
    """Refuse a window shorter than 2 tokens, or longer than the model's ``context`` (``max_position_embeddings``).

    Raises:
        BSIError: saying which ``--window`` to use instead.
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 2:
        raise BSIError(f"the window must be at least 2 tokens (one of context, one to predict), got {window}: raise --window")
    if context is not None and window > context:
        raise BSIError(f"a window of {window} tokens is longer than the model's context "
                       f"(max_position_embeddings {context}): use --window {context} or less")


def cut_windows(tokens: torch.Tensor, window: int) -> torch.Tensor:
    """Non-overlapping windows of ``window`` tokens from the start of ``tokens``; the shorter rest is left out.

    Args:
        tokens: ``(N,)`` token ids.

    Returns:
        ``(N // window, window)``, a view of ``tokens`` (no copy).
    """
    count = tokens.shape[0] // window
    return tokens[: count * window].view(count, window)  # (W, L)


def join_documents(documents: Sequence[Sequence[int]], separator: Sequence[int]) -> torch.Tensor:
    """One ``(N,)`` int64 stream: the documents' token ids, with ``separator``'s ids between two documents."""
    pieces: list[Sequence[int]] = []
    for index, ids in enumerate(documents):
        if index:
            pieces.append(separator)
        pieces.append(ids)
    return torch.tensor(list(itertools.chain.from_iterable(pieces)), dtype=torch.long)  # (N,)


def split_tail(tokens: torch.Tensor, fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(train, held_out)``: the last ``ceil(fraction * N)`` tokens of ``(N,)`` ``tokens`` are held out."""
    held = min(tokens.shape[0], math.ceil(fraction * tokens.shape[0] - 1e-9))  # 1e-9: 0.1 * 1000 is 100, not 101
    cut = tokens.shape[0] - held
    return tokens[:cut], tokens[cut:]


def _separator_ids(tokenizer: PreTrainedTokenizerBase, separator: str) -> tuple[list[int], str]:
    """The token ids put between two documents, and what they are in words."""
    if separator == EOS_SEPARATOR:
        if tokenizer.eos_token_id is None:
            raise BSIError("the tokenizer has no end-of-sequence token to put between documents: "
                           "choose a text separator such as '\\n\\n'")
        return [tokenizer.eos_token_id], f"the end-of-sequence token {tokenizer.eos_token!r}"
    if not isinstance(separator, str):
        raise BSIError(f"the separator must be '{EOS_SEPARATOR}' or a text, got {type(separator).__name__}")
    ids = _encode(tokenizer, [separator])[0] if separator else []
    return ids, (f"the text {separator!r}" if separator else "nothing")


def context_token(tokenizer: PreTrainedTokenizerBase) -> int | None:
    """The token every window starts from: the tokenizer's BOS when it puts one before every text, else None.

    Asked of the tokenizer itself (does encoding a text start with its
    ``bos_token_id``?), since the flags for it differ between tokenizers:
    Gemma's adds ``<bos>``, SmolLM2's adds nothing.
    """
    bos = tokenizer.bos_token_id
    ids = tokenizer("a", return_attention_mask=False)["input_ids"]
    return int(bos) if bos is not None and len(ids) > 0 and ids[0] == bos else None


class _StreamMemo:
    """The last few token streams :func:`tokenize_corpus` made, by tokenizer and text (a bounded memo, thread-safe).

    Tokenizing WikiText-2's parts takes seconds on one core, and every run of
    a text task tokenizes them again (each cell of a sweep, a dashboard run
    after another, a test after another). A stream is the same for the same
    tokenizer state (its full serialisation) and the same documents, so a run
    in the same process after the first reads a copy of the first's tensor.
    Slow (pure Python) tokenizers have no serialisation to compare and are
    never memoised.
    """

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._streams: OrderedDict[tuple[str, str, tuple[int, ...]], torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(tokenizer: PreTrainedTokenizerBase, documents: Sequence[str],
            separator: Sequence[int]) -> tuple[str, str, tuple[int, ...]] | None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            return None
        text = hashlib.sha256()
        for document in documents:
            text.update(hashlib.sha256(document.encode("utf-8", "surrogatepass")).digest())
        return hashlib.sha256(backend.to_str().encode()).hexdigest(), text.hexdigest(), tuple(separator)

    def tokens(self, tokenizer: PreTrainedTokenizerBase, documents: Sequence[str],
               separator: Sequence[int]) -> torch.Tensor:
        """:func:`join_documents` of the documents' tokens: ``(N,)`` int64, a copy the caller owns."""
        key = self.key(tokenizer, documents, separator)
        if key is not None:
            with self._lock:
                found = self._streams.get(key)
                if found is not None:
                    self._streams.move_to_end(key)
                    return found.clone()
        stream = join_documents(_encode(tokenizer, documents), separator)  # (N,)
        if key is not None:
            with self._lock:
                self._streams[key] = stream.clone()
                while len(self._streams) > self.size:
                    self._streams.popitem(last=False)
        return stream


_MEMO = _StreamMemo()


def _encode(tokenizer: PreTrainedTokenizerBase, documents: Sequence[str]) -> list[list[int]]:
    """Token ids of each document, without special tokens (and without the long-sequence warning)."""
    ids: list[list[int]] = tokenizer(list(documents), add_special_tokens=False, return_attention_mask=False,
                                     verbose=False)["input_ids"]
    return ids


@dataclass(frozen=True, eq=False)
class TextTask:
    """A text task, tokenized: its two token streams and the protocol that made them.

    Attributes:
        name: the source's short name (``"wikitext-2"``, a file name, ...).
        release: what the text is, in one line (:attr:`TextCorpus.release`).
        train_part: which text trains, in words (``"valid.txt"``, ``"all but
            the last 10% of the tokens"``).
        held_out_part: which text is held out and scored (``"test.txt"``,
            ``"the last 10% of the tokens"``).
        separator: what stands between two documents, in words (``"none (one
            document per part)"`` when there is nothing to separate).
        window: tokens per training window.
        train_tokens: ``(N,)`` int64, the training part as one stream.
        held_out_tokens: ``(M,)`` int64, the held-out part as one stream.
        context_token: the token each window starts from as context
            (:func:`context_token`), or None: windows of the stream alone.
    """

    name: str
    release: str
    train_part: str
    held_out_part: str
    separator: str
    window: int
    train_tokens: torch.Tensor  # (N,)
    held_out_tokens: torch.Tensor  # (M,)
    context_token: int | None = None

    @property
    def train_windows(self) -> torch.Tensor:
        """``(W, window)``: the training part cut into non-overlapping windows (:func:`cut_windows`).

        With a :attr:`context_token`, each window is that token and the next
        ``window - 1`` tokens of the stream.
        """
        if self.context_token is None:
            return cut_windows(self.train_tokens, self.window)
        pieces = cut_windows(self.train_tokens, self.window - 1)  # (W, window - 1)
        return torch.cat([torch.full((pieces.shape[0], 1), self.context_token, dtype=pieces.dtype), pieces], dim=1)

    @property
    def held_out_source(self) -> str:
        """What perplexity on this task scores, in words: ``"wikitext-2: test.txt (WikiText-2, tokenized ...)"``."""
        return f"{self.name}: {self.held_out_part} ({self.release})"

    def describe(self) -> dict[str, Any]:
        """The task's protocol as plain values (JSON-serialisable, no tensors), e.g. for ``summary.json``."""
        return {
            "name": self.name, "release": self.release, "train_part": self.train_part,
            "held_out_part": self.held_out_part, "separator": self.separator, "window": self.window,
            "train_tokens": int(self.train_tokens.shape[0]), "train_windows": int(self.train_windows.shape[0]),
            "held_out_tokens": int(self.held_out_tokens.shape[0]),
            **({"context_token": self.context_token} if self.context_token is not None else {}),
        }


def tokenize_corpus(
    corpus: TextCorpus,
    tokenizer: PreTrainedTokenizerBase,
    *,
    window: int = DEFAULT_WINDOW,
    held_out_fraction: float = DEFAULT_HELD_OUT_FRACTION,
    seed: int = 0,
    separator: str = EOS_SEPARATOR,
    max_context: int | None = None,
) -> TextTask:
    """Tokenize a corpus once and split it into its training and held-out streams (the module's steps 1-4).

    The same documents through the same (fast) tokenizer again in the same
    process read a copy of the streams made the first time (:class:`_StreamMemo`).

    Args:
        window: tokens per training window, at least 2 and at most
            ``max_context``.
        held_out_fraction: in (0, 1]; the share of the tokens held out when
            the corpus states no held-out part (ignored otherwise).
        seed: order of the documents before a held-out tail is cut.
        separator: :data:`EOS_SEPARATOR` or a text put between documents.
        max_context: the model's context (``max_position_embeddings``), or
            ``None`` not to check it.

    Raises:
        BSIError: a bad window or fraction (before anything is tokenized); a
            text shorter than one window; a held-out part shorter than one
            window; a training part shorter than one window (unless
            everything is held out).
    """
    check_window(window, max_context)
    if not 0 < held_out_fraction <= 1:
        raise BSIError(f"the held-out fraction must be in (0, 1], got {held_out_fraction}: use --held-out-fraction 0.1, say")
    separator_ids, separator_words = _separator_ids(tokenizer, separator)
    if max(len(corpus.train_documents), len(corpus.held_out_documents or ())) == 1:
        separator_words = "none (one document per part)"

    if corpus.held_out_documents is not None:
        train = _MEMO.tokens(tokenizer, corpus.train_documents, separator_ids)
        held_out = _MEMO.tokens(tokenizer, corpus.held_out_documents, separator_ids)
        train_part, held_out_part = corpus.train_part, corpus.held_out_part
        _check_part_length(corpus.name, f"training part ({train_part})", train, window)
    else:
        documents = list(corpus.train_documents)
        random.Random(seed).shuffle(documents)
        stream = _MEMO.tokens(tokenizer, documents, separator_ids)
        if stream.shape[0] < window:
            raise BSIError(f"{corpus.name} holds {stream.shape[0]:,} tokens, fewer than one window of {window}: "
                           "lower --window, or give more text")
        train, held_out = split_tail(stream, held_out_fraction)
        share = f"{100 * held_out_fraction:g}%"
        order = f", documents in seeded order (seed {seed})" if len(documents) > 1 else ""
        train_part = f"all but the last {share} of its tokens{order}" if train.shape[0] else "none"
        held_out_part = f"the last {share} of its tokens{order}" if held_out_fraction < 1 else f"all of it{order}"
        if train.shape[0]:
            _check_part_length(corpus.name, f"training part ({train_part})", train, window,
                               hint="lower --window or --held-out-fraction")
    _check_part_length(corpus.name, f"held-out part ({held_out_part})", held_out, window,
                       hint="lower --window or raise --held-out-fraction")
    return TextTask(name=corpus.name, release=corpus.release, train_part=train_part, held_out_part=held_out_part,
                    separator=separator_words, window=window, train_tokens=train, held_out_tokens=held_out,
                    context_token=context_token(tokenizer))


def _check_part_length(name: str, part: str, tokens: torch.Tensor, window: int,
                       hint: str = "lower --window") -> None:
    if tokens.shape[0] < window:
        raise BSIError(f"the {part} of {name} holds {tokens.shape[0]:,} tokens, fewer than one window of {window}: {hint}")


def load_text_task(
    spec: str,
    tokenizer: PreTrainedTokenizerBase,
    *,
    window: int = DEFAULT_WINDOW,
    held_out_fraction: float = DEFAULT_HELD_OUT_FRACTION,
    seed: int = 0,
    text_field: str = DEFAULT_TEXT_FIELD,
    separator: str = EOS_SEPARATOR,
    max_context: int | None = None,
) -> TextTask:
    """:func:`read_text_corpus` then :func:`tokenize_corpus`: a text task from a spec, in one call.

    The window (and ``held_out_fraction``) are checked first, then the text
    is read and checked, then tokenized; see those two functions for the
    arguments and the errors.
    """
    check_window(window, max_context)
    if not 0 < held_out_fraction <= 1:
        raise BSIError(f"the held-out fraction must be in (0, 1], got {held_out_fraction}: use --held-out-fraction 0.1, say")
    corpus = read_text_corpus(spec, text_field=text_field)
    return tokenize_corpus(corpus, tokenizer, window=window, held_out_fraction=held_out_fraction, seed=seed,
                           separator=separator, max_context=max_context)


def set_aside_windows(windows: torch.Tensor, validation: int = 0, cap: int | None = None,
                      name: str = "the text") -> tuple[torch.Tensor, torch.Tensor]:
    """``(train, validation)`` windows: the last ``validation`` windows are set aside, the first ``cap`` of the rest train.

    The validation windows come from the *training* part (its end), never
    from the held-out part, so choosing anything by their loss leaves the
    perplexity untouched.

    Args:
        windows: ``(W, L)`` training windows (:attr:`TextTask.train_windows`).
        validation: windows set aside (0: none).
        cap: most windows that train (``None``: all that are left).

    Returns:
        ``(W', L)`` and ``(validation, L)``, views of ``windows``.

    Raises:
        BSIError: when no training window would be left.
    """
    count = windows.shape[0]
    if validation >= count:
        raise BSIError(f"the training part of {name} has {count:,} windows of {windows.shape[1]} tokens, too few to set "
                       f"{validation:,} aside for validation: lower --validation-size (or --window)")
    train = windows[: count - validation]  # (W - V, L)
    return (train if cap is None else train[:cap]), windows[count - validation :]


# ----------------------------------------------------------------------------- training batches


class TextBatchStream:
    """An endless, reproducible stream of mini-batches of training windows.

    The counterpart of :class:`~bsi.data.BatchStream` for text: each epoch
    visits the windows in a fresh random order drawn from ``(seed, epoch)``
    alone (:func:`~bsi.data.batches.epoch_permutation`), so the whole
    sequence of batches is fixed by the seed; ``state_dict()`` records where
    the stream is and ``load_state_dict()`` on a new stream over the same
    windows continues with exactly the batches the old one would have
    served. An epoch has ``steps_per_epoch`` full batches; windows that do
    not fill a last batch sit that epoch out.

    Each batch is a dict of ``(B, L)`` int64 tensors: ``input_ids`` (the
    windows), ``attention_mask`` (all ones: windows are never padded) and
    ``labels`` (equal to ``input_ids``), so a loss over every position whose
    next label is not -100 is the mean next-token loss of the windows.

    Args:
        windows: ``(W, L)`` token windows, e.g. :attr:`TextTask.train_windows`.
        batch_size: windows per batch (fewer when there are fewer windows).
        seed: fixes the order.
    """

    def __init__(self, windows: torch.Tensor, batch_size: int = 8, seed: int = 0) -> None:
        if windows.dim() != 2:
            raise BSIError(f"training windows must be a (W, L) tensor, got shape {tuple(windows.shape)}")
        if windows.shape[0] == 0:
            raise BSIError("no training windows: the training part of the text is shorter than one window; "
                           "lower --window, or hold out less of the text")
        if batch_size < 1:
            raise BSIError(f"batch_size must be >= 1, got {batch_size}")
        self.windows = windows.long()  # (W, L)
        self.batch_size = batch_size
        self.window = int(windows.shape[1])
        self.seed = seed
        self.epoch = 0
        self.position = 0  # index of the next batch within the epoch
        self._order = epoch_permutation(self.windows.shape[0], self.seed, self.epoch)

    @property
    def steps_per_epoch(self) -> int:
        """Batches per epoch (at least 1, a short batch when there are fewer windows than ``batch_size``)."""
        return max(1, self.windows.shape[0] // self.batch_size)

    def __iter__(self) -> TextBatchStream:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if self.position >= self.steps_per_epoch:
            self.epoch, self.position = self.epoch + 1, 0
            self._order = epoch_permutation(self.windows.shape[0], self.seed, self.epoch)
        start = self.position * self.batch_size
        chosen = torch.tensor(self._order[start : start + self.batch_size], dtype=torch.long)
        self.position += 1
        input_ids = self.windows[chosen]  # (B, L), a copy
        return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": input_ids.clone()}

    def state_dict(self) -> dict[str, int]:
        """Where the stream stands: ``{"epoch", "position", "seed"}``."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a :meth:`state_dict` (of a stream over the same windows)."""
        self.seed, self.epoch, self.position = int(state["seed"]), int(state["epoch"]), int(state["position"])
        self._order = epoch_permutation(self.windows.shape[0], self.seed, self.epoch)
