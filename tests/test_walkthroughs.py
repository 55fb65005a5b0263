"""The rendered walkthroughs (``notebooks/render.py``, ``make walkthroughs``): the committed copies and the renderer's parts.

The committed copies in ``docs/walkthroughs/`` must come from the current
notebook sources (each copy carries its source's SHA-256) and quote the
library as it is now. The renderer's run on the tiny model (a fresh kernel,
kaleido drawing its figures in Debian's Chromium, the copies read back) is
in ``tests/test_notebooks.py``: that run is also those notebooks' run for
the notebook checks, so each notebook is executed once.
"""

from __future__ import annotations

import ast
import re
import time
from pathlib import Path

import pytest
from conftest import NETWORK, load_script, markdown_images

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "walkthroughs"


def _load(name: str):
    return load_script(ROOT / "notebooks" / f"{name}.py", f"notebook_{name}")


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
    import nbformat  # here, not at the top: every pytest-xdist worker collects this file (tests/test_notebooks.py)

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
        assert all((DOCS / image).is_file() for image in markdown_images(markdown))
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
