"""Every command, fed bad values: one line on stderr that names what to change, exit status 2, nothing written.

Each case fails before any model loads (the values are checked as they are
read, or before the first load), so the table runs in seconds in-process. The
last-resort handler for everything else (a bug, out of memory) is tested at
the end.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from bsi.cli import COMMANDS, build_parser, crash_message, is_out_of_memory, main, memory_advice
from bsi.config import PRESETS

TINY = "tiny-random-llama"
SHIPPED = Path(__file__).resolve().parents[1] / "data"  # the runs and sweeps that ship with bsi
DTYPES = "auto, float32, bfloat16, float16"

#: command -> [(arguments, words the one line must hold)]; {tmp} is the test's folder, {file} a file in it.
CASES: dict[str, list[tuple[list[str], str]]] = {
    "compress": [
        (["--dtype", "fp16"], f"--dtype must be one of {DTYPES}, got 'fp16'"),
        (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
        (["--keep-ratio", "1.5", "--out", "{tmp}/out"], "--keep-ratio must be in (0, 1], got 1.5"),
        (["--recover-distill", "101", "--out", "{tmp}/out"], "--recover-distill must be in [0, 100], got 101"),
        (["--preset", "smoke"], "--out DIR is required"),
        (["--rounds", "many"], "--rounds must be a whole number, got 'many'"),
        (["--device", "gpu"], "--device must be auto, cpu, cuda or cuda:N"),
        (["--preset", "fast"], f"--preset must be one of {', '.join(PRESETS)}, got 'fast'"),
        (["--batchsize", "4"], "unrecognized arguments: --batchsize 4 (did you mean --batch-size?)"),
        (["--resume", "{tmp}/nothing"], "nothing to resume"),
    ],
    "export": [
        (["--out", "{tmp}/dense"], "one of the arguments --dense --model is required"),
        (["--dense", "{tmp}/nothing", "--out", "{tmp}/dense"], "is not a bsi-compressed model folder"),
        (["--dense", "{tmp}", "--out", "{tmp}/dense", "--dtype", "fp16"],
         "--dtype must be one of stored, float32, bfloat16, float16, got 'fp16'"),
        (["--dense", "{tmp}/nothing", "--out", "{file}"], "is a file"),
    ],
    "eval": [
        (["--model", TINY, "--dtype", "fp16"], f"--dtype must be one of {DTYPES}, got 'fp16'"),
        (["--model", TINY, "--batch-size", "0"], "--batch-size must be >= 1, got 0"),
        (["--model", TINY, "--batch-size", "-1"], "--batch-size must be >= 1, got -1"),
        (["--model", TINY, "--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
        (["--model", TINY, "--examples", "0"], "--examples must be >= 1, got 0"),
        (["--model", TINY, "--device", "cuda:x"], "--device must be auto, cpu, cuda or cuda:N"),
        (["--model", "{tmp}/no-model"], "does not exist"),
        (["--examples", "4"], "the following arguments are required: --model"),
    ],
    "chat": [
        (["--model", TINY, "--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
        (["--model", TINY, "--dtype", "half"], f"--dtype must be one of {DTYPES}, got 'half'"),
        (["--model", "{file}"], "is a file"),
        ([], "the following arguments are required: --model"),
    ],
    "presets": [
        (["fast"], f"PRESET must be one of {', '.join(PRESETS)}, got 'fast'"),
        (["default", "quality"], "unrecognized arguments: quality"),
        (["--json"], "unrecognized arguments: --json"),
    ],
    "sweep": [
        (["--methods", "svd,magic", "--out", "{tmp}/sweep"], "--methods must be among svd, svd-llm, fwsvd, asvd, basel, bsi-grad, bsi, bsi-mag, bsi-curvature, bsi-grad-tested, got 'magic'"),
        (["--targets", "1.5", "--out", "{tmp}/sweep"], "--targets must be numbers in (0, 1]"),
        (["--allocation", "best", "--out", "{tmp}/sweep"], "--allocation must be one of published, uniform, sensitivity"),
        (["--dtype", "fp16", "--out", "{tmp}/sweep"], f"--dtype must be one of {DTYPES}"),
        (["--rounds", "0", "--out", "{tmp}/sweep"], "--rounds must be an integer >= 1, got 0"),
    ],
    "compare": [
        (["--models", ",", "--prompts", "{prompts}"], "--models must name at least one model"),
        (["--models", f"{TINY},{{tmp}}/no-model", "--prompts", "{prompts}"], "does not exist"),
        (["--models", TINY, "--prompts", "{tmp}/none.jsonl"], "prompts file"),
        (["--models", TINY, "--prompts", "{prompts}", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
        (["--models", TINY, "--prompts", "{prompts}", "--dtype", "fp16"], "--dtype must be one of"),
    ],
    "answers": [
        (["{tmp}/none"], "is not a folder"),
        ([f"{SHIPPED}/runs/default", "--problem", "3"], "--problem read a sweep"),
        ([f"{SHIPPED}/sweeps/study-quick", "--method", "bsi", "--beats", "basel"], "go together: add --size"),
        ([f"{SHIPPED}/runs/tour", "--reference", "dense_recovered"], "run it again with --dense-recovery"),
    ],
    "spectrum": [
        (["--top-k", "0", "--out", "{tmp}/s"], "--top-k must be >= 1, got 0"),
        (["--batches", "0", "--out", "{tmp}/s"], "--batches must be >= 1, got 0"),
        (["--delta", "1", "--out", "{tmp}/s"], "--delta must be in (0, 1), got 1"),
        (["--error", "0", "--out", "{tmp}/s"], "--error must be > 0, got 0"),
        (["--max-length", "8", "--out", "{tmp}/s"], "--max-length must be >= 16, got 8"),
        (["--dtype", "fp16", "--out", "{tmp}/s"], f"--dtype must be one of {DTYPES}"),
        (["--model", TINY, "--out", "{file}"], "is a file"),
    ],
}


def test_every_command_has_at_least_three_bad_values():
    assert set(CASES) == set(COMMANDS)
    assert all(len(cases) >= 3 for cases in CASES.values())


@pytest.mark.parametrize("command,args,words", [
    pytest.param(command, args, words, id=f"{command} {' '.join(args)}")
    for command, cases in CASES.items() for args, words in cases])
def test_a_bad_value_is_one_line_naming_what_to_change(command, args, words, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BSI_CACHE", str(tmp_path / "cache"))
    (tmp_path / "file.txt").write_text("keep")
    (tmp_path / "prompts.txt").write_text("What is 2 + 3?\n")
    fill = {"{tmp}": str(tmp_path), "{file}": str(tmp_path / "file.txt"), "{prompts}": str(tmp_path / "prompts.txt")}
    argv = [command] + [re.sub("|".join(map(re.escape, fill)), lambda m: fill[m.group()], a) for a in args]
    before = sorted(os.listdir(tmp_path))
    status = main(argv)
    out, err = capsys.readouterr()
    assert status == 2, (status, err)
    assert len(err.splitlines()) == 1 and err.startswith(f"bsi {command}: error: "), err
    assert words in err, err
    assert "Traceback" not in err and out == ""
    assert sorted(os.listdir(tmp_path)) == before  # nothing written, no output folder begun
    assert (tmp_path / "file.txt").read_text() == "keep"


def test_no_command_and_an_unknown_command_are_one_line(capsys):
    assert main([]) == 2
    assert capsys.readouterr().err.startswith("bsi: error: give a command: compress, export, eval, chat,")
    assert main(["compres", "--out", "x"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "unknown command 'compres' (did you mean compress?)" in err


# ------------------------------------------------------------------ the last resort
def test_an_unexpected_error_is_one_line_with_its_traceback_saved(tmp_path, capsys, monkeypatch):
    """A bug: one line naming it and the file that holds the whole traceback, exit status 1."""
    import tempfile

    from bsi.cli import commands

    def broken(args):
        return {}["a bug in bsi"]

    monkeypatch.setattr(commands, "run_presets", broken)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert main(["presets"]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("bsi presets: error: unexpected KeyError: 'a bug in bsi' (a bug in bsi: please report it")
    saved = err.rstrip().removesuffix(")").rsplit(" ", 1)[-1]
    assert os.path.dirname(saved) == str(tmp_path)
    text = open(saved, encoding="utf-8").read()
    assert text.startswith("bsi presets\n") and "Traceback (most recent call last)" in text
    assert "in broken" in text and "KeyError: 'a bug in bsi'" in text


@pytest.mark.parametrize("error", [
    RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total capacity)\nmore"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried "
                 "to allocate 8589934592 bytes"),
    MemoryError(),
], ids=["cuda", "cpu-allocator", "python"])
def test_out_of_memory_gets_advice_from_the_commands_own_flags(error):
    assert is_out_of_memory(error) and not is_out_of_memory(RuntimeError("shape mismatch"))
    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and isinstance(a.choices, dict)).choices
    flags = {name: {o for a in sub[name]._actions for o in a.option_strings} for name in ("compress", "eval")}
    line = crash_message(error, flags["compress"], "/tmp/bsi-error.txt")
    assert line.startswith("out of memory") and "\n" not in line
    for advice in ("lower --batch-size", "--gradient-checkpointing", "--fsdp"):
        assert advice in line, line
    assert line.endswith("the full traceback is in /tmp/bsi-error.txt")
    assert "--gradient-checkpointing" not in memory_advice(flags["eval"])  # only flags the command has
    assert "lower --batch-size" in memory_advice(flags["eval"])


def test_out_of_memory_in_a_command_exits_1_with_advice(tmp_path, capsys, monkeypatch):
    import tempfile

    from bsi.cli import commands

    def too_big(args):
        raise MemoryError()

    monkeypatch.setattr(commands, "run_presets", too_big)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert main(["presets"]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("bsi presets: error: out of memory: "), err
    assert len(os.listdir(tmp_path)) == 1  # the traceback file


def test_ctrl_c_keeps_its_own_message_and_status(capsys, monkeypatch):
    from bsi.cli import commands

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(commands, "run_presets", interrupted)
    assert main(["presets"]) == 130
    assert capsys.readouterr().err == "bsi presets: interrupted; nothing was written\n"
