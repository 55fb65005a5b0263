"""The teaching notebooks: committed without outputs, in sync with their sources, and runnable.

Every notebook is executed headlessly on the tiny random model
(``BSI_NOTEBOOK_MODEL=tiny-random-llama``), in a fresh kernel of *this*
interpreter, with a private bsi cache; a cell error fails the test. Each
notebook ends with a cell that sets ``outcome`` (a dict of its key numbers)
and prints ``Result: ...``; each must have drawn plotly figures, and its
``outcome`` must show what the notebook teaches (:data:`CHECKS`).

Every notebook ends with a recap, at least three exercises whose solutions
open on demand (``<details>`` blocks in Markdown cells) and a further-reading
list citing both papers; the code of every solution is run after the
notebook, in the same kernel, so a solution that no longer matches the API
fails here.

Two notebooks (:data:`RENDERED`) are also rendered here as ``make
walkthroughs`` renders them (a fresh kernel, kaleido drawing the figures in
Debian's Chromium) and the copies are read back: the HTML page holds the
outputs and loads nothing from the network, the Markdown copy's images are
real PNG figures at their own sizes, the times file round-trips and the
first cell opens with the line made from it. That render's run is also
their run for the checks above: each notebook is executed once.
"""

from __future__ import annotations

import copy
import html
import json
import math
import os
import re
import shutil
import struct
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import NETWORK, load_script, markdown_images

if TYPE_CHECKING:  # nbformat is imported by the tests that read notebooks: every pytest-xdist worker collects this
    # file, and nbformat's import (jsonschema building its IRI grammar, ~2 s) is paid only where notebooks are read
    import nbformat

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"
#: per notebook: (plotly figures at least, an ipywidgets view expected)
KEY_OUTPUTS = {"01": (4, False), "02": (10, False), "03": (4, True), "04": (2, True), "05": (1, False),
               "06": (1, False)}


def _check_reparameterization(o: dict) -> None:
    assert o["logit_change"] < 1e-4 * o["logit_scale"]  # the whole model in Basel form computes what it did
    assert all(e < 1e-5 for e in o["exact_error"].values())  # both bases are exact at start
    half = o["output_error_at_half"]
    assert 0 < half["whitened"] < half["plain SVD"] < 1  # whitened bases lose less output on held-out inputs
    # section 4: every tail cut was measured on real text, and each kind of basis has a break-even share
    assert math.isfinite(o["text_loss"]) and o["tail_losses"] and all(math.isfinite(v) and v > 0
                                                                     for v in o["tail_losses"].values())
    assert o["break_even_share"] and all(0 <= v <= 1 for v in o["break_even_share"].values())


def _check_scoring(o: dict) -> None:
    assert o["terms_add_up"] and o["fisher_min"] >= 0  # a score is the sum of its terms; the Fisher is positive
    assert len(set(o["pruned"].values())) == 1 and min(o["pruned"].values()) > 0  # one budget for every score
    errors = o["probe_errors"]  # Hutchinson's error against the exact diagonal, by probes
    assert errors[max(errors, key=int)] < errors["1"] and o["relative_error"]["hutchinson"] < 0.5
    assert all(math.isfinite(e) for e in o["prediction_error"].values())
    cuts = o["whole_cuts"]  # section 6: two rounds of a real run, every cut of the same size measured
    assert len(cuts) == 2 and all({"before", "bsi", "magnitude", "bsi budgets, magnitude inside"} <= set(c) for c in cuts)
    assert all(math.isfinite(v) for c in cuts for v in c.values())


def _check_rounds(o: dict) -> None:
    assert o["rounds"] >= 2 and all(r > 0 for r in o["removed"]) and o["ranks_fall"]
    assert abs(o["compressible_share"] - o["target"]) < 0.02  # size mode target lands on the target
    assert all(after >= 0 and math.isfinite(before) for before, after in o["cuts"])
    assert set(o["types"]) <= {"LowRankLinear", "Linear"}  # recovery trained the exported factors
    assert o["params"][1] < o["params"][0] and all(math.isfinite(x) for x in o["loss"])


def _check_curvature(o: dict) -> None:
    assert all(a < 1e-4 for a in o["symmetric"])  # the exact Hessian blocks are symmetric
    errors = o["simulated_error"]
    assert errors["512"] < errors["1"] / 4  # Hutchinson's error falls like 1/sqrt(probes)


def _check_comparison(o: dict) -> None:
    rows, (methods, sizes) = o["rows"], o["grid"]
    assert rows[0]["method"] == "dense" and len({r["method"] for r in rows}) == 1 + methods and methods >= 2
    assert len(rows) == 1 + methods * sizes  # the dense model, then every method at every size, one run each
    for row in rows[1:]:  # every method compressed to the asked size, and still computes a finite loss
        assert abs(row["compressible_ratio"] - row["target"]) < 0.02 and math.isfinite(row["loss"])
    assert o["intervals"] and all(low <= mid <= high for low, mid, high in o["intervals"])
    assert set(o["answers"].values()) == {3}  # every model's answers to the same three questions
    assert o["marked"] and all(isinstance(c, bool) for c in o["marked"])  # each answer marked right or wrong


def _check_text(o: dict) -> None:
    for perplexity, loss in zip(o["perplexity"], o["loss"]):  # the perplexity is exp of the mean next-token loss
        assert math.isfinite(loss) and abs(perplexity - math.exp(loss)) < 1e-6 * perplexity
    assert o["tokens_scored"] == o["windows"] * (o["window"] - 1)  # each window's first token is context only
    for pooled, loss in zip(o["pooled_loss"], o["loss"]):  # the loss is token-weighted over the windows' sums
        assert abs(pooled - loss) < 1e-6 * max(1.0, loss)
    assert o["params"][1] < o["params"][0] and abs(o["compressible_share"] - o["target"]) < 0.02
    assert o["rounds"] >= 2 and o["recover_steps"] > 0
    assert o["finetune"][1] < o["finetune"][0]  # stage 1 lowered the training loss


CHECKS = {"01": _check_reparameterization, "02": _check_scoring, "03": _check_rounds, "04": _check_curvature,
          "05": _check_comparison, "06": _check_text}


def _builder():
    return load_script(NOTEBOOK_DIR / "build.py", "notebook_build")


def test_every_notebook_has_a_source_and_none_holds_outputs():
    build = _builder()
    assert len(NOTEBOOKS) >= 3 and len(build.sources()) == len(NOTEBOOKS)
    assert build.check() == []  # stale, missing, extra or output-carrying notebooks are listed here


def test_builder_reads_the_percent_format_and_detects_outputs(tmp_path):
    import nbformat

    build = _builder()
    cells = build.parse_cells("header\n# %% [markdown]\n# # Title\n#\n# text\n\n# %%\nx = 1\n\n# %%\n\n"
                              '# %% tags=["hide-input"]\nprint(x)\n')
    assert cells == [("markdown", "# Title\n\ntext", ()), ("code", "x = 1", ()), ("code", "print(x)", ("hide-input",))]
    source = tmp_path / "07_demo.py"
    source.write_text("# %%\nprint(1)\n")
    nb = build.build_notebook(source)
    assert not build.has_outputs(nb) and nb.cells[0].id == "07-000" and not nb.cells[0].metadata
    source.write_text('# %% tags=["hide-input"]\nprint(1)\n')
    assert build.build_notebook(source).cells[0].metadata == {"tags": ["hide-input"], "jupyter": {"source_hidden": True}}
    source.write_text("# %%\nprint(1)\n")
    nb = build.build_notebook(source)
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", text="1\n")]
    assert build.has_outputs(nb)
    with pytest.raises(ValueError, match="markdown line"):
        build.parse_cells("# %% [markdown]\nnot a comment\n")


#: A solution block in a Markdown cell: its Python code, to run after the notebook.
SOLUTION = re.compile(r"<details><summary>Solution</summary>\s*```python\n(.*?)```.*?</details>", re.S)
PAPERS = ("arXiv:2605.01627", "arXiv:2405.15877")  # BSI, Basel


def solutions(nb) -> list[str]:
    """The code of every exercise's solution, in order."""
    return [code for cell in nb.cells if cell.cell_type == "markdown" for code in SOLUTION.findall(cell.source)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_ends_with_what_the_data_say_a_recap_exercises_and_further_reading(path):
    import nbformat

    nb = nbformat.read(path, as_version=4)
    markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    headings = re.findall(r"^## (.+)$", markdown, re.M)
    # every walkthrough interprets its own results in "What the data say", just before or just after its recap
    assert headings[-4:] in (["What the data say", "Recap", "What to try", "Further reading"],
                             ["Recap", "What the data say", "What to try", "Further reading"])
    assert len(solutions(nb)) >= 3 and markdown.count("<details>") == markdown.count("</details>") == len(solutions(nb))
    assert markdown.count("What you should see") >= len(solutions(nb))  # each solution says what to look for
    reading = markdown.split("## Further reading")[1]
    assert all(paper in reading for paper in PAPERS) and "docs/" in reading


def test_introductions_list_the_sections_and_quantities_are_defined_before_use():
    import nbformat

    for path in NOTEBOOKS:
        cells = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown"]
        lists: list[list[int]] = []  # the introduction's numbered lists; the last one names the sections
        for number in map(int, re.findall(r"^(\d+)\. ", cells[0], re.M)):
            lists.extend([[]] if number == 1 else [])
            lists[-1].append(number)
        listed = lists[-1] if lists else []
        sections = [int(n) for n in re.findall(r"^## (\d+)\. ", "\n".join(cells), re.M)]
        assert not listed or listed == sections, f"{path.stem}: intro lists {listed}, sections {sections}"
    curvature = [c.source for c in nbformat.read(NOTEBOOK_DIR / "04_curvature.ipynb", as_version=4).cells]
    first_use = next(n for n, c in enumerate(curvature) if "H_{n,2a}" in c)
    assert "generalized harmonic number" in curvature[first_use] and "zeta" in curvature[first_use]
    scoring = "\n".join(c.source for c in nbformat.read(NOTEBOOK_DIR / "02_importance_scoring.ipynb", 4).cells)
    assert "defaults_table_markdown(" in scoring and "three lines" in scoring


def _texts(nb) -> list[str]:
    out = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.output_type == "stream":
                out.append(output.text)
            elif output.output_type in ("execute_result", "display_data"):
                out.append(str(output.data.get("text/plain", "")))
    return out


#: the last cell appended to every run: which interpreter and bsi the kernel ran, and the notebook's ``outcome``
PROBE = ("import sys, json, bsi\nprint('KERNEL', sys.executable, bsi.__file__)\n"
         "print('OUTCOME', json.dumps(outcome, default=float))")


def with_exercises(nb) -> tuple[nbformat.NotebookNode, int]:
    """A copy of ``nb`` with its exercises' solutions and :data:`PROBE` appended, and how many cells were appended."""
    import nbformat

    nb = copy.deepcopy(nb)
    extra = [nbformat.v4.new_code_cell(code) for code in solutions(nb)] + [nbformat.v4.new_code_cell(PROBE)]
    nb.cells.extend(extra)
    return nb, len(extra)


def run_with_exercises(path: Path, tmp_path: Path, monkeypatch) -> nbformat.NotebookNode:
    """``path`` run headlessly on the tiny model with its solutions and :data:`PROBE` after it, every output kept."""
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("BSI_NOTEBOOK_MODEL", "tiny-random-llama")
    monkeypatch.setenv("BSI_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # two shared cores: threads would only fight
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    nb, _ = with_exercises(nbformat.read(path, as_version=4))
    client = NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=False,
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    assert not list(tmp_path.glob("*.ipynb"))  # executing wrote nothing next to the notebook
    return nb


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_on_the_tiny_model(path, tmp_path, monkeypatch, request):
    """Each notebook, its exercises' solutions after it, runs without an error and its ``outcome`` shows what it teaches.

    The notebooks the renderer is tested on (:data:`RENDERED`) are checked on
    that render's run (:func:`tiny_render`), so that each is executed once;
    without Chromium they run here.
    """
    if path.stem in RENDERED and shutil.which(CHROMIUM):
        nb = request.getfixturevalue("tiny_render")[2][path.stem]
    else:
        nb = run_with_exercises(path, tmp_path, monkeypatch)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    probe = nb.cells[-1]
    assert probe.source == PROBE
    kernel_line, outcome_line = "".join(o.text for o in probe.outputs if o.output_type == "stream").splitlines()
    kernel_line = kernel_line.split()
    assert kernel_line[1] == sys.executable  # the kernel is this interpreter (the venv's python)
    assert Path(kernel_line[2]).is_relative_to(ROOT)  # and imports this checkout's bsi
    texts = _texts(nb)
    assert any(t.startswith("Result: ") for t in texts), "the closing cell printed no 'Result:' line"
    outputs = [o for c in nb.cells for o in c.get("outputs", [])]
    min_figures, widget = KEY_OUTPUTS[path.stem[:2]]
    assert sum(PLOTLY in o.get("data", {}) for o in outputs) >= min_figures
    if widget:  # FigureWidget / ipywidgets views rendered (anywidget installed, widget state saved)
        assert any(WIDGET in o.get("data", {}) for o in outputs if "VBox" in str(o.get("data", {}).get("text/plain")))
    CHECKS[path.stem[:2]](json.loads(outcome_line.removeprefix("OUTCOME ")))


# ------------------------------------------------------------------ the renderer on the tiny model
CHROMIUM = "/usr/bin/chromium"
#: the notebooks rendered on the tiny model (``notebooks/render.py``): figures, formulas (04) and interactive views
#: with (03) and without (04) plotly FigureWidgets
RENDERED = ("03_pruning_rounds", "04_curvature")


def _load_render():
    return load_script(NOTEBOOK_DIR / "render.py", "notebook_render")


@pytest.fixture(scope="module")
def tiny_render(tmp_path_factory):
    """``(times, out, runs)``: :data:`RENDERED` rendered on the tiny model into a temporary folder, once for this module.

    The renderer runs as ``make walkthroughs`` runs it, with one addition: its
    :func:`execute` is wrapped so that each notebook's run also runs the
    exercises' solutions and :data:`PROBE` in the same kernel, after the
    notebook. The wrapper takes those cells off again before the renderer
    sees the run, so the copies are a plain render's; ``runs[stem]`` is the
    whole run, every output as the kernel gave it (before the static copy),
    for :func:`test_notebook_runs_on_the_tiny_model`.
    """
    if shutil.which(CHROMIUM) is None:
        pytest.skip("chromium missing: run `make chromium` (apt-get, as root)")
    render = _load_render()
    execute, runs = render.execute, {}

    def execute_with_exercises(notebook, model, cache, workdir, *args, **kwargs):
        nb, extra = with_exercises(notebook)
        done = execute(nb, model, cache, workdir, *args, **kwargs)
        assert not list(Path(workdir).glob("*.ipynb"))  # executing wrote nothing next to the notebook
        stem = next(s for s in RENDERED if s[:2] == notebook.cells[0].id[:2])
        runs[stem] = copy.deepcopy(done.notebook)
        del done.notebook.cells[-extra:]
        return done

    out = tmp_path_factory.mktemp("walkthroughs")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", "1")  # two shared cores: threads would only fight
        env.setattr(render, "execute", execute_with_exercises)
        times = render.render(RENDERED, "tiny-random-llama", out, log=lambda line: None)
    assert sorted(runs) == sorted(RENDERED)
    return times, out, runs


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG file"
    return struct.unpack(">II", data[16:24])


def _printed_lines(nb) -> list[str]:
    """The printed outputs of an executed notebook (streams), line by line."""
    return [line for c in nb.cells for o in c.get("outputs", []) if o.output_type == "stream"
            for line in o.text.splitlines() if line.strip()]


def _outputs(nb) -> list:
    return [o for c in nb.cells for o in c.get("outputs", [])]


def _notes(outputs: list) -> list[str]:
    """The notes that stand for interactive views (the renderer's static copies)."""
    return [o.data["text/markdown"] for o in outputs if "Interactive view" in o.get("data", {}).get("text/markdown", "")]


@pytest.mark.parametrize("stem", RENDERED)
def test_tiny_render_reads_anywhere(stem, tiny_render):
    import nbformat

    times, out, _ = tiny_render
    render, build = _load_render(), _builder()

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
    printed = _printed_lines(executed)
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
    images = markdown_images(markdown)
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
    import nbformat

    _, out, _ = tiny_render
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
