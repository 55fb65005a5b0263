"""The dashboard in a real headless browser (Debian's chromium, driven by playwright).

Opens the app built on the smoke preset, clicks Start with nothing changed,
waits for two rounds, opens Inspect, Chat and Spectra and checks what they show.
Screenshots go to ``artifacts/`` (git-ignored) as test artifacts:

* ``compress-running.png``: the Compress tab once a round has streamed in;
* ``compress-done.png``: the finished run (loss curve, parameters, rank heatmap, log);
* ``inspect.png``: round 2 of the first layer, figure and sortable table (its
  importance and status columns inside the window);
* ``chat.png``: both models' replies side by side with their sizes;
* ``spectra.png``: the exact Hessian spectrum of the last layer and the probes it asks for.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from conftest import smoke_app

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


@pytest.fixture
def app_url(tmp_path, monkeypatch):
    with smoke_app(tmp_path, monkeypatch) as demo:
        yield demo.local_url


@pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="chromium missing: run `make chromium` (apt-get, as root)")
def test_browser_start_inspect_chat(app_url):
    from playwright.sync_api import expect, sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.goto(app_url)
            expect(page.locator("#job-status")).to_contain_text("press Start")
            page.locator("#start-button").click()
            status = page.locator("#job-status")
            # The smoke run is seconds long: a round's status may be replaced before the next poll,
            # so the live screenshot waits for any finished round and the log proves both streamed.
            expect(status).to_contain_text(re.compile(r"round [12]/2|Done"), timeout=120_000)
            page.screenshot(path=str(ARTIFACTS / "compress-running.png"), full_page=True)
            expect(status).to_contain_text("Done", timeout=120_000)
            log = page.locator("#job-log textarea")
            expect(log).to_have_value(re.compile(r"round 1/2: pruned \d+ bases"))
            expect(log).to_have_value(re.compile(r"round 2/2: pruned \d+ bases"))
            page.screenshot(path=str(ARTIFACTS / "compress-done.png"), full_page=True)

            page.get_by_role("tab", name="Inspect").click()
            summary = page.locator("#inspect-summary")
            expect(summary).to_contain_text("model.layers.0.self_attn.q_proj", timeout=30_000)
            expect(summary).to_contain_text("candidate pool")
            expect(summary).to_contain_text("pruned")
            table = page.locator("#inspect-table")  # virtualised: only the first rows are rendered
            expect(table).to_contain_text("importance")
            expect(table).to_contain_text("status")
            expect(table).to_contain_text("protected")
            viewport = page.viewport_size["width"]
            for header in ("importance", "status"):  # the columns fit: nothing to scroll sideways for
                right = table.evaluate(
                    """(root, name) => Math.max(...[...root.querySelectorAll('*')]
                        .filter(e => e.children.length === 0 && e.textContent.trim() === name)
                        .map(e => e.getBoundingClientRect()).filter(r => r.width > 0).map(r => r.right))""", header)
                assert 0 < right <= viewport, (header, right)
            page.screenshot(path=str(ARTIFACTS / "inspect.png"), full_page=True)

            page.get_by_role("tab", name="Chat").click()
            expect(page.locator("#chat-sizes")).to_contain_text("compressed", timeout=10_000)
            page.locator("#chat-input textarea").fill("Amy has 12 apples and buys 7 more. How many now?")
            page.locator("#chat-send").click()
            for side in ("#chat-compressed", "#chat-original"):
                expect(page.locator(side)).to_contain_text("Amy has 12 apples", timeout=60_000)
            sizes = page.locator("#chat-sizes").inner_text()
            assert "parameters" in sizes and "original" in sizes
            page.wait_for_timeout(1500)  # let the streamed replies settle for the screenshot
            page.screenshot(path=str(ARTIFACTS / "chat.png"), full_page=True)

            page.get_by_role("tab", name="Spectra").click()
            page.get_by_role("button", name="List layers").click()
            spectra_status = page.locator("#spectra-status")
            expect(spectra_status).to_contain_text("layers", timeout=30_000)
            page.get_by_role("button", name="Compute spectrum").click()
            expect(spectra_status).to_contain_text("top-16 sigmas", timeout=60_000)
            expect(page.locator("#spectra-answer")).to_contain_text("n = 16")  # the calculator took the spectrum
            page.screenshot(path=str(ARTIFACTS / "spectra.png"), full_page=True)
        finally:
            browser.close()
    for name in ("compress-running.png", "compress-done.png", "inspect.png", "chat.png", "spectra.png"):
        assert (ARTIFACTS / name).stat().st_size > 10_000
