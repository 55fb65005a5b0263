"""Reliability of long runs: round checkpoints, resume after a kill, determinism."""

import json
import os
import signal
import subprocess
import sys
import time

from bsi.cli import main

# long enough per round (tiny model) that the kill lands mid-run
ARGS = ["--preset", "smoke", "--quiet", "--rounds", "4", "--iters-per-epoch", "160", "--sampling-ratio", "0.25",
        "--eval-examples", "2", "--seed", "3"]


def start(out, cache):
    env = {**os.environ, "BSI_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "bsi", "compress", *ARGS, "--out", str(out)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def test_killed_run_resumes_to_the_same_result(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("BSI_CACHE", str(cache))
    reference = tmp_path / "reference"
    assert main(["compress", *ARGS, "--out", str(reference)]) == 0
    expected = json.loads((reference / "summary.json").read_text())

    out = tmp_path / "killed"
    proc = start(out, cache)
    checkpoint = out / "checkpoint" / "state.json"
    deadline = time.time() + 300
    while not checkpoint.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert checkpoint.exists(), proc.stderr.read() if proc.poll() is not None else "no checkpoint in time"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "summary.json").exists()
    rounds_done = len(json.loads(checkpoint.read_text())["rounds"])
    assert 1 <= rounds_done < 4

    assert main(["compress", "--resume", str(out), "--quiet"]) == 0
    resumed = json.loads((out / "summary.json").read_text())
    assert resumed["ranks"] == expected["ranks"]
    assert resumed["params_after"] == expected["params_after"]
    assert not (out / "checkpoint").exists()  # a finished run leaves no checkpoint behind
    assert len((out / "rounds.jsonl").read_text().splitlines()) == 4


def test_resume_without_checkpoint_is_a_clear_error(tmp_path, capsys):
    assert main(["compress", "--resume", str(tmp_path)]) == 2
    assert "nothing to resume" in capsys.readouterr().err
