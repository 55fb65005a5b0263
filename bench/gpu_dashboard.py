"""The dashboard on a machine of its own: `python app.py` started, one run driven from Start to Done (issue 43, item 4).

    python bench/gpu_dashboard.py --json $OUT/dashboard.json                  # on the GPU: the default preset
    python bench/gpu_dashboard.py --preset smoke --port 7871 --json /tmp/d.json   # CPU dry run, the tiny model

Starts ``python app.py --preset P --port N`` as its own process (as a user
would), waits until the page answers, then presses Start through
``gradio_client`` with the form as the preset fills it
(:meth:`bsi.app.form.Form.for_preset`: the ``/start`` endpoint takes the
form's fields in order) and watches the streamed status line. Records, in
seconds from the press: the first status that names a round
(``first_round_s``) and the ``**Done**`` status (``done_s``); also how long
the server took to answer (``server_up_s``, from the process start), the
rounds the status named, the last status line, and how long the app took
to exit after its SIGTERM with this client still connected (``stopped_s``;
``None`` if it had to be killed after 20 s). The device the app runs
on is its own choice (``auto``: CUDA where there is one).

``--budget`` bounds the script: once spent, the job is cancelled through
the app's ``/cancel`` endpoint, the server stopped, and what was seen
written (``outcome: budget``). The JSON file is rewritten at each milestone.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(ROOT))  # this checkout's bsi first

ROUND = re.compile(r"round (\d+)/(\d+)")


def wait_for(url: str, process: subprocess.Popen, deadline: float) -> bool:
    """Poll ``url`` until it answers 200 (True), the process exits or the deadline passes (False)."""
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="default", help="the form's preset (default: default)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--budget", type=float, default=420.0, help="seconds for the whole script (default: 420)")
    p.add_argument("--json", default="bench/gpu-dashboard.json")
    args = p.parse_args(argv)
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    from common import machine
    from gradio_client import Client

    from bsi.app.form import Form
    from bsi.files import atomic_write_json

    form = Form.for_preset(args.preset)  # an unknown preset answers here, before anything starts
    deadline = time.monotonic() + args.budget
    result: dict = {"kind": "dashboard", "machine": machine(), "preset": args.preset, "budget_s": args.budget,
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "outcome": "started",
                    "command": f"python app.py --preset {args.preset} --port {args.port}"}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)

    def save(**values) -> None:
        result.update(values)
        atomic_write_json(args.json, result)

    url = f"http://127.0.0.1:{args.port}/"
    log = open(Path(args.json).with_suffix(".log"), "w", encoding="utf-8")  # the app's own output, kept
    started = time.monotonic()
    server = subprocess.Popen([sys.executable, "app.py", "--preset", args.preset, "--port", str(args.port)],
                              cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        if not wait_for(url, server, deadline):
            save(outcome="the app did not answer" + (f" (exit {server.returncode})" if server.poll() is not None else ""))
            return 1
        save(server_up_s=time.monotonic() - started)
        client = Client(url, verbose=False)
        pressed = time.monotonic()
        job = client.submit(*dataclasses.astuple(form), api_name="/start")
        rounds: set[str] = set()
        status = ""
        while True:
            outputs = job.outputs()
            if outputs:
                status = str(outputs[-1][0])
                for line in (str(o[0]) for o in outputs):
                    if m := ROUND.search(line):
                        rounds.add(m.group(0))
                if rounds and "first_round_s" not in result:
                    save(first_round_s=time.monotonic() - pressed)
                if status.startswith("**Done**"):
                    save(done_s=time.monotonic() - pressed, outcome="done")
                    break
            if job.done():
                final = job.outputs()
                status = str(final[-1][0]) if final else status
                if status.startswith("**Done**"):
                    save(done_s=time.monotonic() - pressed, outcome="done")
                else:
                    save(outcome="ended without Done")
                break
            if time.monotonic() > deadline:
                client.predict(api_name="/cancel")
                save(outcome="budget")
                break
            time.sleep(0.25)
        save(rounds_seen=len(rounds), last_status=status[:400])
    finally:
        stopping = time.monotonic()
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
            save(stopped_s=time.monotonic() - stopping)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            save(stopped_s=None)
        log.close()
    print({k: result.get(k) for k in ("outcome", "server_up_s", "first_round_s", "done_s", "rounds_seen", "stopped_s")},
          flush=True)
    return 0 if result["outcome"] == "done" else 1


if __name__ == "__main__":
    sys.exit(main())
