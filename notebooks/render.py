"""Run the teaching notebooks, time them, and write copies with their outputs that read anywhere (``make walkthroughs``).

Each notebook (``notebooks/NN_name.ipynb``) is executed in a fresh kernel
(nbclient) with a bsi cache of its own, and its wall time measured, kernel
start included. Into the output folder (``docs/walkthroughs/`` for the
embedded model) go, per notebook:

* ``NN_name.html``: the page with every output, offline. Its figures are
  plotly's, interactive, drawn by one shared ``plotly.min.js`` in the same
  folder (4.6 MB once, not inlined into six pages); formulas are MathML,
  converted here (latex2mathml), so the page loads no script from anywhere;
* ``NN_name.md`` and ``NN_name_files/*.png``: the same in Markdown, each figure
  a static PNG (kaleido, which drives a headless Chromium), for code hosts and
  plain Markdown viewers, which draw no plotly figure;
* ``NN_name.ipynb``: the executed notebook, for JupyterLab;

and for all of them ``times.json``: the measured seconds and how each was
measured. Interactive views (ipywidgets with a FigureWidget) cannot run
without a kernel: the copies show them as the notebook left them,
their controls' values as a line of text. Every copy carries the SHA-256 of
its source (``notebooks/src/NN_name.py``) so a test can tell a stale copy.
A notebook's links are written for ``notebooks/``; each copy's are
rewritten for the folder it lives in (:func:`relink`), the "Next:" link
leading to the next page of the same kind.

How the times are measured, on the embedded model (the default): a
notebook first runs with a fresh, empty cache that holds only the converted
embedded model (*not cached*: it pays its own fine-tune); if that run left
anything in the cache (a fine-tune), it runs a second time on that cache
(*cached*), and the difference is what that fine-tune costs. A notebook
that caches nothing is run once, its one time standing for both; one that
caches exactly what an earlier notebook did (notebooks 02, 03 and 05 share
one fine-tune) is run once too, its cached time being its first less the
cost measured before (``times.json`` names that notebook). Then each runs on
the tiny model, with a fresh cache. The copies show the first run's outputs. With ``--model tiny-random-llama`` only
the tiny run happens (tests and CI: seconds per notebook).

    python notebooks/render.py                                   # all, embedded model, into docs/walkthroughs
    python notebooks/render.py --only 01 03                      # some; the times of the others are kept
    python notebooks/render.py --model tiny-random-llama --out /tmp/w   # quick, anywhere but docs/
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import datetime
import hashlib
import html
import importlib.util
import json
import os
import platform
import posixpath
import re
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import nbformat
from jinja2 import DictLoader
from nbclient import NotebookClient
from nbconvert import HTMLExporter, MarkdownExporter
from nbconvert.preprocessors import TagRemovePreprocessor

from bsi.errors import BSIError
from bsi.files import atomic_write_json, atomic_write_text
from bsi.models import EMBEDDED_MODEL, TINY_MODEL, ensure_embedded_model

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DOCS = ROOT / "docs" / "walkthroughs"
PLOTLY = "application/vnd.plotly.v1+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
PLOTLY_JS = "plotly.min.js"
MODELS = {"embedded": EMBEDDED_MODEL, TINY_MODEL: TINY_MODEL}
#: nbconvert's lab template, less what it would fetch from a CDN (require.js, MathJax, mermaid, the widget
#: manager), plus the one local plotly.js every figure draws with.
PAGE_TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js_requirejs -%}<script src="{{ resources.plotly_js }}"></script>{%- endblock html_head_js_requirejs -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block extra_css -%}
<style>math { font-size: 1.15em; } math[display="block"] { margin: 0.8em 0; }</style>
{%- endblock extra_css -%}
"""
#: run after the notebook's own cells: the figures of its live FigureWidgets, whose saved widget state holds only the
#: first draw (later updates travel as messages, not state)
FIGURE_PROBE = """\
import json as _json, plotly.graph_objects as _go, plotly.utils as _pu
from ipywidgets.widgets.widget import _instances as _widgets
print(_json.dumps({_id: _w.to_plotly_json() for _id, _w in list(_widgets.items()) if isinstance(_w, _go.FigureWidget)},
                  cls=_pu.PlotlyJSONEncoder))
"""
FIGURE_STATE = "bsi_figure_widgets"
#: a figure's PNG size (layout pixels, drawn at 1.5x) where its layout sets none: plotly's own default
PNG_SIZE = (700, 500)
STAMP = re.compile(r"<!-- bsi walkthrough (\{.*?\}) -->")


def _load_builder():
    spec = importlib.util.spec_from_file_location("notebook_build", HERE / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _load_builder()


# ------------------------------------------------------------------ running
def busy_cpu_seconds() -> float | None:
    """CPU seconds the whole machine has spent busy since boot, all cores summed (``/proc/stat``; None elsewhere)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds of this process and of its children that have ended (the notebook kernels, once shut down)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class Execution(NamedTuple):
    """One timed run of a notebook: the executed copy, its wall seconds, and how busy the rest of the machine was."""

    notebook: nbformat.NotebookNode
    seconds: float
    other_cpu_cores: float | None  # CPU used meanwhile by other processes, in cores on average (None: not on Linux)


def execute(notebook: nbformat.NotebookNode, model: str, cache: Path, workdir: Path,
            timeout: int = 3600) -> Execution:
    """Run ``notebook`` (a copy) in a fresh kernel on ``model`` with the bsi cache ``cache``, timed.

    The kernel runs in ``workdir`` (also its ``TMPDIR``, so what a notebook
    leaves in temporary folders goes with it) with ``BSI_NOTEBOOK_MODEL``,
    ``BSI_CACHE``, no hub access, and this checkout first on its path; the seconds are the
    wall time of the whole execution, kernel start included (and a last
    cell, :data:`FIGURE_PROBE`, of milliseconds, whose output goes to the
    metadata ``bsi_figure_widgets``). A cell error raises (nbclient's
    CellExecutionError names the cell).

    How much other work ran meanwhile is measured rather than guessed: the
    machine's busy CPU seconds over the run, less this process's and its
    finished children's (the kernel), divided by the wall time. A load
    average taken at the start cannot tell the previous notebook's own run,
    just ended, from another job.
    """
    nb = copy.deepcopy(notebook)
    nb.cells.append(nbformat.v4.new_code_cell(FIGURE_PROBE))
    env = dict(os.environ, BSI_NOTEBOOK_MODEL=model, BSI_CACHE=str(cache), HF_HUB_OFFLINE="1", TMPDIR=str(workdir),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=False,
                            resources={"metadata": {"path": str(workdir)}})
    busy_before, own_before, start = busy_cpu_seconds(), own_cpu_seconds(), time.perf_counter()
    client.execute(env=env)
    seconds = time.perf_counter() - start
    busy_after = busy_cpu_seconds()
    other = None if busy_before is None or busy_after is None else \
        max(0.0, (busy_after - busy_before) - (own_cpu_seconds() - own_before)) / seconds
    probe = nb.cells.pop()
    nb.metadata[FIGURE_STATE] = json.loads("".join(o.text for o in probe.outputs if o.output_type == "stream"))
    return Execution(nb, seconds, other)


def temporary_paths(nb: nbformat.NotebookNode, folder: str | Path) -> list[str]:
    """Where the outputs of executed ``nb`` show ``folder``, as ``cell N: the line`` (N counts every cell from 1).

    ``folder`` is the render's scratch folder: the bsi caches and the
    ``TMPDIR`` its runs use live there, and vanish with it, so a path into it
    means nothing to a reader (the notebook should print what reads anywhere,
    e.g. "from the cache").
    """
    folders = {str(folder), os.path.realpath(folder)}
    found = []
    for number, cell in enumerate(nb.cells, 1):
        for output in cell.get("outputs", []):
            texts = [output.get("text", ""), *output.get("traceback", []),
                     *(v for k, v in output.get("data", {}).items() if k.startswith("text/") and isinstance(v, str))]
            found += [f"cell {number}: {line.strip()}" for text in texts for line in text.splitlines()
                      if any(f in line for f in folders)]
    return list(dict.fromkeys(found))


def fresh_cache(root: Path, with_embedded: bool) -> Path:
    """An empty bsi cache under ``root``; with ``with_embedded``, holding (a link to) the converted embedded model."""
    cache = Path(tempfile.mkdtemp(prefix="cache-", dir=root))
    if with_embedded:
        model = ensure_embedded_model()  # converted once in the user's cache; only linked here
        (cache / "models").mkdir()
        (cache / "models" / model.name).symlink_to(model, target_is_directory=True)
    return cache


def cache_entries(cache: Path) -> frozenset[str]:
    """What a run left in ``cache``: its entries two levels down (``finetuned/<key>``), the embedded model's link aside."""
    return frozenset(str(p.relative_to(cache)) for p in cache.glob("*/*") if not p.is_symlink())


def measure(stem: str, notebook: nbformat.NotebookNode, model: str, scratch: Path,
            costs: dict[frozenset[str], tuple[float, str]], log=print,
            cached_and_not: bool | None = None) -> tuple[nbformat.NotebookNode, dict[str, Any]]:
    """Run one notebook as the module docstring says; (the executed notebook to render, its times entry).

    ``costs`` maps what a notebook cached (:func:`cache_entries`) to what
    making it cost (its first run less its second) and the notebook that
    measured it; a later notebook that caches exactly the same thing is not
    run a second time: its cached time is its first run less that cost.
    ``cached_and_not`` (default: for the embedded model only) runs this
    protocol; the tiny run follows in every case.
    """
    entry: dict[str, Any] = {"model": MODELS[model], "load_before": round(os.getloadavg()[0], 2)}
    if model == "embedded" if cached_and_not is None else cached_and_not:
        cache = fresh_cache(scratch, with_embedded=True)
        executed, entry["not_cached_s"], other = execute(notebook, model, cache, scratch)
        if other is not None:
            entry["other_cpu_cores"] = round(other, 2)
        log(f"{stem}: {entry['not_cached_s']:.1f} s on the {model} model, nothing cached")
        entries = cache_entries(cache)
        entry.update(caches=bool(entries), cache_entries=sorted(entries))
        known = costs.get(entries)
        if not entries:
            entry["cached_s"] = entry["not_cached_s"]
        elif known and 0 < known[0] < entry["not_cached_s"]:  # a cost lost in noise is measured again
            entry.update(cached_s=entry["not_cached_s"] - known[0], cached_s_derived_from=known[1])
            log(f"{stem}: {entry['cached_s']:.1f} s with the same cache, less what {known[1]} measured it cost")
        else:
            entry["cached_s"] = execute(notebook, model, cache, scratch).seconds
            costs[entries] = (entry["not_cached_s"] - entry["cached_s"], stem)
            log(f"{stem}: {entry['cached_s']:.1f} s again, with what the first run cached")
        shutil.rmtree(cache)
    tiny, entry["tiny_s"], _ = execute(notebook, TINY_MODEL, fresh_cache(scratch, with_embedded=False), scratch)
    log(f"{stem}: {entry['tiny_s']:.1f} s on the tiny model")
    return (tiny if model == TINY_MODEL else executed), entry


def machine() -> dict[str, Any]:
    """Where the times were taken: cores, the thread setting, the platform."""
    return {"cpu_cores": os.cpu_count(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "platform": f"{platform.system()} {platform.machine()}", "python": platform.python_version()}


HOW = {
    "not_cached_s": "a fresh kernel on a fresh bsi cache holding only the converted embedded model, so the notebook "
                    "pays its own fine-tune (and anything else it caches); wall time, kernel start included",
    "cached_s": "a second run on the cache the first run left (fine-tune cached); a notebook whose first run "
                "cached nothing ('caches': false) was run once and that time stands for both; where "
                "'cached_s_derived_from' names an earlier notebook whose first run cached exactly the same "
                "entries ('cache_entries', e.g. the same fine-tune), this notebook was run once: its cached time is "
                "its not-cached time less what those entries cost there (that notebook's not-cached less cached time)",
    "tiny_s": "BSI_NOTEBOOK_MODEL=tiny-random-llama, a fresh kernel on a fresh cache (what CI runs)",
    "load_before": "the machine's 1-minute load average as the notebook's first run started (it also counts the "
                   "previous notebook's own run, just ended: 'other_cpu_cores' is the measure the run-time line uses "
                   "where present)",
    "other_cpu_cores": "CPU used by other processes during the first run, in cores on average: the machine's busy "
                       "CPU time (/proc/stat) less the render's and its kernel's; above 0.25, the run-time line says "
                       "that other work shared the cores",
    "quiet": "where present, stated by hand for a render made before 'other_cpu_cores' was measured, with "
             "'quiet_how' saying how it is known",
}


# ---------------------------------------------------------------- the copies
def source_hash(stem: str) -> str:
    """SHA-256 of a notebook's source (``notebooks/src/<stem>.py``): what a rendered copy was made from."""
    return hashlib.sha256((HERE / "src" / f"{stem}.py").read_bytes()).hexdigest()


def stamp_of(text: str) -> dict[str, Any] | None:
    """The stamp a rendered copy carries (stem, model, source hash, date), or None."""
    match = STAMP.search(text)
    return json.loads(match.group(1)) if match else None


def _stamp(stem: str, model: str, date: str) -> str:
    fields = {"notebook": stem, "model": MODELS[model], "source_sha256": source_hash(stem), "date": date}
    return f"<!-- bsi walkthrough {json.dumps(fields, sort_keys=True)} -->"


def _widget_snapshot(model_id: str, state: Mapping[str, Any],
                     figures: Mapping[str, Any]) -> tuple[list[str], list[dict]]:
    """(control lines, outputs) of one widget and its children, as they stood when the notebook finished.

    ``state`` is the notebook's saved widget state, ``figures`` the
    FigureWidgets' figures by model id (:data:`FIGURE_PROBE`).
    """
    model = state.get(model_id)
    if model_id in figures:
        return [], [nbformat.v4.new_output("display_data", data={PLOTLY: figures[model_id], "text/plain": "Figure"})]
    if model is None:
        return [], []
    values = model["state"]
    if "children" in values:
        controls, outputs = [], []
        for child in values["children"]:
            c, o = _widget_snapshot(child.removeprefix("IPY_MODEL_"), state, figures)
            controls += c
            outputs += o
        return controls, outputs
    if model["model_name"] in ("HTMLModel", "HTMLMathModel"):
        text = re.sub(r"<[^>]+>", "", html.unescape(values.get("value", "")))
        return [], [nbformat.v4.new_output("display_data", data={"text/html": values.get("value", ""),
                                                                  "text/plain": text})]
    if "_options_labels" in values and values.get("index") is not None:
        return [f"{values.get('description') or 'choice'} = {values['_options_labels'][values['index']]}"], []
    if "value" in values:
        return [f"{values.get('description') or model['model_name']} = {values['value']}"], []
    return [], []


def static_copy(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``nb`` with each widget view replaced by what it showed (figures, HTML, its controls' values as text).

    A widget view needs a live kernel (or a widget manager from a CDN); the
    copy keeps plotly figures as plotly's own MIME type, which JupyterLab
    draws, and this module turns into HTML and PNG.
    """
    nb = copy.deepcopy(nb)
    state = nb.metadata.pop("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    figures = nb.metadata.pop(FIGURE_STATE, {})
    for cell in nb.cells:
        outputs = []
        for output in cell.get("outputs", []):
            view = output.get("data", {}).get(WIDGET_VIEW)
            if view is None:
                outputs.append(output)
                continue
            controls, shown = _widget_snapshot(view["model_id"], state, figures)
            note = ("*Interactive view: run the notebook to use its controls. Shown as the notebook left it"
                    + (f" ({', '.join(f'`{c}`' for c in controls)})" if controls else "") + ".*")
            outputs += [nbformat.v4.new_output("display_data", data={"text/markdown": note, "text/plain": note}),
                        *shown]
        cell.outputs = outputs if cell.cell_type == "code" else cell.get("outputs")
        if cell.cell_type != "code":
            cell.pop("outputs", None)
    return nb


def _figures(nb: nbformat.NotebookNode) -> list[dict]:
    return [o for c in nb.cells for o in c.get("outputs", []) if PLOTLY in o.get("data", {})]


_MATH = re.compile(r"(```.*?```|`[^`\n]*`)|\$\$(.+?)\$\$|(?<![\\$\w])\$(?![\s$])([^$\n]+?)(?<![\s\\])\$(?![\w$])", re.S)


def tex_to_mathml(markdown: str) -> str:
    """Markdown with each ``$...$`` and ``$$...$$`` formula as MathML (browsers draw it with no script).

    Code spans and fenced code are left alone; a formula latex2mathml cannot
    read stays as TeX.
    """
    from latex2mathml.converter import convert

    def swap(match: re.Match) -> str:
        if match.group(1):
            return match.group(1)
        display = match.group(2) is not None
        try:
            mathml = convert((match.group(2) if display else match.group(3)).strip(),
                             display="block" if display else "inline")
        except Exception:  # latex2mathml raises several types; the TeX then stays readable as it was
            return match.group(0)
        return mathml.replace(' xmlns="http://www.w3.org/1998/Math/MathML"', "")
    return _MATH.sub(swap, markdown)


#: Markdown code (fenced, or a span: left alone), a Markdown link or image target, an HTML ``href``/``src`` value.
_LINK = re.compile(r"(```.*?```|`[^`\n]*`)|(\]\(<?)([^)\s>]+)|(\b(?:href|src)=\")([^\"]+)", re.S)
_HTML_ATTRIBUTE = re.compile(r"(\b(?:href|src)=\")([^\"]+)")
_SIBLING = re.compile(r"(\d\d_\w+)\.ipynb")


def _relinked_target(target: str, pages: str, source: str, copies: str) -> str:
    """One link target, written for ``source``, as :func:`relink` writes it for ``copies``."""
    if not target or target.startswith(("#", "/")) or re.match(r"[A-Za-z][\w+.-]*:", target):
        return target  # an anchor on the same page, an absolute path, a URL (http:, mailto:, data:)
    path, rest = re.match(r"([^#?]*)(.*)", target, re.S).groups()  # rest: the #anchor or ?query, kept
    sibling = _SIBLING.fullmatch(path)
    if sibling:  # the next notebook: its rendered page beside this one
        return f"{sibling.group(1)}.{pages}{rest}"
    moved = posixpath.relpath(posixpath.normpath(posixpath.join(source, path)), copies)
    return moved + ("/" if path.endswith("/") else "") + rest


def relink(text: str, pages: str, html_text: bool = False, source: str = "notebooks",
           copies: str = "docs/walkthroughs") -> str:
    """``text`` (a notebook's Markdown or HTML) with its relative links rewritten for the rendered copies.

    A notebook writes links relative to its own folder (``source``,
    ``notebooks/``): ``../docs/method.md#3-importance-scores``,
    ``02_importance_scoring.ipynb``. Its copies live in ``copies``
    (``docs/walkthroughs/``), where the first must read
    ``../method.md#3-importance-scores``: each relative target is resolved
    from ``source`` and written again from ``copies`` (its ``#anchor`` or
    ``?query`` kept). A sibling notebook (``NN_name.ipynb``) becomes its
    rendered page beside the copy, ``NN_name.<pages>`` (``md``, ``html``, or
    ``ipynb`` for the executed copy). URLs (``https:``, ``mailto:``,
    ``data:``), absolute paths and same-page anchors stay as they are.

    Markdown links and images (``[text](target)``) and HTML ``href``/``src``
    values are rewritten, code (fenced blocks, back-quoted spans) is not;
    with ``html_text``, ``text`` is HTML (an exported page) and only
    ``href``/``src`` values are.

    >>> relink("[§3](../docs/method.md#3-importance-scores), next: [03](03_pruning_rounds.ipynb)", "html")
    '[§3](../method.md#3-importance-scores), next: [03](03_pruning_rounds.html)'
    """
    def swap(match: re.Match) -> str:
        code, opening, target, attribute, value = match.groups()
        if code is not None:
            return code
        if target is not None:
            return opening + _relinked_target(target, pages, source, copies)
        return attribute + _relinked_target(value, pages, source, copies)
    if html_text:
        return _HTML_ATTRIBUTE.sub(lambda m: m.group(1) + _relinked_target(m.group(2), pages, source, copies), text)
    return _LINK.sub(swap, text)


def relinked(nb: nbformat.NotebookNode, pages: str) -> nbformat.NotebookNode:
    """A copy of ``nb`` whose Markdown cells and Markdown/HTML outputs link as :func:`relink` says for ``pages``."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = relink(cell.source, pages)
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "text/markdown" in data:
                data["text/markdown"] = relink(data["text/markdown"], pages)
            if "text/html" in data:
                data["text/html"] = relink(data["text/html"], pages, html_text=True)
    return nb


def _fold_hidden_inputs(exporter: HTMLExporter | MarkdownExporter) -> None:
    """Leave out the code of the cells tagged ``hide-input`` (their outputs stay): the page shows the reading."""
    exporter.register_preprocessor(TagRemovePreprocessor(remove_input_tags={build.HIDE_INPUT}), enabled=True)


def html_page(nb: nbformat.NotebookNode, stamp: str) -> str:
    """The offline HTML page of an executed (static) notebook: plotly figures drawn by the local plotly.js."""
    import plotly.io as pio

    nb = copy.deepcopy(nb)
    for output in _figures(nb):
        figure = pio.from_json(json.dumps(output.data[PLOTLY]), skip_invalid=True)
        output.data = {"text/html": pio.to_html(figure, include_plotlyjs=False, full_html=False),
                       "text/plain": output.data.get("text/plain", "Figure")}
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = tex_to_mathml(cell.source)
        for output in cell.get("outputs", []):
            if "text/markdown" in output.get("data", {}):
                output.data["text/markdown"] = tex_to_mathml(output.data["text/markdown"])
    exporter = HTMLExporter(template_name="lab", extra_loaders=[DictLoader({"walkthrough.html.j2": PAGE_TEMPLATE})],
                            template_file="walkthrough.html.j2")
    _fold_hidden_inputs(exporter)
    body, _ = exporter.from_notebook_node(nb, resources={"plotly_js": PLOTLY_JS})
    return body.replace("<head>", f"<head>\n{stamp}", 1)


def markdown_page(nb: nbformat.NotebookNode, stem: str, stamp: str) -> tuple[str, dict[str, bytes]]:
    """The Markdown copy and its images (``{relative path: PNG bytes}``): each plotly figure as a static PNG."""
    import plotly.io as pio

    nb = copy.deepcopy(nb)
    figures = _figures(nb)
    if figures:
        try:
            with tempfile.TemporaryDirectory() as tmp:
                paths = [Path(tmp) / f"{n}.png" for n in range(len(figures))]
                drawn = [pio.from_json(json.dumps(o.data[PLOTLY]), skip_invalid=True) for o in figures]
                # kaleido draws at its default 700 x 500 unless told: each figure at the size its layout asks for
                with warnings.catch_warnings():  # plotly hands kaleido its (empty) options even when a browser is open
                    warnings.filterwarnings("ignore", message="The kopts argument is ignored", category=UserWarning)
                    pio.write_images(drawn, paths, format="png", scale=1.5,
                                     width=[f.layout.width or PNG_SIZE[0] for f in drawn],
                                     height=[f.layout.height or PNG_SIZE[1] for f in drawn])
                pngs = [p.read_bytes() for p in paths]
        except Exception as error:  # kaleido's errors (no browser, a crash) come in several types
            raise BSIError(f"could not draw the figures as PNG ({error}); kaleido needs Chromium: run `make chromium`"
                           ) from error
        for output, png in zip(figures, pngs):
            output.data = {"image/png": base64.b64encode(png).decode("ascii"),
                           "text/plain": output.data.get("text/plain", "Figure")}
    exporter = MarkdownExporter()  # its ExtractOutputPreprocessor moves each image to a file
    _fold_hidden_inputs(exporter)
    body, resources = exporter.from_notebook_node(nb, resources={"output_files_dir": f"{stem}_files",
                                                                 "unique_key": stem})
    return f"{stamp}\n\n{body}", dict(resources.get("outputs", {}))


def write_copies(nb: nbformat.NotebookNode, stem: str, model: str, out: Path, date: str) -> list[Path]:
    """Write the HTML, Markdown (with its images) and executed copies of one notebook into ``out``."""
    stamp = _stamp(stem, model, date)
    static = static_copy(nb)
    static.metadata["bsi_walkthrough"] = stamp_of(stamp)
    page = html_page(relinked(static, "html"), stamp)
    text, images = markdown_page(relinked(static, "md"), stem, stamp)
    static = relinked(static, "ipynb")  # JupyterLab opens the next executed notebook, live figures and all
    files = out / f"{stem}_files"
    shutil.rmtree(files, ignore_errors=True)
    for name, data in images.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    written = [out / f"{stem}.html", out / f"{stem}.md", out / f"{stem}.ipynb"]
    for path, content in zip(written, (page, text, nbformat.writes(static) + "\n")):
        atomic_write_text(path, content)
    return written + [out / name for name in images]


def plotly_js(out: Path) -> Path:
    """The shared ``plotly.min.js`` in ``out``: the one installed with the plotly package (rewritten when it differs)."""
    from plotly.offline import get_plotlyjs

    path = out / PLOTLY_JS
    script = get_plotlyjs()
    if not path.is_file() or path.read_text(encoding="utf-8") != script:
        atomic_write_text(path, script)
    return path


@contextlib.contextmanager
def one_browser():
    """Kaleido's Chromium opened once for every figure drawn inside, and closed after.

    Without it each :func:`markdown_page` call starts a browser of its own
    (three figures: about 4 s on 2 cores, against under 1 s in one already
    open; ``bench/suite_costs.py``).
    """
    import kaleido

    kaleido.start_sync_server(silence_warnings=True)
    try:
        yield
    finally:
        kaleido.stop_sync_server(silence_warnings=True)


# --------------------------------------------------------------------- main
def render(stems: Iterable[str], model: str, out: Path, log=print) -> dict[str, Any]:
    """Run, time and write the copies of ``stems`` into ``out``; returns the updated times file.

    One notebook at a time: its entry in ``times.json`` and its copies are
    written as soon as it has run, so a failure later keeps what was done.
    """
    out.mkdir(parents=True, exist_ok=True)
    times_path = out / "times.json"
    times = build.load_times(times_path)
    if times.get("notebooks") and any(e.get("model") != MODELS[model] for e in times["notebooks"].values()):
        times = {}  # another model's times: start again rather than mix two models in one file
    plotly_js(out)
    costs: dict[frozenset[str], tuple[float, str]] = {}  # what each fine-tune cost, once measured
    with tempfile.TemporaryDirectory(prefix="bsi-walkthroughs-") as scratch, one_browser():
        for stem in stems:
            notebook = nbformat.read(HERE / f"{stem}.ipynb", as_version=4)
            executed, entry = measure(stem, notebook, model, Path(scratch), costs, log)
            for where in temporary_paths(executed, scratch):
                log(f"warning: {stem}, {where}: a path into this render's temporary folder, gone when it ends "
                    f"(print something that reads anywhere)")
            date = datetime.date.today().isoformat()
            times.update(date=date, machine=machine(), how=HOW)
            times.setdefault("notebooks", {})[stem] = entry | {"date": date, "machine": machine(),
                                                               "source_sha256": source_hash(stem)}
            atomic_write_json(times_path, times)
            fresh = build.build_notebook(HERE / "src" / f"{stem}.py", times)  # its first cell with the new time
            markdown = {c.id: c.source for c in fresh.cells if c.cell_type == "markdown"}
            for cell in executed.cells:
                cell.source = markdown.get(cell.id, cell.source)
            for path in write_copies(executed, stem, model, out, date):
                log(f"wrote {path.relative_to(out.parent) if path.is_relative_to(out.parent) else path}")
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="embedded",
                        help="the embedded model (timed cached and not, and on the tiny model), or the tiny one alone")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"output folder (default {DOCS.relative_to(ROOT)}, for the embedded model only)")
    parser.add_argument("--only", nargs="+", metavar="NN", help="notebooks by number (default: all)")
    args = parser.parse_args(argv)
    stems = [s.stem for s in build.sources()]
    if args.only:
        unknown = [n for n in args.only if not any(s.startswith(n) for s in stems)]
        if unknown:
            parser.error(f"no notebook numbered {', '.join(unknown)}; there are {', '.join(s[:2] for s in stems)}")
        stems = [s for s in stems if any(s.startswith(n) for n in args.only)]
    out = args.out or DOCS
    if args.model != "embedded" and out.resolve() == DOCS.resolve():
        parser.error(f"{DOCS.relative_to(ROOT)} holds the embedded model's copies: give --out for the {args.model} model")
    problems = build.check()
    if problems:
        parser.error("the notebooks are not built from their sources: " + "; ".join(problems))
    try:
        render(stems, args.model, out)
    except BSIError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        if out.resolve() == DOCS.resolve():  # each notebook opens with its run time, even after a failure midway
            build.write_all(build.load_times())
    return 0


if __name__ == "__main__":
    sys.exit(main())
