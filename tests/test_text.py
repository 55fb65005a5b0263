"""Text tasks: the packaged WikiText-2, reading and tokenizing your own text, and the training-window stream."""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bsi.data import (
    WIKITEXT_2,
    TextBatchStream,
    cut_windows,
    join_documents,
    load_text_task,
    looks_like_text,
    read_text_corpus,
    split_tail,
    tokenize_corpus,
    wikitext_2_folder,
)
from bsi.errors import BSIError
from bsi.models import build_tiny_model, build_tiny_tokenizer
from bsi.pipeline.losses import answer_token_loss

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny():
    """The tiny random Llama (vocabulary 259, context 512) and its byte-level tokenizer."""
    return build_tiny_model()


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def wikitext(tokenizer):
    """The packaged WikiText-2 with the byte-level tokenizer (one token per byte), windows of 64."""
    return load_text_task(WIKITEXT_2, tokenizer, window=64)


def _stream(length: int, seed: int = 0, vocab: int = 259) -> torch.Tensor:
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------ the packaged WikiText-2


def test_packaged_wikitext_2_is_the_recorded_files_with_its_licence_beside_them():
    folder = wikitext_2_folder()
    licence = (folder / "LICENSE.md").read_text(encoding="utf-8")
    for phrase in ("CC BY-SA 3.0", "creativecommons.org/licenses/by-sa/3.0", "Merity", "pytorch/examples",
                   "77f55b912142e11fcfdf5b530231fb9c52f181e8", "tokenized", "`raw`"):
        assert phrase in licence, phrase
    recorded = dict(re.findall(r"\| `(\w+\.txt)` \| \w+ \| \d+ \| `([0-9a-f]{64})` \|", licence))
    assert set(recorded) == {"valid.txt", "test.txt"}
    for name, digest in recorded.items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, f"{name} differs from its source"


def test_wikitext_2_trains_on_valid_and_holds_out_test(wikitext, tokenizer):
    folder = wikitext_2_folder()
    corpus = read_text_corpus(WIKITEXT_2)
    assert (corpus.train_part, corpus.held_out_part) == ("valid.txt", "test.txt")
    assert corpus.train_documents == ((folder / "valid.txt").read_text(encoding="utf-8"),)
    assert "tokenized" in corpus.release and "not raw" in corpus.release and "<unk>" in corpus.release
    # the byte-level tokenizer makes one token per byte: each split is tokenized whole, once
    assert wikitext.train_tokens.shape[0] == (folder / "valid.txt").stat().st_size
    assert wikitext.held_out_tokens.shape[0] == (folder / "test.txt").stat().st_size
    windows = wikitext.train_windows
    assert windows.shape == (wikitext.train_tokens.shape[0] // 64, 64)
    assert torch.equal(windows[3], wikitext.train_tokens[3 * 64 : 4 * 64])
    text = (folder / "valid.txt").read_bytes()
    assert tokenizer.decode(windows[0]).encode("utf-8") == text[:64]
    assert wikitext.held_out_source.startswith("wikitext-2: test.txt (WikiText-2, tokenized release")
    assert wikitext.separator == "none (one document per part)"
    described = wikitext.describe()
    assert json.loads(json.dumps(described)) == described and described["train_windows"] == windows.shape[0]


def test_the_wheel_ships_wikitext_2_and_its_licence(tmp_path, monkeypatch):
    build_meta = pytest.importorskip("setuptools.build_meta")
    source = tmp_path / "src"
    shutil.copytree(ROOT / "bsi", source / "bsi", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    monkeypatch.chdir(source)
    with warnings.catch_warnings():  # setuptools' notes about pyproject fields, not about the data files
        warnings.simplefilter("ignore")
        wheel = tmp_path / "dist" / build_meta.build_wheel(str(tmp_path / "dist"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("valid.txt", "test.txt", "LICENSE.md"):
        assert f"bsi/data/wikitext-2/{name}" in names


# ------------------------------------------------------------------ your own text


def test_tokenizing_the_same_text_again_reads_a_copy_of_the_first_streams(tokenizer):
    """The stream memo: equal streams for the same tokenizer and text, each a copy, and none across tokenizers."""
    from bsi.data.text import _encode, _StreamMemo

    memo, documents = _StreamMemo(size=2), ["one text", "and another"]
    first = memo.tokens(tokenizer, documents, [tokenizer.eos_token_id])
    assert torch.equal(first, join_documents(_encode(tokenizer, documents), [tokenizer.eos_token_id]))
    first.zero_()  # the caller owns its copy: the memo's stream is untouched
    again = memo.tokens(tokenizer, documents, [tokenizer.eos_token_id])
    assert int(again.count_nonzero()) > 0 and again.data_ptr() != first.data_ptr()
    assert memo.key(tokenizer, documents, [1]) != memo.key(tokenizer, documents, [2])  # the separator is in the key
    assert memo.key(tokenizer, documents, [1]) != memo.key(tokenizer, ["one text", "and another!"], [1])
    other = build_tiny_tokenizer()
    other.add_tokens(["and another"])  # another tokenizer state: tokenized anew, not read from the memo
    assert memo.key(other, documents, [1]) != memo.key(tokenizer, documents, [1])
    assert memo.tokens(other, documents, [tokenizer.eos_token_id]).shape[0] < again.shape[0]  # its new token joins bytes
    for n in range(3):  # bounded: the oldest stream goes first
        memo.tokens(tokenizer, [f"text {n}"], [])
    assert len(memo._streams) == 2


def test_a_text_file_holds_out_its_tail(tmp_path, tokenizer):
    path = tmp_path / "notes.txt"
    path.write_text("The quick brown fox jumps over the lazy dog. " * 30, encoding="utf-8")
    task = load_text_task(str(path), tokenizer, window=32, held_out_fraction=0.1)
    stream = torch.tensor(tokenizer(path.read_text(), add_special_tokens=False)["input_ids"])
    held = math.ceil(0.1 * stream.shape[0])
    assert torch.equal(task.held_out_tokens, stream[-held:]) and torch.equal(task.train_tokens, stream[:-held])
    assert task.held_out_part == "the last 10% of its tokens" and task.name == "notes.txt"
    whole = load_text_task(str(path), tokenizer, window=32, held_out_fraction=1)
    assert torch.equal(whole.held_out_tokens, stream) and whole.train_windows.shape == (0, 32)
    with pytest.raises(BSIError, match="no training windows"):
        TextBatchStream(whole.train_windows)


def test_a_folder_is_one_document_per_txt_file_joined_by_the_separator_in_seeded_order(tmp_path, tokenizer):
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    texts = {"a.txt": "alpha " * 20, "b.txt": "bravo " * 20, "sub/c.txt": "charlie " * 20}
    for name, text in texts.items():
        (folder / name).write_text(text, encoding="utf-8")
    (folder / "empty.txt").write_bytes(b"")
    (folder / "notes.md").write_text("not a .txt file: left out", encoding="utf-8")
    corpus = read_text_corpus(str(folder))
    assert sorted(corpus.train_documents) == sorted(texts.values()) and corpus.held_out_documents is None
    orders = {}
    for seed in range(6):
        task = tokenize_corpus(corpus, tokenizer, window=16, held_out_fraction=0.5, seed=seed)
        stream = torch.cat([task.train_tokens, task.held_out_tokens])
        eos = tokenizer.eos_token_id
        assert int((stream == eos).sum()) == len(texts) - 1  # a separator between two documents, none around
        pieces = [tokenizer.decode(p) for p in torch.tensor_split(stream, torch.nonzero(stream == eos)[:, 0].tolist())]
        documents = [p.removeprefix(tokenizer.eos_token) for p in pieces]
        assert sorted(documents) == sorted(texts.values())  # every document whole, in some order
        orders[seed] = documents
        assert task.separator == f"the end-of-sequence token {tokenizer.eos_token!r}"
        assert "seeded order (seed" in task.held_out_part
    again = tokenize_corpus(corpus, tokenizer, window=16, held_out_fraction=0.5, seed=2)
    assert tokenizer.decode(torch.cat([again.train_tokens, again.held_out_tokens])).split(tokenizer.eos_token) == orders[2]
    assert len({tuple(order) for order in orders.values()}) > 1  # the seed changes the order


def test_a_jsonl_file_reads_its_text_field_and_a_text_separator_joins_documents(tmp_path, tokenizer):
    path = tmp_path / "docs.jsonl"
    records = [{"body": "first document. " * 5, "id": 1}, {"body": ""}, {"body": "second document. " * 5}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + "\n", encoding="utf-8")
    corpus = read_text_corpus(str(path), text_field="body")
    assert corpus.train_documents == (records[0]["body"], records[2]["body"])  # the empty text is skipped
    task = tokenize_corpus(corpus, tokenizer, window=8, held_out_fraction=1, separator="\n\n")
    assert tokenizer.decode(task.held_out_tokens) in (records[0]["body"] + "\n\n" + records[2]["body"],
                                                      records[2]["body"] + "\n\n" + records[0]["body"])
    assert task.separator == "the text '\\n\\n'"


def test_which_specs_look_like_text(tmp_path):
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n", encoding="utf-8")
    text = tmp_path / "text.jsonl"
    text.write_text(json.dumps({"text": "some text"}) + "\n", encoding="utf-8")
    assert looks_like_text(WIKITEXT_2) and looks_like_text(str(tmp_path)) and looks_like_text("missing.txt")
    assert looks_like_text(str(text)) and not looks_like_text(str(qa))
    assert not looks_like_text("embedded-math") and not looks_like_text("openai/gsm8k")


def test_split_tail_and_cut_windows_are_exact():
    tokens = torch.arange(1000)
    train, held = split_tail(tokens, 0.1)
    assert held.shape[0] == 100 and torch.equal(torch.cat([train, held]), tokens)  # 0.1 * 1000 is 100, not 101
    assert split_tail(torch.arange(7), 0.1)[1].tolist() == [6]  # rounded up: at least one token
    windows = cut_windows(torch.arange(10), 4)
    assert windows.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]


# ------------------------------------------------------------------ the training batch stream


def _take(stream, n: int) -> list[torch.Tensor]:
    return [next(stream)["input_ids"] for _ in range(n)]


def test_text_batches_have_the_keys_of_the_task_batches_and_labels_equal_to_inputs(wikitext):
    batch = next(TextBatchStream(wikitext.train_windows, batch_size=4, seed=0))
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert batch["input_ids"].shape == (4, 64) and batch["input_ids"].dtype == torch.long
    assert torch.equal(batch["labels"], batch["input_ids"]) and bool((batch["attention_mask"] == 1).all())
    rows = {tuple(w.tolist()) for w in wikitext.train_windows[:]}
    assert all(tuple(row.tolist()) in rows for row in batch["input_ids"])


def test_the_answer_token_loss_on_text_batches_is_the_mean_next_token_loss(tiny):
    model, _ = tiny
    batch = next(TextBatchStream(cut_windows(_stream(5 * 20, seed=9), 20), batch_size=5, seed=1))
    with torch.no_grad():
        loss = answer_token_loss(model, batch)
        logits = model(input_ids=batch["input_ids"]).logits[:, :-1]  # (B, L-1, V)
        expected = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["input_ids"][:, 1:].reshape(-1))
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)


def test_the_text_batch_stream_is_reproducible_resumable_and_visits_every_window_each_epoch():
    windows = cut_windows(torch.arange(12 * 8), 8)  # 12 distinct windows, 3 batches of 4 an epoch
    batches = _take(TextBatchStream(windows, batch_size=4, seed=5), 10)
    assert all(torch.equal(a, b) for a, b in zip(batches, _take(TextBatchStream(windows, batch_size=4, seed=5), 10)))
    assert not all(torch.equal(a, b) for a, b in zip(batches, _take(TextBatchStream(windows, batch_size=4, seed=6), 10)))
    for epoch in range(3):
        firsts = torch.cat(batches[3 * epoch : 3 * epoch + 3])[:, 0].tolist()
        assert sorted(firsts) == list(range(0, 96, 8))  # each window once per epoch
    stream = TextBatchStream(windows, batch_size=4, seed=2)
    _take(stream, 4)
    state = stream.state_dict()
    expected = _take(stream, 5)
    resumed = TextBatchStream(windows, batch_size=4, seed=99)
    resumed.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(expected, _take(resumed, 5)))
    with pytest.raises(BSIError, match="batch_size"):
        TextBatchStream(windows, batch_size=0)




def test_an_unreachable_hub_dataset_is_one_line_at_once():
    """With no connection to the hub (CI), the spec is refused after one short probe, not after retries."""
    with pytest.raises(BSIError, match=r"^unknown text data 'nobody/no-such-text': not 'wikitext-2'") as caught:
        read_text_corpus("nobody/no-such-text")
    assert "\n" not in str(caught.value)
