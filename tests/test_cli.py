"""The command line end to end on the tiny model, and its one-line errors."""

import json
import os
import subprocess
import sys

import pytest

from bsi.cli import main

SMOKE = ["--preset", "smoke", "--quiet"]


def run_cli(*args, env_cache, stdin=None):
    env = {**os.environ, "BSI_CACHE": str(env_cache), "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "bsi", *args], capture_output=True, text=True, env=env,
                          input=stdin, timeout=600)


def test_compress_eval_chat_end_to_end(tmp_path):
    out = tmp_path / "out"
    done = run_cli("compress", *SMOKE, "--target-ratio", "0.5", "--out", str(out), env_cache=tmp_path / "cache")
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    for key in ("params_before", "params_after", "compression_ratio", "metrics_before", "metrics_after", "seconds"):
        assert key in summary
    assert summary["params_after"] < summary["params_before"]
    assert summary["bytes_on_disk"] == (out / "model.safetensors").stat().st_size
    assert summary["bytes_on_disk"] < summary["bytes_before"]
    assert summary["compression_ratio"] == pytest.approx(summary["params_before"] / summary["params_after"])
    assert abs(summary["compressible_ratio"] - 0.5) <= 0.01
    assert len((out / "rounds.jsonl").read_text().splitlines()) == 2
    assert "accuracy" in done.stdout and "compression:" in done.stdout

    # the fine-tune stage is cached: a second run reuses it
    again = run_cli("compress", *SMOKE, "--target-ratio", "0.5", "--out", str(out), env_cache=tmp_path / "cache")
    assert again.returncode == 0
    assert json.loads((out / "summary.json").read_text())["ranks"] == summary["ranks"]

    evaluated = run_cli("eval", "--model", str(out), "--examples", "4", "--max-new-tokens", "8", "--json",
                        env_cache=tmp_path / "cache")
    assert evaluated.returncode == 0, evaluated.stderr
    metrics = json.loads(evaluated.stdout)
    assert metrics["examples"] == 4 and metrics["params_total"] == summary["params_after"]

    chatted = run_cli("chat", "--model", str(out), "--max-new-tokens", "5", stdin="hello\n\n",
                      env_cache=tmp_path / "cache")
    assert chatted.returncode == 0, chatted.stderr
    assert "bot>" in chatted.stdout


def test_model_folder_without_linear_layers(tmp_path, capsys, monkeypatch):
    from transformers import GPT2Config, GPT2LMHeadModel

    monkeypatch.setenv("BSI_CACHE", str(tmp_path / "cache"))
    # GPT-2 uses Conv1D, not nn.Linear, and its head is tied to the embedding: nothing to compress
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=300, n_positions=64))
    model.save_pretrained(tmp_path / "gpt2")
    from bsi.models import build_tiny_tokenizer

    build_tiny_tokenizer().save_pretrained(tmp_path / "gpt2")
    assert main(["compress", *SMOKE, "--model", str(tmp_path / "gpt2"), "--out", str(tmp_path / "o")]) == 2
    assert "no linear layers" in capsys.readouterr().err


def test_progress_bar_names_forward_only_steps_without_a_nan_loss():
    """ASVD's calibration runs forward only: its bar shows the stage, not 'loss nan'."""
    import io

    from bsi.progress import ProgressPrinter
    from bsi.reports import StepReport

    stream = io.StringIO()
    printer = ProgressPrinter(stream=stream)
    printer.show(StepReport("calibrate", 1, 2, float("nan"), 0.1))
    assert printer.bar.postfix == "calibrate"
    printer.show(StepReport("recover", 1, 2, 0.5, 0.1))
    assert printer.bar.postfix == "recover loss 0.5000"
    printer.show(StepReport("recover", 2, 2, float("nan"), 0.2, skipped=True))
    assert printer.bar.postfix == "recover loss nan (skipped)"
    printer.close()
