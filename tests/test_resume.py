"""Reliability of long runs: round checkpoints, resume after a kill or Ctrl-C, no result lost by surprise."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest
import torch

from bsi.cli import main
from bsi.errors import BSIError
from bsi.pipeline.checkpoint import save_checkpoint

# each run is stopped (SIGSTOP) the moment its first checkpoint appears, so the kill lands mid-run on any machine:
# a round need only outlast the test's 20 ms look at the folder (40 iterations: about 1 s on one core; 160 before)
ARGS = ["--preset", "smoke", "--quiet", "--rounds", "4", "--iters-per-epoch", "40", "--sampling-ratio", "0.25",
        "--eval-examples", "2", "--seed", "3"]


def _default_ctrl_c() -> None:
    """In the child before it starts: Ctrl-C at its default, whatever the test process inherited or set.

    A process started with SIGINT ignored (or blocked) keeps it so across
    ``exec``, and Python then installs no KeyboardInterrupt handler: a test
    runner's worker, or a library run in it earlier, can leave that behind.
    """
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(out, cache, args=ARGS):
    env = {**os.environ, "BSI_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "bsi", "compress", *args, "--out", str(out)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_ctrl_c)


def signal_state(pid: int) -> str:
    """The signal masks of a running process, as Linux reports them (for a failure's message)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return " ".join(line.strip() for line in status if line.startswith(("SigBlk", "SigIgn", "SigCgt")))
    except OSError:
        return "(no /proc status)"


def wait_for_checkpoint(proc, out):
    """Wait until the run in ``proc`` has written its first checkpoint; returns the path of its state.json."""
    checkpoint = out / "checkpoint" / "state.json"
    deadline = time.time() + 300
    while not checkpoint.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert checkpoint.exists(), proc.stderr.read() if proc.poll() is not None else "no checkpoint in time"
    return checkpoint


def test_killed_run_resumes_to_the_same_result(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    monkeypatch.setenv("BSI_CACHE", str(cache))
    reference = tmp_path / "reference"
    assert main(["compress", *ARGS, "--out", str(reference)]) == 0
    expected = json.loads((reference / "summary.json").read_text())

    out = tmp_path / "killed"
    proc = start(out, cache)
    checkpoint = wait_for_checkpoint(proc, out)
    proc.send_signal(signal.SIGSTOP)  # held mid-run, however loaded the machine is, until the kill
    assert proc.poll() is None and not (out / "summary.json").exists(), "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "summary.json").exists()
    rounds_done = len(json.loads(checkpoint.read_text())["rounds"])
    assert 1 <= rounds_done < 4
    umask = os.umask(0)
    os.umask(umask)
    assert {p.name: p.stat().st_mode & 0o777 for p in checkpoint.parent.iterdir()} == \
        {"state.json": 0o666 & ~umask, "state.safetensors": 0o666 & ~umask}

    # a fresh run into the interrupted run's folder is refused: it names --resume and --force
    stamp = checkpoint.stat().st_mtime_ns
    assert main(["compress", *ARGS, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"bsi compress --resume {out}" in err and "--force" in err and len(err.strip().splitlines()) == 1
    assert checkpoint.stat().st_mtime_ns == stamp

    assert main(["compress", "--resume", str(out), "--quiet"]) == 0
    resumed = json.loads((out / "summary.json").read_text())
    assert resumed["ranks"] == expected["ranks"]
    assert resumed["params_after"] == expected["params_after"]
    assert not (out / "checkpoint").exists()  # a finished run leaves no checkpoint behind
    assert len((out / "rounds.jsonl").read_text().splitlines()) == 4


def test_resume_without_checkpoint_is_a_clear_error(tmp_path, capsys):
    assert main(["compress", "--resume", str(tmp_path)]) == 2
    assert "nothing to resume" in capsys.readouterr().err


def test_ctrl_c_prints_the_resume_command_that_finishes_the_run(tmp_path, monkeypatch):
    """Ctrl-C mid-run: the run saves the rounds it finished, prints how to resume, and that command finishes it.

    The run is stopped (SIGSTOP) as soon as its first round's checkpoint
    exists, so Ctrl-C reaches it mid-run however loaded the machine is: the
    signal waits while it is stopped and arrives when it continues. (Sent to a
    running process, it raced the run's last rounds on a busy machine.)
    """
    out = tmp_path / "interrupted run"  # a space: the printed command must quote it
    proc = start(out, tmp_path / "cache")
    wait_for_checkpoint(proc, out)
    proc.send_signal(signal.SIGSTOP)
    state = signal_state(proc.pid)
    assert proc.poll() is None, "the run ended before it could be stopped"
    assert not (out / "summary.json").exists(), "the run finished before it could be stopped"
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGCONT)
    err = proc.stderr.read()
    proc.wait(timeout=120)
    assert proc.returncode == 130, f"exit {proc.returncode}, stderr {err!r}, signals of the run: {state}"
    assert "Traceback" not in err and "nothing was written" not in err
    command = err.strip().splitlines()[-1]
    assert command == f"bsi compress --resume {shlex.quote(str(out))}"
    assert "finished pruning round(s) are saved" in err.strip().splitlines()[-2]

    # the printed command, run as `bsi` runs it (bsi.cli.main) in this process: a process of its own would only add
    # its imports (the interrupted run above is the one that has to be a process, for its signals)
    argv = shlex.split(command)
    assert argv[0] == "bsi"
    monkeypatch.setenv("BSI_CACHE", str(tmp_path / "cache"))
    assert main([*argv[1:], "--quiet"]) == 0
    assert len((out / "rounds.jsonl").read_text().splitlines()) == 4 and not (out / "checkpoint").exists()


def test_unwritable_checkpoint_is_a_clear_error(tmp_path):
    if not os.path.isdir("/proc/self"):
        pytest.skip("needs Linux /proc")
    with pytest.raises(BSIError, match="cannot write the checkpoint '/proc/bsi_out/checkpoint'"):
        save_checkpoint("/proc/bsi_out/checkpoint", {"x": torch.zeros(2)}, {"rounds": []})
