"""The dashboard in a real headless browser (Debian's chromium, driven by playwright).

* :func:`test_first_visit_shows_the_shipped_run_and_study`: ``python app.py``
  started as a user starts it (from another folder, with a temporary folder
  of its own: the address and ``--share`` lines it prints, exit code 0 on
  SIGTERM and nothing left behind are checked too); before any click the Compress plots, Inspect,
  Spectra, Answers and Compare show the run and study shipped in ``data/``;
  the time from the server's start to the first real figure on the page is
  printed (a figure for the notes, not a timed assertion); then the form's
  preset menu (every preset's measured time), eps (greyed out under fisher,
  enabled by hutchinson) and the paper's size rule (KeepRatio), the Answers
  views (filters, one problem across methods, what one method alone gets
  right) and Help.
* :func:`test_browser_start_inspect_chat`: the app built on the smoke preset,
  Start with nothing changed, two rounds, then Inspect, Chat (a message, then
  the whole prompts file through both models, marked) and Spectra.
* :func:`test_bad_inputs_say_what_to_change_and_show_nothing_half`: a folder
  with no outcomes, a sweep without answers, a prompts file with a malformed
  answer: one line each, and no table or figure left from before.

Screenshots go to ``artifacts/`` (git-ignored) as test artifacts:

* ``compress-running.png``: the Compress tab once a round has streamed in;
* ``compress-done.png``: the finished run (loss curve, parameters, rank heatmap, log);
* ``inspect.png``: round 2 of the first layer, figure and sortable table (its
  importance and status columns inside the window);
* ``chat.png``: both models' replies side by side with their sizes;
* ``spectra.png``: the exact Hessian spectrum of the last layer and the probes it asks for;
* ``first-visit.png`` (the README's ``docs/img/dashboard.png``), ``first-inspect.png``, ``first-spectra.png``,
  ``first-compare.png``: the tabs before any click;
* ``form-eps-keepratio.png``: eps enabled by hutchinson, the paper's size rule chosen;
* ``answers-run.png`` (the ``lost`` filter), ``answers-sweep.png`` (one problem, every method),
  ``answers-beats.png``, ``help.png``, ``chat-prompts.png``, ``bad-inputs.png``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import smoke_app

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts"
needs_chromium = pytest.mark.skipif(shutil.which(CHROMIUM) is None,
                                    reason="chromium missing: run `make chromium` (apt-get, as root)")
#: a plot that draws data (not the empty placeholder figure, whose only content is an annotation)
HAS_DATA = """(id) => [...document.querySelectorAll('#' + id + ' .js-plotly-plot')].some(g => (g.data || []).some(
    t => ['x', 'y', 'z'].some(k => Array.isArray(t[k]) && t[k].length > 0)))"""


def launch(p):
    return p.chromium.launch(executable_path=CHROMIUM, headless=True,
                             args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fill_when_shown(page, selector: str, text: str) -> None:
    """Type ``text`` into a text box of a tab just opened, once the tab has drawn it, and see that it holds it.

    A tab's boxes are drawn when the tab opens; on a loaded machine a box
    filled at that moment can be drawn again with its first value, and the
    next click then sends that value instead (seen once in a full run: the
    Load button loaded the folder the box opened with).
    """
    from playwright.sync_api import expect

    box = page.locator(selector)
    expect(box).to_be_visible(timeout=WAIT_MS)
    expect(box).to_be_editable()
    box.fill(text)
    expect(box).to_have_value(text)


#: how long a browser test waits for the page to show what it expects. A wait ends as soon as the page shows it;
#: the bound only decides how slow a loaded machine may be before the test fails. 30 s was once too short on two
#: cores with two test workers: the app's first-visit work (the shipped run and study drawn) queued before the
#: event under test.
WAIT_MS = 120_000


@pytest.fixture(autouse=True)
def _patient_expectations():
    """Playwright's ``expect`` waits up to :data:`WAIT_MS` by default in this file (its own default is 5 s)."""
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    yield
    expect.set_options(timeout=5_000)


@pytest.fixture
def app(tmp_path, monkeypatch):
    with smoke_app(tmp_path, monkeypatch) as demo:
        yield demo


@pytest.fixture
def app_url(app):
    return app.local_url


def summary_parameters(text: str) -> int:
    """The whole-model parameters the What-if summary states (``1.31x smaller whole model (N of M parameters``)."""
    return int(re.search(r"\(([\d,]+) of [\d,]+ parameters", text).group(1).replace(",", ""))


def plot_values(page, elem_id: str) -> list[float]:
    """Every y value the plot ``elem_id`` draws, as the page holds them."""
    return page.evaluate("""(id) => [...document.querySelectorAll('#' + id + ' .js-plotly-plot')].flatMap(
        g => (g.data || []).flatMap(t => Array.isArray(t.y) ? t.y : []))""", elem_id)


def move_whatif_target(page, share: float, where: str) -> None:
    """Type a target share into the What-if slider's box and wait for the summary to say it; prints how long."""
    from playwright.sync_api import expect

    value = page.locator("#whatif-value input[type=number]")
    value.fill(f"{share:g}")
    value.press("Enter")
    moved = time.monotonic()
    expect(page.locator("#whatif-summary")).to_contain_text(f"target {share:.0%} of the compressible layers",
                                                            timeout=WAIT_MS)
    print(f"\nWhat if, {where}: the summary redrawn {time.monotonic() - moved:.2f} s after the size moved")


def whatif_in_the_browser(page, app) -> None:
    """The What-if tab after a run of this session: move the size, see it redraw, measure, check the size shown."""
    import copy

    import torch
    from playwright.sync_api import expect

    from bsi.app import whatif
    from bsi.method.surgery import basis_layers, model_parameters

    page.get_by_role("tab", name="What if").click()
    summary = page.locator("#whatif-summary")
    expect(page.locator("#whatif-source")).to_contain_text("in memory", timeout=WAIT_MS)
    expect(summary).to_contain_text("predicted loss rise", timeout=WAIT_MS)
    page.wait_for_function(HAS_DATA, arg="whatif-ranks")
    before_text, before_bars = summary.inner_text(), plot_values(page, "whatif-ranks")
    move_whatif_target(page, 0.35, "a run of this session")
    page.wait_for_function("""([id, old]) => Math.abs([...document.querySelectorAll('#' + id + ' .js-plotly-plot')]
        .flatMap(g => (g.data || []).flatMap(t => Array.isArray(t.y) ? t.y : [])).reduce((a, b) => a + b, 0) - old)
        > 1e-6""", arg=["whatif-ranks", sum(before_bars)])  # the bars redrawn too
    after_text = summary.inner_text()
    assert after_text != before_text and sum(plot_values(page, "whatif-ranks")) < sum(before_bars)
    session = next(iter(app.visitors._sessions.values()))  # the visitor's own session, as the server holds it
    cut = whatif.plan(session, 1, "target", 0.35, "bsi", "auto")
    model = copy.deepcopy(whatif.explorer(session).model_at(1))  # cut for real: the columns removed
    for name, layer in basis_layers(model).items():
        layer.keep(torch.tensor(sorted(set(range(layer.rank)) - set(cut.pruned[name].tolist())), dtype=torch.long))
    assert summary_parameters(after_text) == model_parameters(model) == cut.params_total
    page.locator("#whatif-measure").click()
    answers = page.locator("#whatif-answers")
    expect(answers).to_contain_text("Held-out loss", timeout=60_000)
    expect(answers).to_contain_text("dense, fine-tuned", timeout=60_000)
    page.wait_for_function(HAS_DATA, arg="whatif-curve", timeout=60_000)
    expect(page.locator("#whatif-status")).to_contain_text("run's own path included", timeout=60_000)
    page.screenshot(path=str(ARTIFACTS / "whatif-measured-smoke.png"), full_page=True)


@needs_chromium
def test_browser_start_inspect_chat(app):
    from playwright.sync_api import expect, sync_playwright

    app_url = app.local_url

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.goto(app_url)
            expect(page.locator("#job-status")).to_contain_text("Start")
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
            expect(summary).to_contain_text("model.layers.0.self_attn.q_proj", timeout=WAIT_MS)
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

            whatif_in_the_browser(page, app)

            page.get_by_role("tab", name="Chat").click()
            expect(page.locator("#chat-sizes")).to_contain_text("compressed", timeout=10_000)
            page.locator("#chat-input textarea").fill("Amy has 12 apples and buys 7 more. How many now?")
            page.locator("#chat-send").click()
            for side in ("#chat-compressed", "#chat-original"):
                expect(page.locator(side)).to_contain_text("Amy has 12 apples", timeout=60_000)
            sizes = page.locator("#chat-sizes").inner_text()
            assert "parameters" in sizes and "the run's fine-tuned dense model" in sizes
            # the box empties once both replies have streamed (the send's .then), so the screenshot shows them whole
            expect(page.locator("#chat-input textarea")).to_have_value("", timeout=60_000)
            page.screenshot(path=str(ARTIFACTS / "chat.png"), full_page=True)
            page.locator("#chat-prompts-run").click()  # examples/prompts.jsonl through both models, marked
            prompts_status = page.locator("#chat-prompts-status")
            expect(prompts_status).to_contain_text("prompts of", timeout=240_000)
            expect(prompts_status).to_contain_text("the run's fine-tuned dense model")
            expect(page.locator("#chat-prompts-table")).to_contain_text(re.compile("✓ right|✗ wrong"))
            page.locator("#chat-prompts-table").scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "chat-prompts.png"), full_page=True)

            page.get_by_role("tab", name="Spectra").click()
            page.get_by_role("button", name="List layers").click()
            spectra_status = page.locator("#spectra-status")
            # the opening text (the shipped spectra) names its layers too: wait for the list's own reply and its choice
            expect(spectra_status).to_have_text(re.compile(r"^\s*\d+ layers\s*$"), timeout=WAIT_MS)
            expect(page.locator("#spectra-layer input")).to_have_value(re.compile(r"\S"))  # a layer chosen
            page.get_by_role("button", name="Compute spectrum").click()
            expect(spectra_status).to_contain_text("top-16 sigmas", timeout=60_000)
            expect(page.locator("#spectra-answer")).to_contain_text("n = 16")  # the calculator took the spectrum
            page.screenshot(path=str(ARTIFACTS / "spectra.png"), full_page=True)
        finally:
            browser.close()
    for name in ("compress-running.png", "compress-done.png", "inspect.png", "whatif-measured-smoke.png", "chat.png",
                 "chat-prompts.png", "spectra.png"):
        assert (ARTIFACTS / name).stat().st_size > 10_000


@needs_chromium
def test_first_visit_shows_the_shipped_run_and_study(tmp_path):
    """``python app.py`` as a user starts it: real content in every tab before any click, then the form and Answers."""
    from playwright.sync_api import expect, sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    port = free_port()
    scratch = tmp_path / "tmp"  # the app's temporary folder (TMPDIR), to see what it leaves behind
    scratch.mkdir()
    env = {**os.environ, "BSI_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "GRADIO_ANALYTICS_ENABLED": "False", "TMPDIR": str(scratch)}
    started = time.monotonic()  # the server's start: the process, its imports, the shipped data, the page
    # started from another folder than the checkout: the shipped data is found from the package, not the cwd
    server = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port)], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        url = None
        while url is None:
            line = server.stdout.readline()
            assert line, "app.py ended before it printed its address"
            lines.append(line)
            found = re.search(r"(http://127\.0\.0\.1:\d+)", line)
            url = found.group(1) if found else None
        lines.append(server.stdout.readline())  # printed with the address: how to share it, or the public link
        assert list(scratch.glob("bsi-inspect-*/csv-*/*.csv"))  # the opening Inspect view of the shipped run
        with sync_playwright() as p:
            browser = launch(p)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1100})
                page.goto(url)
                page.wait_for_function(HAS_DATA, arg="ranks-plot", timeout=120_000)
                first_figure = time.monotonic() - started
                print(f"\nfirst real figure on the page {first_figure:.1f} s after `python app.py` started")
                (ARTIFACTS / "first-figure.txt").write_text(f"{first_figure:.1f} s from python app.py to the first "
                                                            "real figure (the shipped run's rank heatmap)\n")
                status = page.locator("#job-status")
                expect(status).to_contain_text("Showing a finished run")
                expect(status).to_contain_text("smollm2-135m-instruct")
                page.wait_for_function(HAS_DATA, arg="params-plot")
                page.screenshot(path=str(ARTIFACTS / "first-visit.png"), full_page=False)

                # every preset shows its measured time; the tour is first and one click away
                menu = page.locator("#preset-menu input")
                expect(menu).to_have_value(re.compile(r"^tour · "))
                expect(page.locator("#preset-line")).to_contain_text("Gives up")

                # eps: in view, greyed out under fisher with why and how; hutchinson enables it
                expect(page.locator("#eps-field input")).to_be_disabled()
                expect(page.locator("#eps-note")).to_contain_text("switch Curvature to hutchinson")
                expect(page.locator("#eps-rule")).to_contain_text("0.0001")
                page.locator("#curvature-field").get_by_text("hutchinson", exact=True).click()
                expect(page.locator("#eps-field input")).to_be_enabled()
                expect(page.locator("#eps-note")).to_contain_text("0 takes the rule")
                page.locator("#size-mode").get_by_text("the paper's size rule (KeepRatio)").click()
                expect(page.locator("#size-line")).to_contain_text("KeepRatio^(1/T)")
                scrolled = page.evaluate("window.scrollY")  # boxes are in the viewport, a full-page clip in the page
                top = page.locator("#preset-menu").bounding_box()  # the method's inputs, preset to the eps rule
                bottom = page.locator("#eps-rule").bounding_box()
                page.screenshot(path=str(ARTIFACTS / "form-eps-keepratio.png"), full_page=True,
                                clip={"x": 0, "y": top["y"] + scrolled - 20, "width": 720,
                                      "height": bottom["y"] + bottom["height"] - top["y"] + 40})
                page.locator("#eps-field input").fill("0.001")  # the form's eps, shown on one layer in What if
                page.locator("#eps-link").click()
                expect(page.locator("#whatif-eps input[type=number]")).to_have_value("-3")
                expect(page.locator("#whatif-eps-button")).to_be_visible()

                page.get_by_role("tab", name="Inspect").click()
                expect(page.locator("#inspect-summary")).to_contain_text("candidate pool")
                page.wait_for_function(HAS_DATA, arg="inspect-figure")
                expect(page.locator("#inspect-table")).to_contain_text("importance")
                page.screenshot(path=str(ARTIFACTS / "first-inspect.png"), full_page=True)

                page.get_by_role("tab", name="What if").click()  # the shipped run's scores, before anything runs
                summary = page.locator("#whatif-summary")
                expect(summary).to_contain_text("predicted loss rise")
                expect(page.locator("#whatif-source")).to_contain_text("Prepare")
                expect(page.locator("#whatif-source")).to_contain_text(re.compile(r"Preparing takes about|not measured"))
                page.wait_for_function(HAS_DATA, arg="whatif-ranks")
                page.screenshot(path=str(ARTIFACTS / "first-whatif.png"), full_page=True)
                shown = summary.inner_text()
                move_whatif_target(page, 0.5, "the shipped run")
                assert summary_parameters(summary.inner_text()) < summary_parameters(shown)
                page.locator("#whatif-measure").click()  # no weights yet: it says what to do, at once
                expect(page.locator("#whatif-status")).to_contain_text("press Prepare first")

                page.get_by_role("tab", name="Spectra").click()
                expect(page.locator("#spectra-status")).to_contain_text("Saved spectra")
                page.wait_for_function(HAS_DATA, arg="spectra-figure")
                page.screenshot(path=str(ARTIFACTS / "first-spectra.png"), full_page=True)

                page.get_by_role("tab", name="Compare").click()
                expect(page.locator("#compare-status")).to_contain_text("evaluated models")
                page.wait_for_function(HAS_DATA, arg="compare-figure")
                page.screenshot(path=str(ARTIFACTS / "first-compare.png"), full_page=True)
                expect(page.locator("#compare-status")).to_contain_text("smollm2-135m-instruct")
                page.locator("#compare-shipped input").click()  # another shipped sweep: the second model's
                page.get_by_role("option", name="gemma3-270m-study-quick", exact=True).click()
                expect(page.locator("#compare-status")).to_contain_text("gemma3-270m", timeout=WAIT_MS)
                expect(page.locator("#compare-folder textarea")).to_have_value(
                    re.compile(r"gemma3-270m-study-quick$"))
                page.wait_for_function(HAS_DATA, arg="compare-figure")

                page.get_by_role("tab", name="Answers").click()
                run_status = page.locator("#answers-run-status")
                expect(run_status).to_contain_text("reference: the run's fine-tuned dense model")
                lost = page.locator("#answers-filter").get_by_text(re.compile(r"^lost \(\d+\)$"))
                count = int(re.search(r"\((\d+)\)", lost.inner_text()).group(1))
                lost.click()
                table = page.locator("#answers-run-table")
                if count:
                    expect(table).to_contain_text("lost")
                expect(table).not_to_contain_text("both-right")
                page.screenshot(path=str(ARTIFACTS / "answers-run.png"), full_page=True)

                page.get_by_role("tab", name="A sweep").click()
                expect(page.locator("#answers-sweep-status")).to_contain_text("evaluated models")
                expect(page.locator("#answers-problem-text")).to_contain_text("Problem 0")
                expect(page.locator("#answers-problem-table")).to_contain_text("bsi @")
                expect(page.locator("#answers-problem-table")).to_contain_text("dense")
                page.screenshot(path=str(ARTIFACTS / "answers-sweep.png"), full_page=True)
                page.locator("#answers-beats").click()
                expect(page.locator("#answers-beats-text")).to_contain_text("answered right by")
                page.screenshot(path=str(ARTIFACTS / "answers-beats.png"), full_page=True)

                page.get_by_role("tab", name="Help").click()
                expect(page.locator("#help-text")).to_contain_text("The paper and bsi's defaults")
                expect(page.locator("#help-text")).to_contain_text("why bsi differs")
                page.screenshot(path=str(ARTIFACTS / "help.png"), full_page=True)
            finally:
                browser.close()
    finally:
        server.terminate()  # SIGTERM, as a service manager stops it
        code = server.wait(timeout=30)
    text = "".join(lines)  # the address, and the switch for a public link (bsi.app.layout.startup_lines)
    assert "live compression studio on http://127.0.0.1:" in text and "--share" in text, text
    assert "share=True" not in text
    assert code == 0, text + server.stdout.read()  # a stop is a clean exit, no traceback
    assert not list(scratch.glob("bsi-inspect-*")), "the Inspect tab's CSV folder outlived the app"
    for name in ("first-visit.png", "form-eps-keepratio.png", "first-inspect.png", "first-whatif.png", "first-spectra.png",
                 "first-compare.png", "answers-run.png", "answers-sweep.png", "answers-beats.png", "help.png"):
        assert (ARTIFACTS / name).stat().st_size > 10_000


@needs_chromium
def test_bad_inputs_say_what_to_change_and_show_nothing_half(app_url, tmp_path):
    """A folder with no outcomes, a sweep without answers, a prompts file with a malformed answer: one line each."""
    from playwright.sync_api import expect, sync_playwright

    empty = tmp_path / "empty"
    empty.mkdir()
    no_answers = tmp_path / "sweep"  # a sweep's rows without their outcome files
    no_answers.mkdir()
    (no_answers / "results.jsonl").write_text('{"method": "dense", "protocol": "dense", "target": 1.0, "seed": 0, '
                                              '"params_total": 10, "accuracy": 0.5, "loss": 1.0}\n')
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"question": "What is 4 + 4?", "answer": "eight"}\n')
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(app_url)
            page.get_by_role("tab", name="Answers").click()
            page.locator("#answers-run-folder textarea").fill(str(empty))
            page.locator("#answers-run-load").click()
            status = page.locator("#answers-run-status")
            expect(status).to_contain_text("holds no outcomes.jsonl", timeout=WAIT_MS)
            expect(status).to_contain_text("give the --out folder of a finished `bsi compress` run".replace("`", ""))
            assert page.locator("#answers-run-table tbody tr").count() <= 1  # no rows (an empty table keeps one)
            expect(page.locator("#answers-run-table")).not_to_contain_text("✓")

            page.get_by_role("tab", name="A sweep").click()
            expect(page.locator("#answers-sweep-status")).to_contain_text("evaluated models")  # drawn, first sweep in
            fill_when_shown(page, "#answers-sweep-folder textarea", str(no_answers))
            page.locator("#answers-sweep-load").click()
            expect(page.locator("#answers-sweep-status")).to_contain_text("no per-problem outcomes", timeout=WAIT_MS)
            expect(page.locator("#answers-problem-table")).not_to_contain_text("bsi @")

            page.get_by_role("tab", name="Compare").click()
            expect(page.locator("#compare-status")).to_contain_text("evaluated models")
            fill_when_shown(page, "#compare-folder textarea", str(empty))
            page.locator("#compare-load").click()
            expect(page.locator("#compare-status")).to_contain_text("give a sweep folder holding results.jsonl",
                                                                    timeout=WAIT_MS)

            page.get_by_role("tab", name="Chat").click()
            fill_when_shown(page, "#chat-prompts-file textarea", str(prompts))
            page.locator("#chat-prompts-run").click()
            chat_status = page.locator("#chat-prompts-status")
            expect(chat_status).to_contain_text('line 1: the answer "eight" has no final number', timeout=WAIT_MS)
            page.screenshot(path=str(ARTIFACTS / "bad-inputs.png"), full_page=True)
        finally:
            browser.close()
