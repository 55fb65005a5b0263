"""A table of bad inputs across the CLI, config files, data files, model folders and chat.

Each must give one clear line on stderr (exit status 2), no traceback, and
leave no output folder behind.
"""

import json
import os

import pytest
from safetensors.torch import load_file, save_file

from bsi.chat import ChatSession
from bsi.cli import main
from bsi.errors import BSIError
from bsi.models import TINY_MODEL, load_model_and_tokenizer

SMOKE = ["--preset", "smoke", "--quiet"]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """The tiny model saved as an ordinary transformers folder."""
    folder = tmp_path_factory.mktemp("tiny")
    model, tokenizer = load_model_and_tokenizer(TINY_MODEL)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _write(path, data: bytes):
    path.write_bytes(data)
    return str(path)


def make_input(kind, tmp_path, tiny_folder):
    """Create the bad artefact named ``kind`` under tmp_path; return the CLI arguments that use it."""
    good = b'{"question": "What is 1 + 1?", "answer": "1 + 1 = 2\\n#### 2"}\n'
    if kind == "config-missing":
        return ["--config", str(tmp_path / "nope.json")]
    if kind == "config-not-json":
        return ["--config", _write(tmp_path / "c.json", b"{model: tiny")]
    if kind == "config-unknown-key":
        return ["--config", _write(tmp_path / "c.json", json.dumps({"modle": "x"}).encode())]
    if kind == "config-bad-value":
        return ["--config", _write(tmp_path / "c.json", json.dumps({"compress": {"rounds": -2}}).encode())]
    if kind == "data-missing":
        return ["--data", str(tmp_path / "none.jsonl")]
    if kind == "data-empty":
        return ["--data", _write(tmp_path / "e.jsonl", b"")]
    if kind == "data-malformed":
        return ["--data", _write(tmp_path / "m.jsonl", good * 2 + b'{"question": "x", \n')]
    if kind == "data-missing-field":
        return ["--data", _write(tmp_path / "f.jsonl", b'{"prompt": "x", "answer": "#### 1"}\n' * 5)]
    if kind == "data-not-utf8":
        return ["--data", _write(tmp_path / "u.jsonl", good + b'{"question": "\xff\xfe", "answer": "#### 1"}\n')]
    if kind == "data-huge-line":
        return ["--data", _write(tmp_path / "h.jsonl", good + b'{"question": "' + b"a" * 10_000_000 + b'"}\n')]
    if kind == "data-not-string":
        return ["--data", _write(tmp_path / "n.jsonl", b'{"question": 5, "answer": "#### 5"}\n' * 5)]
    if kind == "model-missing":
        return ["--model", str(tmp_path / "no-model")]
    if kind == "model-not-causal-lm":
        (tmp_path / "folder").mkdir()
        (tmp_path / "folder" / "readme.txt").write_text("not a model")
        return ["--model", str(tmp_path / "folder")]
    if kind in ("model-truncated", "model-corrupted", "model-mismatched"):
        folder = tmp_path / "broken"
        folder.mkdir()
        for f in tiny_folder.iterdir():
            (folder / f.name).write_bytes(f.read_bytes())
        weights = folder / "model.safetensors"
        if kind == "model-truncated":
            weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        elif kind == "model-corrupted":
            weights.write_bytes(b"\x13\x00\x00\x00\x00\x00\x00\x00garbage-header!!!!" + b"\x00" * 64)
        else:
            config = json.loads((folder / "config.json").read_text())
            config["intermediate_size"] *= 2
            (folder / "config.json").write_text(json.dumps(config))
        return ["--model", str(folder)]
    if kind == "out-is-file":
        return ["--out", _write(tmp_path / "file.txt", b"keep")]
    if kind == "out-unwritable":  # passes every check but a real write (crashed after round 1 before)
        if not os.path.isdir("/proc/self"):
            pytest.skip("needs Linux /proc")
        return ["--out", "/proc/bsi_out"]
    if kind == "out-foreign-folder":
        (tmp_path / "mine").mkdir()
        (tmp_path / "mine" / "thesis.tex").write_text("precious")
        return ["--out", str(tmp_path / "mine")]
    raise AssertionError(kind)


CASES = [
    # (kind or flags, words the message must contain)
    (["--keep-ratio", "0"], "--keep-ratio must be in (0, 1]"),
    (["--keep-ratio", "1.5"], "--keep-ratio must be in (0, 1]"),
    (["--target-ratio", "0"], "--target-ratio must be in (0, 1]"),
    (["--eps", "0"], "--eps must be in (0, 1)"),
    (["--eps", "1.2"], "--eps must be in (0, 1)"),
    (["--rounds", "0"], "--rounds must be an integer >= 1"),
    (["--score", "magnitude"], "--score must be one of"),
    (["--probe-scope", "row"], "--probe-scope must be one of"),
    (["--dtype", "int8"], "--dtype must be one of"),
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    ("config-missing", "does not exist"),
    ("config-not-json", "not valid JSON"),
    ("config-unknown-key", "unknown PipelineConfig key(s) modle"),
    ("config-bad-value", "rounds must be an integer >= 1"),
    ("data-missing", "does not exist"),
    ("data-empty", "no examples"),
    ("data-malformed", "line 3"),
    ("data-missing-field", "missing field 'question'"),
    ("data-not-utf8", "UTF-8"),
    ("data-huge-line", "line 2"),
    ("data-not-string", "question"),
    ("model-missing", "does not exist"),
    ("model-not-causal-lm", "config.json"),
    ("model-truncated", "broken"),
    ("model-corrupted", "broken"),
    ("model-mismatched", "broken"),
    ("out-is-file", "is a file"),
    ("out-foreign-folder", "not empty"),
    ("out-unwritable", "cannot write in '/proc'"),
]


@pytest.mark.parametrize("case,message", CASES, ids=[c if isinstance(c, str) else " ".join(c) for c, _ in CASES])
def test_bad_input_gives_one_clear_line_and_no_output(case, message, tmp_path, tiny_folder, capsys, monkeypatch):
    monkeypatch.setenv("BSI_CACHE", str(tmp_path / "cache"))
    extra = case if isinstance(case, list) else make_input(case, tmp_path, tiny_folder)
    out = tmp_path / "out"
    args = ["compress", *(SMOKE if "--config" not in extra else ["--quiet"]), *extra]
    if "--out" not in extra:
        args += ["--out", str(out)]
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bsi compress: error: ") and len(err.splitlines()) == 1, err
    assert message.lower() in err.lower(), err
    assert "Traceback" not in err
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "cache") == [b for b in before if b != "cache"]
    if case == "out-is-file":
        assert (tmp_path / "file.txt").read_bytes() == b"keep"
    if case == "out-foreign-folder":
        assert os.listdir(tmp_path / "mine") == ["thesis.tex"]


def test_eval_of_missing_model_is_one_line(tmp_path, capsys):
    assert main(["eval", "--model", str(tmp_path / "gone"), "--examples", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "does not exist" in err and len(err.splitlines()) == 1


def test_chat_rejects_empty_and_too_long_messages():
    model, tokenizer = load_model_and_tokenizer(TINY_MODEL)
    session = ChatSession(model, tokenizer, max_new_tokens=8)
    with pytest.raises(BSIError, match="empty message"):
        session.reply("   ")
    with pytest.raises(BSIError, match="too long"):
        session.reply("word " * 5000)
    assert session.history == []  # a refused message leaves the conversation untouched
    assert isinstance(session.reply("hi"), str) and len(session.history) == 2


def test_compressed_folder_with_mismatched_shapes(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BSI_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "m"
    assert main(["compress", *SMOKE, "--target-ratio", "0.5", "--eval-examples", "0", "--out", str(out)]) == 0
    state = load_file(str(out / "model.safetensors"))
    name = next(n for n in state if n.endswith(".down.weight"))
    state[name] = state[name][:-1].contiguous()
    save_file(state, str(out / "model.safetensors"))
    assert main(["eval", "--model", str(out), "--examples", "2"]) == 2
    assert "do not belong together" in capsys.readouterr().err


# ------------------------------------------------------------------ the method's own refusals
def test_a_covariance_that_no_damping_repairs_is_a_one_line_error_naming_the_way_out():
    """Non-finite activations (fp16 overflow) make a covariance no damping can factor: say which flags help."""
    import torch

    from bsi.method.bases import whitening_factor

    broken = torch.eye(4)
    broken[1, 1] = float("nan")
    with pytest.raises(BSIError, match="not positive definite") as err:
        whitening_factor(broken)
    assert "--dtype float32" in str(err.value) and "--bases svd" in str(err.value) and "\n" not in str(err.value)


def test_a_layer_that_saw_no_input_is_a_one_line_error_naming_the_way_out():
    import torch
    from torch import nn

    from bsi.method.bases import InputStatistics

    used, unused = nn.Linear(4, 4), nn.Linear(4, 4)
    stats = InputStatistics({"used": used, "unused": unused})
    with stats, torch.no_grad():
        stats.start_batch(None)
        used(torch.randn(2, 3, 4))
    with pytest.raises(BSIError, match="layer 'unused' saw no input") as err:
        stats.covariance()
    assert "--calibration-batches" in str(err.value) and "--bases svd" in str(err.value)
