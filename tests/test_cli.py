"""The command line end to end on the tiny model, and its one-line errors."""

import argparse
import io
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


def test_compress_eval_chat_end_to_end(tmp_path, monkeypatch, capsys):
    """``python -m bsi compress`` as a user starts it (a new process: the entry point, its exit code, its output),
    then refusal, ``--force``, ``eval`` and ``chat`` on its folder through the same ``main`` in this process (each
    new process would only import torch and transformers again, about 5 s)."""
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

    # a finished result is never overwritten by surprise
    monkeypatch.setenv("BSI_CACHE", str(tmp_path / "cache"))
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert main(["compress", *SMOKE, "--target-ratio", "0.4", "--out", str(out)]) == 2
    refused = capsys.readouterr().err
    assert "already holds a result" in refused and "--force" in refused
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp

    # with --force it is replaced; the fine-tune stage is cached: the second run reuses it
    assert main(["compress", *SMOKE, "--target-ratio", "0.5", "--out", str(out), "--force"]) == 0
    assert json.loads((out / "summary.json").read_text())["ranks"] == summary["ranks"]
    capsys.readouterr()

    assert main(["eval", "--model", str(out), "--examples", "4", "--max-new-tokens", "8", "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["examples"] == 4 and metrics["params_total"] == summary["params_after"]

    monkeypatch.setattr("sys.stdin", io.StringIO("hello\n\n"))
    assert main(["chat", "--model", str(out), "--max-new-tokens", "5"]) == 0
    assert "bot>" in capsys.readouterr().out


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


# ------------------------------------------------------------------ start-up, help, pipes
def _imported_modules(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run ``python -X importtime -m bsi ARGS``; return the result and the top-level modules it imported."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "bsi", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    modules = {line.split("|")[-1].strip().split(".")[0] for line in done.stderr.splitlines()
               if line.startswith("import time:") and "|" in line}
    return done, modules


@pytest.mark.parametrize("args", [("--help",), ("compress", "--help"), ("sweep", "--help"),
                                  ("compress", "--rounds", "x"), ("compress", "--keep-ratio", "0", "--out", "o")],
                         ids=["help", "compress-help", "sweep-help", "bad-int", "bad-config-value"])
def test_help_and_argument_errors_import_no_torch(args):
    """`bsi --help` and argument errors answer before torch and transformers are imported (12-17 s otherwise)."""
    done, modules = _imported_modules(*args)
    assert "bsi" in modules and done.returncode in (0, 2), done.stderr[-500:]
    assert not modules & {"torch", "transformers", "gradio", "numpy"}, modules & {"torch", "transformers", "gradio"}
    if args[-1] == "o":
        assert "--keep-ratio must be in (0, 1]" in done.stderr


def _flags(command: str):
    """(flag, help text, help as --help shows it) of every optional argument of ``bsi COMMAND``."""
    from bsi.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser = sub.choices[command]
    formatter = parser._get_formatter()
    return [((a.option_strings or [a.dest])[0], a.help, formatter._expand_help(a)) for a in parser._actions
            if (a.option_strings or a.nargs == "?") and a.option_strings[:1] != ["-h"]]


COMMANDS = ("compress", "export", "eval", "chat", "presets", "sweep", "compare", "spectrum")


@pytest.mark.parametrize("command,flag,text,shown", [
    pytest.param(c, f, t, h, id=f"{c} {f}") for c in COMMANDS for f, t, h in _flags(c)])
def test_every_flag_has_help_and_shows_its_default(command, flag, text, shown):
    assert text and len(text) > 10, f"{command} {flag} has no help text"
    assert any(w in shown for w in ("default:", "(default)", "(required")), f"{command} {flag}: {shown!r} shows no default"
    assert shown.count("(default") <= 1, f"{command} {flag} shows its default twice: {shown!r}"


def test_presets_help_lists_every_preset():
    from bsi.config import PRESETS

    for command in ("compress", "sweep"):
        text = dict((f, shown) for f, _, shown in _flags(command))
        usage = subprocess.run([sys.executable, "-m", "bsi", command, "--help"], capture_output=True, text=True).stdout
        assert "{" + ",".join(PRESETS) + "}" in usage and "--preset" in text


def test_presets_state_each_presets_measured_time(capsys):
    """`bsi presets`: a line a preset, its measured time first (preset_costs.json), or that it was not measured."""
    from bsi.config import PRESET_COSTS, PRESETS

    assert main(["presets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == list(PRESETS)
    for name, line in zip(PRESETS, lines):
        cost = PRESET_COSTS.get(name)
        assert line.startswith(f"{name} ({cost.time_text() if cost else 'not measured'}): ")
    assert "with the fine-tune and the conversion cached" in lines[list(PRESETS).index("tour")]
    assert main(["presets", "tour"]) == 0 and f"measured: {PRESET_COSTS['tour'].time_text()}" in capsys.readouterr().err


@pytest.mark.parametrize("args", [("presets", "default"), ("presets",), ("compress", "--help")],
                         ids=["preset", "list", "help"])
def test_a_reader_that_leaves_early_gets_no_traceback(args):
    """`bsi presets default | head -0`: the pipe closes before bsi writes; bsi ends quietly."""
    proc = subprocess.Popen([sys.executable, "-m", "bsi", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first byte
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, err


# ------------------------------------------------------------------ the study's speed table
def test_speed_table_uses_one_stated_definition():
    from bsi.analysis.stats import Outcomes
    from bsi.analysis.study import study_markdown, study_stats
    from bsi.results import StudyRow

    row = StudyRow.from_dict({"method": "bsi", "protocol": "tuned", "target": 0.5, "seed": 0, "params_total": 1e6,
                              "compression_ratio": 1.5, "outcomes": "x", "ms_per_token": 2.5, "dense_ms_per_token": 4.0})
    stats = study_stats([row], lambda r: Outcomes((True, False), (1.0, 2.0), (1, 1)), ["tuned"], resamples=100)
    assert stats["protocols"]["tuned"]["methods"]["bsi"]["0.5"]["speedup"] == pytest.approx(1.6)
    table = study_markdown(stats)
    assert "| `bsi` | 2.50 ms (1.60x) |" in table  # dense 4.0 ms / 2.5 ms
    assert "1000 / ms/token" in table  # the definition is stated above the table


def test_text_table_prints_a_collapsed_models_perplexity_readably():
    """A perplexity of 2e7 prints as 2.06e+07, and bsi's tiny ratio to it as 1.2e-06, not 20593155.2 and 0.000."""
    from bsi.analysis.stats import Outcomes
    from bsi.analysis.study import study_markdown, study_stats
    from bsi.results import StudyRow

    rows = [StudyRow.from_dict({"method": m, "protocol": "tuned", "target": 0.5, "seed": 0, "params_total": 1e6,
                                "compression_ratio": 1.5, "outcomes": m, "perplexity": 1.0}) for m in ("bsi", "svd")]
    nll = {"bsi": (3.0, 3.2, 3.1, 3.3), "svd": (16.8, 16.9, 16.7, 16.85)}  # per window, 1 token each
    stats = study_stats(rows, lambda r: Outcomes((None,) * 4, nll[r.outcomes], (1,) * 4), ["tuned"], resamples=200)
    table = study_markdown(stats)
    svd_row = next(line for line in table.splitlines() if line.startswith("| `svd` |"))
    assert "e+07 [" in svd_row and "." in svd_row.split("e+07")[0][-4:]  # 2.0xe+07, 3 significant digits
    ratio_row = [line for line in table.splitlines() if line.startswith("| `svd` |")][-1]
    assert "e-06" in ratio_row and "0.000" not in ratio_row  # exp(3.15 - 16.81) = 1.2e-06
