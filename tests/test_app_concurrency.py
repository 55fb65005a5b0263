"""Concurrent visitors of the dashboard: two gradio_client clients on one in-process server.

Each client is one Gradio session (its own session hash, so its own
:class:`~bsi.app.state.Session`). Faults tried, and what each must produce:

* a second visitor presses Start while the first one's job runs: a single
  "Busy" reply, no second job; after the first job ends, the second starts;
* both chat at once: each sees only its own conversation, with its own model;
  a visitor with no run of its own gets "no compressed model yet";
* Cancel in the middle of a round: "Cancelled", the board is free, the next
  Start runs to the end and chat works;
* the client cancels its event mid-stream (``Job.cancel()``) or ends its
  session (``Client.close()``, what a closed tab does to the heartbeat): the
  job stops and the board is free within seconds.

The tiny random Llama and the smoke preset keep every job to seconds; jobs
that must still be running when the fault hits get a longer schedule by
editing the smoke preset in place (``monkeypatch.setitem``).
"""

from __future__ import annotations

import copy
import time
from dataclasses import astuple

import pytest
import torch
from conftest import smoke_app

from bsi.app.form import Form
from bsi.app.job import run_job
from bsi.app.state import JobBoard, Session, Visitors
from bsi.config import PRESETS

SMOKE = astuple(Form.for_preset("smoke"))


@pytest.fixture
def server(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADIO_HEARTBEAT_INTERVAL", "0.5")  # notice a closed client within a second
    torch.set_num_threads(1)
    with smoke_app(tmp_path, monkeypatch) as demo:
        yield demo


def client(demo):
    from gradio_client import Client

    return Client(demo.local_url, verbose=False)


def longer_smoke(monkeypatch, **sections):
    """Lengthen the smoke preset in place (e.g. ``finetune={"steps": 400}``) for this test only."""
    preset = copy.deepcopy(PRESETS["smoke"])
    for section, values in sections.items():
        preset[section].update(values)
    monkeypatch.setitem(PRESETS, "smoke", preset)


def wait_for(predicate, timeout: float, what: str, poll: float = 0.1):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def statuses(job) -> list[str]:
    return [out[0] for out in job.outputs()]


# ------------------------------------------------------------------ two visitors
def test_second_visitor_waits_its_turn_and_sessions_stay_apart(server):
    a, b = client(server), client(server)
    assert a.session_hash != b.session_hash
    job_a = a.submit(*SMOKE, api_name="/start")
    wait_for(lambda: server.board.busy, 60, "A's job to take the board")
    busy = b.submit(*SMOKE, api_name="/start").result()
    assert "Busy" in busy[0] and "tiny-random-llama" in busy[0]
    assert job_a.result()[0].startswith("**Done**")
    assert not server.board.busy

    # B never ran anything: it has no model to chat with, A's model is not visible to it
    *_, sizes = b.predict("hi", 8, api_name="/chat")
    assert "no compressed model yet" in sizes

    assert b.submit(*SMOKE, api_name="/start").result()[0].startswith("**Done**")  # B's turn now
    chats = {name: c.submit(f"question from {name}", 8, api_name="/chat") for name, c in (("A", a), ("B", b))}
    for name, job in chats.items():
        compressed, original, _ = job.result()
        texts = [part["text"] for message in compressed + original for part in message["content"]
                 if message["role"] == "user"]
        assert texts == [f"question from {name}"] * 2, texts  # each sees its own message, in both panels

    session_a, session_b = server.visitors.get(a.session_hash), server.visitors.get(b.session_hash)
    assert session_a is not session_b
    assert session_a.compressed.model is not session_b.compressed.model
    assert session_a.chats["compressed"] is not session_b.chats["compressed"]
    assert [r.round for r in session_a.rounds] == [r.round for r in session_b.rounds] == [1, 2]
    assert session_a.rounds[0] is not session_b.rounds[0]
    a.close(), b.close()


def test_cancel_mid_round_then_start_and_chat(server, monkeypatch):
    original_smoke = PRESETS["smoke"]
    longer_smoke(monkeypatch, compress={"iters_per_epoch": 80})  # 40 iterations a round
    a = client(server)
    job = a.submit(*SMOKE, api_name="/start")
    wait_for(lambda: any("round 1/2" in s for s in statuses(job)), 120, "round 1 to finish")
    session = server.visitors.get(a.session_hash)
    assert "Cancelling" in a.predict(api_name="/cancel")
    steps_at_cancel = len(session.steps)  # the request is in (counted here: on a busy machine it can take a step or two)
    final = job.result()
    assert final[0].startswith("**Cancelled.**"), final[0]
    assert not server.board.busy and not session.running
    assert len(session.rounds) == 1 and session.compressed is None  # stopped inside round 2
    assert len(session.steps) <= steps_at_cancel + 3  # within a report or two (round 2 has 40 steps)

    monkeypatch.setitem(PRESETS, "smoke", original_smoke)
    assert a.submit(*SMOKE, api_name="/start").result()[0].startswith("**Done**")
    compressed, original, sizes = a.predict("What is 2 + 3?", 8, api_name="/chat")
    assert compressed[-1]["role"] == original[-1]["role"] == "assistant" and "parameters" in sizes
    a.close()


@pytest.mark.parametrize("fault", ["cancel the event", "close the client"])
def test_client_gone_mid_stream_stops_the_job(server, monkeypatch, fault):
    longer_smoke(monkeypatch, finetune={"steps": 2000})  # minutes: only a stop ends it in time
    a = client(server)
    job = a.submit(*SMOKE, api_name="/start")
    wait_for(lambda: server.visitors.get(a.session_hash) is not None, 60, "the job to start")
    session = server.visitors.get(a.session_hash)
    wait_for(lambda: len(session.steps) >= 2, 60, "the fine-tune to take steps")
    assert session.running and server.board.busy
    if fault == "cancel the event":
        job.cancel()  # gradio closes the handler's generator
    else:
        a.close()  # the heartbeat stops: the app's unload handler raises the session's cancel flag
    wait_for(lambda: not server.board.busy, 30, "the board to be freed")
    assert not session.running
    steps = len(session.steps)
    time.sleep(1.0)
    assert len(session.steps) == steps  # the job really stopped, not merely let go of the lock
    assert 0 < steps < 2000
    if fault == "close the client":
        assert session.closed and session.compressed is None and server.visitors.get(a.session_hash) is None
    other = client(server)  # the server takes the next job
    short = other.submit(*SMOKE, api_name="/start")
    wait_for(lambda: len(short.outputs()) >= 2, 60, "the next job to start")
    assert "Busy" not in statuses(short)[0]
    short.cancel()
    other.close()


# ------------------------------------------------------------------ without a server
def test_leaving_visitor_stops_its_job_and_frees_memory(tmp_path, monkeypatch):
    monkeypatch.setenv("BSI_CACHE", str(tmp_path))
    visitors, board, session = Visitors(), JobBoard(), Session()
    visitors.register("tab-1", session)
    jobs = run_job(board, session, Form.for_preset("smoke"), min_interval=0)
    next(jobs), next(jobs)
    assert board.busy and session.running
    assert visitors.leave("tab-1") and not visitors.leave("tab-1")
    rest = list(jobs)  # the job notices at its next report and ends quietly (nobody is watching)
    assert len(rest) <= 1 and not board.busy and not session.running
    assert session.closed and session.compressed is None and session.original is None
    assert "visitor left" in session.log[-1]
    after = list(run_job(board, session, Form.for_preset("smoke")))
    assert len(after) == 1 and "Closed" in after[0].status and not board.busy


def test_visitors_hold_sessions_weakly():
    import gc

    visitors = Visitors()
    visitors.register("tab", Session())
    gc.collect()
    assert len(visitors) == 0 and visitors.get("tab") is None


def test_one_reply_at_a_time_per_session():
    from bsi.app import chat
    from bsi.app.state import LoadedModel
    from bsi.errors import BSIError
    from bsi.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer("tiny-random-llama")
    session = Session(compressed=LoadedModel(model, tokenizer, "compressed", 1))
    first = chat.respond(session, "one", max_new_tokens=8)
    next(first)
    with pytest.raises(BSIError, match="still streaming"):
        next(chat.respond(session, "two", max_new_tokens=8))
    first.close()  # a client gone mid-stream: the guard is lifted
    *_, (history, _) = chat.respond(session, "three", max_new_tokens=8)
    assert [m["content"] for m in history if m["role"] == "user"] == ["three"]


# ------------------------------------------------------------------ two real browser tabs
CHROMIUM = "/usr/bin/chromium"


@pytest.mark.skipif(not __import__("os").path.exists(CHROMIUM), reason="chromium missing: run `make chromium`")
def test_two_browser_tabs_busy_then_tab_closed_frees_the_server(server, monkeypatch):
    from playwright.sync_api import expect, sync_playwright

    longer_smoke(monkeypatch, finetune={"steps": 2000})
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            first, second = browser.new_context().new_page(), browser.new_context().new_page()
            for page in (first, second):
                page.goto(server.local_url)
                expect(page.locator("#job-status")).to_contain_text("press Start", timeout=60_000)
            first.locator("#start-button").click()
            expect(first.locator("#job-status")).to_contain_text("Running", timeout=60_000)
            second.locator("#start-button").click()
            expect(second.locator("#job-status")).to_contain_text("Busy", timeout=30_000)
            first.close()  # the visitor closes the tab mid-run
            wait_for(lambda: not server.board.busy, 30, "the closed tab's job to stop")
            second.locator("#start-button").click()
            expect(second.locator("#job-status")).to_contain_text("Running", timeout=60_000)
            second.locator("#cancel-button").click()
            expect(second.locator("#job-status")).to_contain_text("Cancelled", timeout=60_000)
            wait_for(lambda: not server.board.busy, 10, "the board after Cancel")  # freed as the handler returns
        finally:
            browser.close()
