"""Reliability points not covered elsewhere: app upload messages, no unpickling, same seed same result.

* The dashboard's JSONL upload: every bad file gives one line starting with
  ``Error:`` that names the file (never the server's temporary path) and
  says what is wrong.
* Loading never unpickles: a folder whose weights are a pickle (a ``.bin``
  that would run code when unpickled) is refused with a clear message and
  the pickle's payload never runs; a pickle next to good safetensors is
  ignored.
* Same seed, same result on CPU: two smoke runs of the whole pipeline agree
  to the bit (ranks, metrics, per-round losses, final weights).
"""

from __future__ import annotations

import json
import pathlib
import pickle
import re

import pytest
import torch

from bsi.app import form as app_form
from bsi.config import make_config
from bsi.errors import BSIError
from bsi.models import TINY_MODEL, load_model_and_tokenizer
from bsi.pipeline.runner import Pipeline
from bsi.reports import DoneReport

GOOD = b'{"question": "What is 1 + 1?", "answer": "1 + 1 = 2\\n#### 2"}\n'

UPLOADS = [
    # (file name, bytes, words the message must contain)
    ("empty.jsonl", b"", "no examples"),
    ("blank.jsonl", b"\n\n  \n", "no examples"),
    ("latin1.jsonl", GOOD + b'{"question": "caf\xe9", "answer": "#### 1"}\n', "UTF-8"),
    ("broken.jsonl", GOOD * 2 + b'{"question": "x", \n', "line 3: malformed JSON"),
    ("fields.jsonl", b'{"prompt": "x", "answer": "#### 1"}\n', "missing field 'question'"),
    ("number.jsonl", b'{"question": 5, "answer": "#### 5"}\n', "question"),
    ("array.jsonl", b'[1, 2]\n', "line 1"),
    ("huge-line.jsonl", GOOD + b'{"question": "' + b"a" * 10_000_000 + b'"}\n', "line 2"),
    ("data.csv", b"question,answer\n1+1,2\n", "not a .jsonl file"),
]


@pytest.mark.parametrize("name,data,words", UPLOADS, ids=[u[0] for u in UPLOADS])
def test_app_upload_messages(name, data, words, tmp_path):
    upload = tmp_path / "gradio-tmp-3f9a" / name
    upload.parent.mkdir()
    upload.write_bytes(data)
    message = app_form.upload_message(str(upload))
    assert message.startswith("Error: ") and "\n" not in message and len(message) < 300, message
    assert words in message and name in message, message
    assert str(upload.parent) not in message  # the server's temporary folder stays private
    form = app_form.Form.for_preset("smoke")
    form.data_source, form.data_file = "upload", str(upload)
    with pytest.raises(BSIError, match=re.escape(words)):
        app_form.build_config(form)  # Start refuses it too, before taking the board


def test_app_upload_size_limit_and_good_file(tmp_path, monkeypatch):
    good = tmp_path / "Good.JSONL"
    good.write_bytes(GOOD * 3)
    assert app_form.upload_message(str(good)) == "OK: 3 examples in Good.JSONL"
    assert app_form.upload_message(None) == ""
    monkeypatch.setattr(app_form, "MAX_UPLOAD_BYTES", len(GOOD) * 2)
    message = app_form.upload_message(str(good))
    assert message.startswith("Error: ") and "Good.JSONL" in message and "the limit is" in message


# ------------------------------------------------------------------ no unpickling
class _Payload:
    """Unpickling this creates the marker file: proof that a pickle was loaded."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (self.marker,)


def _plant_pickle(folder: pathlib.Path, name: str, marker: pathlib.Path) -> None:
    (folder / name).write_bytes(pickle.dumps({"model.embed_tokens.weight": _Payload(marker)}))


@pytest.fixture(scope="module")
def tiny():
    return load_model_and_tokenizer(TINY_MODEL)


def test_pickled_weights_are_refused_never_loaded(tmp_path, tiny):
    model, tokenizer = tiny
    marker = tmp_path / "payload-ran"
    plain = tmp_path / "plain"
    model.save_pretrained(plain)
    tokenizer.save_pretrained(plain)
    (plain / "model.safetensors").unlink()
    _plant_pickle(plain, "pytorch_model.bin", marker)
    with pytest.raises(BSIError, match=r"no \.safetensors weights \(it holds pytorch_model\.bin: pickled"):
        load_model_and_tokenizer(str(plain))
    assert not marker.exists()

    # a pickle next to good safetensors is never read
    beside = tmp_path / "beside"
    model.save_pretrained(beside)
    tokenizer.save_pretrained(beside)
    _plant_pickle(beside, "pytorch_model.bin", marker)
    loaded, _ = load_model_and_tokenizer(str(beside))
    assert torch.equal(loaded.model.embed_tokens.weight, model.model.embed_tokens.weight)
    assert not marker.exists()


def test_compressed_folder_with_pickle_instead_of_safetensors(tmp_path, tiny):
    from bsi.method.surgery import to_basis_form
    from bsi.pipeline.export import save_compressed

    model, tokenizer = load_model_and_tokenizer(TINY_MODEL)
    to_basis_form(model, aux_rank=0, seed=0)
    folder = save_compressed(model, tokenizer, tmp_path / "compressed", {"source_model": TINY_MODEL})
    marker = tmp_path / "payload-ran"
    (folder / "model.safetensors").unlink()
    _plant_pickle(folder, "pytorch_model.bin", marker)
    with pytest.raises(BSIError, match="has no model.safetensors"):
        load_model_and_tokenizer(str(folder))
    assert not marker.exists()


def test_no_pickle_loader_in_the_package():
    root = pathlib.Path(__import__("bsi").__file__).parent
    offenders = [f"{path.relative_to(root)}: {pattern}" for path in root.rglob("*.py")
                 for pattern in ("torch.load(", "import pickle", "pickle.load", "weights_only=False")
                 if pattern in path.read_text(encoding="utf-8")]
    assert offenders == []


# ------------------------------------------------------------------ determinism
def _smoke_run(cache: pathlib.Path):
    config = make_config("smoke", {"seed": 3})
    pipeline = Pipeline(config, cache_dir=cache)
    done = [r for r in pipeline.run() if isinstance(r, DoneReport)]
    timeless = [{k: v for k, v in r.items() if k != "elapsed"} for r in pipeline.round_log]  # drop wall-clock times
    return done[0].summary, timeless, {k: v.clone() for k, v in pipeline.model.state_dict().items()}


def test_same_seed_same_result_on_cpu(tmp_path):
    torch.set_num_threads(1)
    first = _smoke_run(tmp_path / "cache-1")  # separate caches: both runs fine-tune from scratch
    second = _smoke_run(tmp_path / "cache-2")
    for summary in (first[0], second[0]):
        summary.pop("seconds")
    assert json.dumps(first[0], sort_keys=True) == json.dumps(second[0], sort_keys=True)
    assert first[0]["ranks"] and first[0]["metrics_after"]["loss"] > 0
    assert json.dumps(first[1], sort_keys=True) == json.dumps(second[1], sort_keys=True)  # every round's losses
    assert first[2].keys() == second[2].keys()
    assert all(torch.equal(first[2][k], second[2][k]) for k in first[2])
