"""The teaching notebooks: committed without outputs, in sync with their sources, and runnable.

Every notebook is executed headlessly on the tiny random model
(``BSI_NOTEBOOK_MODEL=tiny-random-llama``), in a fresh kernel of *this*
interpreter, with a private bsi cache; a cell error fails the test. Each
notebook ends with a cell printing ``Result: ...``, and each must have drawn
plotly figures.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"
#: per notebook: (plotly figures at least, an ipywidgets view expected)
KEY_OUTPUTS = {"01": (3, False), "02": (7, False), "03": (3, True), "04": (2, True), "05": (1, False)}


def _builder():
    spec = importlib.util.spec_from_file_location("notebook_build", NOTEBOOK_DIR / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_notebook_has_a_source_and_none_holds_outputs():
    build = _builder()
    assert len(NOTEBOOKS) >= 3 and len(build.sources()) == len(NOTEBOOKS)
    assert build.check() == []  # stale, missing, extra or output-carrying notebooks are listed here


def test_builder_reads_the_percent_format_and_detects_outputs(tmp_path):
    build = _builder()
    cells = build.parse_cells("header\n# %% [markdown]\n# # Title\n#\n# text\n\n# %%\nx = 1\n\n# %%\n\n")
    assert cells == [("markdown", "# Title\n\ntext"), ("code", "x = 1")]
    source = tmp_path / "07_demo.py"
    source.write_text("# %%\nprint(1)\n")
    nb = build.build_notebook(source)
    assert not build.has_outputs(nb) and nb.cells[0].id == "07-000"
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", text="1\n")]
    assert build.has_outputs(nb)
    with pytest.raises(ValueError, match="markdown line"):
        build.parse_cells("# %% [markdown]\nnot a comment\n")


def _texts(nb) -> list[str]:
    out = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.output_type == "stream":
                out.append(output.text)
            elif output.output_type in ("execute_result", "display_data"):
                out.append(str(output.data.get("text/plain", "")))
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_on_the_tiny_model(path, tmp_path, monkeypatch):
    monkeypatch.setenv("BSI_NOTEBOOK_MODEL", "tiny-random-llama")
    monkeypatch.setenv("BSI_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # two shared cores: threads would only fight
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    nb = nbformat.read(path, as_version=4)
    probe = nbformat.v4.new_code_cell("import sys, bsi\nprint('KERNEL', sys.executable, bsi.__file__)")
    nb.cells.append(probe)
    client = NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=False,
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError on the first failing cell

    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    kernel_line = probe.outputs[0].text.split()
    assert kernel_line[1] == sys.executable  # the kernel is this interpreter (the venv's python)
    assert Path(kernel_line[2]).is_relative_to(ROOT)  # and imports this checkout's bsi
    texts = _texts(nb)
    assert any(t.startswith("Result: ") for t in texts), "the closing cell printed no 'Result:' line"
    outputs = [o for c in nb.cells for o in c.get("outputs", [])]
    min_figures, widget = KEY_OUTPUTS[path.stem[:2]]
    assert sum(PLOTLY in o.get("data", {}) for o in outputs) >= min_figures
    if widget:  # FigureWidget / ipywidgets views rendered (anywidget installed, widget state saved)
        assert any(WIDGET in o.get("data", {}) for o in outputs if "VBox" in str(o.get("data", {}).get("text/plain")))
    assert not list(tmp_path.glob("*.ipynb"))  # executing wrote nothing next to the notebook
