"""The rendered walkthroughs (``notebooks/render.py``, ``make walkthroughs``): outputs that read anywhere, timed.

One notebook is rendered for real on the tiny model into a temporary folder
(a fresh kernel, kaleido drawing its figures in Debian's Chromium); the
test reads the copies back: the HTML page holds the outputs and loads
nothing from the network, the Markdown copy's images exist and are real
PNG figures, the times file round-trips and the notebook's first cell opens
with the line made from it. The committed copies in ``docs/walkthroughs/``
must come from the current notebook sources (each copy carries its
source's SHA-256).
"""

from __future__ import annotations

import ast
import html
import json
import re
import shutil
import struct
import time
from pathlib import Path

import nbformat
import pytest
from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "walkthroughs"
CHROMIUM = "/usr/bin/chromium"
#: the notebooks rendered on the tiny model: figures, formulas (04) and interactive views with (03) and without
#: (04) plotly FigureWidgets
STEMS = ("03_pruning_rounds", "04_curvature")
PLOTLY = "application/vnd.plotly.v1+json"
NETWORK = re.compile(r"""(?:<script[^>]*\bsrc|<link[^>]*\bhref|<img[^>]*\bsrc)\s*=\s*["']?\s*(?:https?:)?//"""
                     r"""|@import\s+(?:url\()?\s*["']?(?:https?:)?//|url\(\s*["']?(?:https?:)?//""", re.I)


def _load(name: str):
    return load_script(ROOT / "notebooks" / f"{name}.py", f"notebook_{name}")


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG file"
    return struct.unpack(">II", data[16:24])


def _images(markdown: str) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", markdown)


def _texts(nb) -> list[str]:
    """The printed outputs of an executed notebook (streams), line by line."""
    return [line for c in nb.cells for o in c.get("outputs", []) if o.output_type == "stream"
            for line in o.text.splitlines() if line.strip()]


def test_runtime_line_comes_from_the_times_file(tmp_path):
    build = _load("build")
    times = {"date": "2026-11-26", "machine": {"cpu_cores": 2}, "notebooks": {
        "07_demo": {"not_cached_s": 542.2, "cached_s": 250.4, "caches": True, "tiny_s": 11.4},
        "08_once": {"not_cached_s": 65, "cached_s": 65, "caches": False, "tiny_s": 9, "date": "2026-11-27"},
        "09_tiny": {"tiny_s": 9.6}}}
    assert build.runtime_line("07_demo", times) == ("Run time on 2 CPU cores: 4 min 10 s with the fine-tune cached, "
                                                    "9 min 2 s without; 11 s on the tiny model (2026-11-26).")
    assert build.runtime_line("08_once", times) == ("Run time on 2 CPU cores: 1 min 5 s (nothing to fine-tune or "
                                                    "cache); 9 s on the tiny model (2026-11-27).")
    assert build.runtime_line("09_tiny", times) == "Run time on 2 CPU cores: 10 s on the tiny model (2026-11-26)."
    assert build.runtime_line("10_none", times) is None
    busy = {**times, "notebooks": {"07_demo": {**times["notebooks"]["07_demo"], "load_before": 1.8}}}
    assert build.runtime_line("07_demo", busy).endswith(
        "(2026-11-26; other work shared the cores, load 1.8 at the start: a quiet machine is faster).")
    quiet = {**times, "notebooks": {"07_demo": {**times["notebooks"]["07_demo"], "load_before": 0.3}}}
    assert build.runtime_line("07_demo", quiet) == build.runtime_line("07_demo", times)
    # measured: the other processes' CPU during the run decides, not the load average at its start
    measured = {**times, "notebooks": {"07_demo": {**times["notebooks"]["07_demo"], "load_before": 1.8,
                                                   "other_cpu_cores": 0.05}}}
    assert build.runtime_line("07_demo", measured) == build.runtime_line("07_demo", times)
    shared = {**times, "notebooks": {"07_demo": {**times["notebooks"]["07_demo"], "other_cpu_cores": 0.9}}}
    assert build.runtime_line("07_demo", shared).endswith(
        "(2026-11-26; other work shared the cores, 0.9 of them on average: a quiet machine is faster).")
    stated = {**times, "notebooks": {"07_demo": {**times["notebooks"]["07_demo"], "load_before": 1.8, "quiet": True}}}
    assert build.runtime_line("07_demo", stated) == build.runtime_line("07_demo", times)
    capped = {**times, "machine": {"cpu_cores": 2, "OMP_NUM_THREADS": "1"}}
    assert build.runtime_line("09_tiny", capped).startswith("Run time on 2 CPU cores (OMP_NUM_THREADS=1): 10 s")
    source = tmp_path / "07_demo.py"
    source.write_text("# %% [markdown]\n# # 07 · A title\n#\n# First paragraph.\n\n# %%\nx = 1\n\n"
                      "# %% [markdown]\n# # Second\n")
    nb = build.build_notebook(source, times)
    assert nb.cells[0].source == f"# 07 · A title\n\n{build.runtime_line('07_demo', times)}\n\nFirst paragraph."
    assert nb.cells[2].source == "# Second"  # only the first Markdown cell gets it
    assert build.build_notebook(source).cells[0].source == "# 07 · A title\n\nFirst paragraph."  # no times: no line


def test_formulas_become_mathml_and_code_stays():
    render = _load("render")
    text = render.tex_to_mathml("Keep `$x$` and\n```\n$$y$$\n```\nbut $a_i^2$ and $$\\frac{1}{2}$$; costs 5 $ or \\frac{")
    assert "`$x$`" in text and "```\n$$y$$\n```" in text  # code is code
    assert text.count("<math") == 2 and '<math display="block">' in text and "<mfrac>" in text
    assert "http" not in text  # no namespace URL left in the page
    assert "5 $ or" in text  # a lone dollar is prose


def test_temporary_paths_names_the_cells_that_print_the_renders_scratch_folder(tmp_path):
    render = _load("render")
    scratch = tmp_path / "bsi-walkthroughs-x"
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell(f"Not an output: {scratch}"),
        nbformat.v4.new_code_cell("print(path)", outputs=[nbformat.v4.new_output(
            "stream", name="stdout", text=f"stage 1: done\nstage 1: {scratch}/cache-1/finetuned/ab12\n")]),
        nbformat.v4.new_code_cell("path", outputs=[nbformat.v4.new_output(
            "execute_result", data={"text/plain": f"PosixPath('{scratch}/tmpq1')"}, execution_count=1)]),
        nbformat.v4.new_code_cell("1", outputs=[nbformat.v4.new_output("stream", name="stdout", text="1\n")])])
    assert render.temporary_paths(nb, scratch) == [f"cell 2: stage 1: {scratch}/cache-1/finetuned/ab12",
                                                   f"cell 3: PosixPath('{scratch}/tmpq1')"]
    assert render.temporary_paths(nb, tmp_path / "elsewhere") == []


def test_cli_refuses_a_tiny_render_into_docs_and_unknown_notebooks(capsys):
    render = _load("render")
    with pytest.raises(SystemExit):
        render.main(["--model", "tiny-random-llama"])
    assert "give --out" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        render.main(["--only", "99"])
    assert "no notebook numbered 99" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_render(tmp_path_factory):
    """``(times, out)``: :data:`STEMS` rendered on the tiny model into a temporary folder, once for this module."""
    if shutil.which(CHROMIUM) is None:
        pytest.skip("chromium missing: run `make chromium` (apt-get, as root)")
    out = tmp_path_factory.mktemp("walkthroughs")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", "1")  # two shared cores: threads would only fight
        times = _load("render").render(STEMS, "tiny-random-llama", out, log=lambda line: None)
    return times, out


def _outputs(nb) -> list:
    return [o for c in nb.cells for o in c.get("outputs", [])]


def _notes(outputs: list) -> list[str]:
    """The notes that stand for interactive views (the renderer's static copies)."""
    return [o.data["text/markdown"] for o in outputs if "Interactive view" in o.get("data", {}).get("text/markdown", "")]


@pytest.mark.parametrize("stem", STEMS)
def test_tiny_render_reads_anywhere(stem, tiny_render):
    times, out = tiny_render
    render, build = _load("render"), _load("build")

    # the times file round-trips and the notebook's first cell opens with the line made from it
    assert build.load_times(out / "times.json") == json.loads(json.dumps(times))
    entry = times["notebooks"][stem]
    assert entry["model"] == "tiny-random-llama" and entry["tiny_s"] > 0 and "not_cached_s" not in entry
    assert entry["source_sha256"] == render.source_hash(stem) and times["machine"]["cpu_cores"] >= 1
    line = build.runtime_line(stem, times)
    assert line.startswith("Run time on ") and line.endswith(f"on the tiny model ({entry['date']}).")
    first = next(c for c in build.build_notebook(ROOT / "notebooks" / "src" / f"{stem}.py", times).cells
                 if c.cell_type == "markdown")
    assert first.source.splitlines()[2] == line  # under the title

    executed = nbformat.read(out / f"{stem}.ipynb", as_version=4)  # what JupyterLab opens, outputs included
    assert executed.cells[0].source == first.source and not {"widgets", render.FIGURE_STATE} & set(executed.metadata)
    outputs = _outputs(executed)
    figures = [o for o in outputs if render.PLOTLY in o.get("data", {})]
    assert len(figures) >= 2 and not any(render.WIDGET_VIEW in o.get("data", {}) for o in outputs)
    notes = _notes(outputs)
    assert notes  # each notebook's interactive views (03 has two), shown as the notebook left them
    printed = _texts(executed)
    assert any(t.startswith("Result: ") for t in printed)

    page = (out / f"{stem}.html").read_text(encoding="utf-8")
    assert render.stamp_of(page) == {"notebook": stem, "model": "tiny-random-llama", "date": entry["date"],
                                     "source_sha256": entry["source_sha256"]}
    assert not NETWORK.findall(page), NETWORK.findall(page)[:3]
    assert re.findall(r'<script[^>]*\bsrc="([^"]+)"', page) == [render.PLOTLY_JS]
    assert (out / render.PLOTLY_JS).stat().st_size > 1_000_000  # the local plotly.js the figures draw with
    assert page.count('class="plotly-graph-div"') == len(figures)
    shown = html.unescape(re.sub(r"<[^>]+>", "", page))  # the page's text: ANSI colours and escapes taken off
    assert line in shown and all(t in shown for t in printed)  # the run-time line and every printed line

    markdown = (out / f"{stem}.md").read_text(encoding="utf-8")
    assert render.stamp_of(markdown) == render.stamp_of(page)
    assert "bsi-walkthroughs-" not in markdown  # no path into the render's temporary folder (its caches, TMPDIR)
    assert line in markdown and all(t in markdown for t in printed) and all(n in markdown for n in notes)
    assert "plotly" not in markdown.lower().split("```")[-1]  # no figure left as script or JSON after the code
    images = _images(markdown)
    assert len(images) == len(figures) and all(not i.startswith(("http:", "https:", "/")) for i in images)
    for image, figure in zip(images, figures):
        data = (out / image).read_bytes()
        width, height = _png_size(data)
        assert len(data) > 10_000 and width >= 400 and height >= 200  # a drawn figure, not a blank
        layout = figure["data"][render.PLOTLY].get("layout", {})  # drawn at 1.5x the size the figure asks for
        assert (width, height) == (round(1.5 * layout.get("width", render.PNG_SIZE[0])),
                                   round(1.5 * layout.get("height", render.PNG_SIZE[1]))), image
    assert len({(out / i).read_bytes() for i in images}) == len(images)  # every figure its own picture

    # "What the data say": the notebook keeps its code, folded; the pages show only the reading it wrote
    folded = [c for c in executed.cells if build.HIDE_INPUT in c.metadata.get("tags", ())]
    assert len(folded) == 1 and folded[0].metadata["jupyter"] == {"source_hidden": True}
    reading = "".join(o.get("data", {}).get("text/markdown", "") for o in folded[0].outputs)
    code = max(folded[0].source.splitlines(), key=len).strip()  # its longest line: in no page
    assert reading and code not in markdown and code not in shown
    assert reading.splitlines()[0][:60] in markdown


def test_interactive_views_are_shown_as_the_notebook_left_them(tiny_render):
    _, out = tiny_render
    rounds = _outputs(nbformat.read(out / "03_pruning_rounds.ipynb", as_version=4))
    start = next(n for n, o in enumerate(rounds) if "Interactive view" in o.get("data", {}).get("text/markdown", ""))
    note, info, *figures = rounds[start:start + 4]
    assert "`round = 1`" in note.data["text/markdown"] and "`layer = model.layers." in note.data["text/markdown"]
    assert "round 1: rank" in info.data["text/plain"]  # the HTML line above the plots
    for figure in figures:  # the FigureWidgets after show_round() filled them, not their empty first state
        traces = figure.data[PLOTLY]["data"]
        assert sum(len(t.get("x", [])) for t in traces) > 0
    curvature = _outputs(nbformat.read(out / "04_curvature.ipynb", as_version=4))
    (note,) = _notes(curvature)
    assert "`error e = 0.1`" in note and "`bases n = 128`" in note  # its sliders' values
    page = (out / "04_curvature.html").read_text(encoding="utf-8")
    assert "<math" in page and "$$" not in page  # formulas as MathML, none left for a script to typeset


def test_committed_walkthroughs_match_the_notebook_sources():
    render, build = _load("render"), _load("build")
    stems = [s.stem for s in build.sources()]
    if not any((DOCS / f"{stem}.md").exists() for stem in stems):
        pytest.skip("no rendered walkthroughs committed yet in docs/walkthroughs/ (run `make walkthroughs`)")
    times = build.load_times(DOCS / "times.json")
    for stem in stems:
        html_path, md_path = DOCS / f"{stem}.html", DOCS / f"{stem}.md"
        if not md_path.exists():  # a render stopped part-way: this one is listed as not rendered, with no time
            assert not html_path.exists() and stem not in times["notebooks"], f"{stem}: half rendered"
            continue
        assert html_path.exists(), f"{stem}: no HTML copy beside its Markdown (run `make walkthroughs`)"
        page, markdown = html_path.read_text(encoding="utf-8"), md_path.read_text(encoding="utf-8")
        stamp = render.stamp_of(markdown)
        assert stamp and stamp == render.stamp_of(page)
        assert stamp["model"] == render.MODELS["embedded"], f"{stem}: rendered on {stamp['model']}"
        assert stamp["source_sha256"] == render.source_hash(stem), (
            f"{stem}: the rendered copy is older than notebooks/src/{stem}.py (run `make walkthroughs`)")
        entry = times["notebooks"][stem]
        assert all(entry[k] > 0 for k in ("not_cached_s", "cached_s", "tiny_s"))
        assert entry["cached_s"] < entry["not_cached_s"] if entry["caches"] else entry["cached_s"] == entry["not_cached_s"]
        if "cached_s_derived_from" in entry:  # run once: an earlier notebook measured what the same cache costs
            measured = times["notebooks"][entry["cached_s_derived_from"]]
            assert measured["cache_entries"] == entry["cache_entries"] and "cached_s_derived_from" not in measured
        assert build.runtime_line(stem, times) in markdown
        assert "bsi-walkthroughs-" not in markdown, f"{stem} prints a path into the render's temporary folder"
        assert not NETWORK.findall(page)
        assert all((DOCS / image).is_file() for image in _images(markdown))
    assert (DOCS / render.PLOTLY_JS).is_file()


#: A walkthrough cell that quotes the library: ``display(Markdown(doc_markdown(...)...))`` on one line.
QUOTE = re.compile(r"^display\(Markdown\((doc_markdown\(.*)\)\)\s*$")


def _quotes(stem: str) -> list[tuple[str, str]]:
    """``(expression, text now)`` of every docstring the walkthrough ``stem`` quotes, evaluated after its imports."""
    source = (ROOT / "notebooks" / "src" / f"{stem}.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    imports = ast.Module([node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))], [])
    namespace: dict = {}
    exec(compile(imports, f"notebooks/src/{stem}.py", "exec"), namespace)
    return [(m.group(1), eval(m.group(1), namespace)) for m in map(QUOTE.match, source.splitlines()) if m]


def test_committed_walkthroughs_quote_the_library_as_it_is_now():
    """A docstring changed after the render would show students old text: every quoted line must still be there.

    A quote cut short (``doc_markdown(..., paragraphs=n)``) is checked as far as it goes, its link to the rest
    as the rendered copy writes it (:func:`relink`, from ``docs/walkthroughs/``).
    """
    render, build = _load("render"), _load("build")
    rendered = [s.stem for s in build.sources() if (DOCS / f"{s.stem}.md").exists()]
    if not rendered:
        pytest.skip("no rendered walkthroughs committed yet in docs/walkthroughs/ (run `make walkthroughs`)")
    quoted = 0
    for stem in rendered:
        markdown = (DOCS / f"{stem}.md").read_text(encoding="utf-8")
        for expression, text in _quotes(stem):
            stale = [line for line in render.relink(text, "md").splitlines() if line.strip() and line not in markdown]
            assert not stale, (f"{stem} quotes {expression}, whose text changed since the render (first changed "
                               f"line: {stale[0]!r}): render it again (`make walkthroughs`)")
            quoted += 1
    assert quoted >= 10  # the walkthroughs quote the library throughout; the pattern still finds those cells


def test_the_render_measures_the_cpu_other_processes_use():
    """The machine's busy CPU grows by at least what this process burns, and this process's own count sees it too."""
    render = _load("render")
    busy, own = render.busy_cpu_seconds(), render.own_cpu_seconds()
    if busy is None:
        pytest.skip("no /proc/stat here")
    start = time.process_time()
    while time.process_time() - start < 0.3:
        pass
    assert render.own_cpu_seconds() - own >= 0.25
    assert render.busy_cpu_seconds() - busy >= 0.25
