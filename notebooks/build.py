"""Build the teaching notebooks (``NN_name.ipynb``) from their reviewable sources (``src/NN_name.py``).

The sources are plain Python in the "percent" format that Jupytext and most
editors understand::

    # %% [markdown]
    # # A title
    # Some *Markdown*, each line behind "# ".

    # %%
    print("a code cell")

Everything before the first ``# %%`` line is a header for reviewers and is
left out of the notebook. The ``.ipynb`` files are generated with no outputs
and fixed cell ids, so that building twice gives the same bytes and a diff of
a notebook is a diff of its source.

    python notebooks/build.py          # write every notebook
    python notebooks/build.py --check  # exit 1 if a notebook is stale or holds outputs

Each notebook opens with its measured run time: the builder writes one line,
generated from ``docs/walkthroughs/times.json`` (written by ``render.py``, see
``make walkthroughs``), under the title of the first Markdown cell. The
sources hold no numbers, and ``--check`` compares against the same line.

A code cell that only writes a reading of the numbers as prose (each
notebook's "What the data say") is tagged ``# %% tags=["hide-input"]``:
JupyterLab shows its code folded, and the rendered copies show only what it
wrote (``render.py``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import nbformat

from bsi.progress import duration

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "src"
MARKER = "# %%"
TIMES = HERE.parent / "docs" / "walkthroughs" / "times.json"
"""The measured run times of the rendered walkthroughs (``render.py`` writes it)."""


class Cell(NamedTuple):
    """One cell of a source: its kind (``"markdown"`` or ``"code"``), its text and its tags."""

    kind: str
    source: str
    tags: tuple[str, ...] = ()


#: The tag that folds a code cell: JupyterLab shows it collapsed, the rendered copies show only its outputs.
HIDE_INPUT = "hide-input"
_TAGS = re.compile(r"\btags=(\[[^\]]*\])")


def parse_cells(text: str) -> list[Cell]:
    """The cells of a percent-format script, each with its kind, text and tags.

    A cell starts at a ``# %%`` line; ``# %% [markdown]`` starts a Markdown
    cell, and ``tags=["hide-input"]`` on that line (Jupytext writes tags the
    same way) gives the cell its tags.
    """
    cells: list[tuple[str, tuple[str, ...], list[str]]] = []
    for line in text.splitlines():
        if line.startswith(MARKER):
            kind = "markdown" if "[markdown]" in line else "code"
            tags = _TAGS.search(line)
            cells.append((kind, tuple(json.loads(tags[1])) if tags else (), []))
        elif cells:
            kind, _, lines = cells[-1]
            if kind == "markdown":
                if line.strip() and not line.startswith("#"):
                    raise ValueError(f"markdown line without '# ': {line!r}")
                line = line[2:] if line.startswith("# ") else line.lstrip("#")
            lines.append(line)
    return [Cell(kind, "\n".join(lines).strip("\n"), tags) for kind, tags, lines in cells if "\n".join(lines).strip()]


def load_times(path: Path = TIMES) -> dict[str, Any]:
    """The times file as a dict (empty when there is none yet)."""
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


#: Other processes using more than this many cores on average during a notebook's run: the line says it was shared.
BUSY_OTHER_CPU = 0.25
#: For renders made before that was measured: a 1-minute load average above this as the notebook started.
BUSY_LOAD = 0.5


def shared_cores_note(entry: Mapping[str, Any]) -> str:
    """``other work shared the cores ...`` when the first embedded run had company; empty on a quiet machine.

    Measured (``other_cpu_cores``) where the render measured it; else the
    load average at the start (``load_before``), which also counts the
    previous notebook's own run, unless the entry says by hand that the
    machine was quiet (``quiet``).
    """
    if entry.get("not_cached_s") is None:
        return ""
    if entry.get("other_cpu_cores") is not None:
        if entry["other_cpu_cores"] > BUSY_OTHER_CPU:
            return (f"other work shared the cores, {entry['other_cpu_cores']:g} of them on average: a quiet machine "
                    "is faster")
        return ""
    if not entry.get("quiet") and (entry.get("load_before") or 0) > BUSY_LOAD:
        return f"other work shared the cores, load {entry['load_before']:g} at the start: a quiet machine is faster"
    return ""


def runtime_line(stem: str, times: Mapping[str, Any]) -> str | None:
    """The run-time sentence for notebook ``stem`` from a times file, or None when it holds no entry for it.

    ``Run time on 2 CPU cores: 4 min 10 s with the fine-tune cached, 9 min 2 s
    without; 11 s on the tiny model (2026-11-26).`` A notebook that caches
    nothing was measured once and says so; a times file from a tiny-only
    render (tests, CI) gives the tiny figure only.
    """
    entry = times.get("notebooks", {}).get(stem)
    if not entry:
        return None
    parts = []
    if entry.get("not_cached_s") is not None:
        if entry.get("caches"):
            cached = ("the fine-tune and the conversion cached"
                      if any(e.startswith("bases/") for e in entry.get("cache_entries", ())) else "the fine-tune cached")
            parts.append(f"{duration(entry['cached_s'])} with {cached}, {duration(entry['not_cached_s'])} without")
        else:
            parts.append(f"{duration(entry['not_cached_s'])} (nothing to fine-tune or cache)")
    if entry.get("tiny_s") is not None:
        parts.append(f"{duration(entry['tiny_s'])} on the tiny model")
    machine = entry.get("machine") or times.get("machine", {})
    cores = f"{machine.get('cpu_cores', '?')} CPU cores"
    if machine.get("OMP_NUM_THREADS"):  # torch's threads were capped; by default it uses every core
        cores += f" (OMP_NUM_THREADS={machine['OMP_NUM_THREADS']})"
    shared = f"; {note}" if (note := shared_cores_note(entry)) else ""
    return f"Run time on {cores}: {'; '.join(parts)} ({entry.get('date') or times.get('date', 'undated')}{shared})."


def with_runtime(markdown: str, line: str | None) -> str:
    """``markdown`` with ``line`` as its own paragraph under the title (the first line when it is a heading)."""
    if not line:
        return markdown
    head, _, rest = markdown.partition("\n")
    if head.startswith("#"):
        return f"{head}\n\n{line}\n\n{rest.lstrip(chr(10))}".rstrip("\n")
    return f"{line}\n\n{markdown}"


def build_notebook(source: Path, times: Mapping[str, Any] | None = None) -> nbformat.NotebookNode:
    """The notebook for one source file: no outputs, no execution counts, ids ``<stem>-<n>``.

    With ``times`` (a times file, :func:`load_times`), the first Markdown cell
    gets the notebook's run-time line (:func:`runtime_line`).
    """
    line = runtime_line(source.stem, times or {})
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    for n, (kind, text, tags) in enumerate(parse_cells(source.read_text(encoding="utf-8"))):
        if kind == "markdown" and line:
            text, line = with_runtime(text, line), None
        maker = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
        cell = maker(text)
        cell.id = f"{source.stem[:2]}-{n:03d}"
        if tags:
            cell.metadata["tags"] = list(tags)
        if HIDE_INPUT in tags:
            cell.metadata["jupyter"] = {"source_hidden": True}  # JupyterLab shows the cell folded
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"


def sources() -> list[Path]:
    return sorted(SOURCES.glob("[0-9][0-9]_*.py"))


def target(source: Path) -> Path:
    return HERE / f"{source.stem}.ipynb"


def has_outputs(nb: nbformat.NotebookNode) -> bool:
    """True if any code cell carries outputs or an execution count (nbstripout's job)."""
    return any(c.cell_type == "code" and (c.get("outputs") or c.get("execution_count")) for c in nb.cells)


def check() -> list[str]:
    """Problems with the committed notebooks: stale, missing, extra, or holding outputs."""
    problems = []
    times = load_times()
    expected = {target(s): render(build_notebook(s, times)) for s in sources()}
    for path, text in expected.items():
        if not path.exists():
            problems.append(f"{path.name}: missing (run python notebooks/build.py)")
            continue
        committed = path.read_text(encoding="utf-8")
        if has_outputs(nbformat.reads(committed, as_version=4)):
            problems.append(f"{path.name}: holds outputs (rebuild it from src/ with python notebooks/build.py)")
        elif committed != text:
            problems.append(f"{path.name}: differs from src/{path.stem}.py and {TIMES.name} "
                            "(edit the source, then rebuild with python notebooks/build.py)")
    for path in HERE.glob("*.ipynb"):
        if path not in expected:
            problems.append(f"{path.name}: has no source in notebooks/src/")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 on a stale notebook")
    args = parser.parse_args(argv)
    if args.check:
        problems = check()
        for line in problems:
            print(line, file=sys.stderr)
        return 1 if problems else 0
    write_all(load_times())
    return 0


def write_all(times: Mapping[str, Any]) -> None:
    """Write every notebook from its source, with its run-time line from ``times``."""
    for source in sources():
        target(source).write_text(render(build_notebook(source, times)), encoding="utf-8")
        print(f"wrote {target(source).relative_to(HERE.parent)}")


if __name__ == "__main__":
    sys.exit(main())
