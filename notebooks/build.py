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
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "src"
MARKER = "# %%"


def parse_cells(text: str) -> list[tuple[str, str]]:
    """``[(kind, source), ...]`` with kind ``"markdown"`` or ``"code"``, from a percent-format script."""
    cells: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith(MARKER):
            kind = "markdown" if "[markdown]" in line else "code"
            cells.append((kind, []))
        elif cells:
            kind, lines = cells[-1]
            if kind == "markdown":
                if line.strip() and not line.startswith("#"):
                    raise ValueError(f"markdown line without '# ': {line!r}")
                line = line[2:] if line.startswith("# ") else line.lstrip("#")
            lines.append(line)
    return [(kind, "\n".join(lines).strip("\n")) for kind, lines in cells if "\n".join(lines).strip()]


def build_notebook(source: Path) -> nbformat.NotebookNode:
    """The notebook for one source file: no outputs, no execution counts, ids ``<stem>-<n>``."""
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    for n, (kind, text) in enumerate(parse_cells(source.read_text(encoding="utf-8"))):
        maker = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
        cell = maker(text)
        cell.id = f"{source.stem[:2]}-{n:03d}"
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
    expected = {target(s): render(build_notebook(s)) for s in sources()}
    for path, text in expected.items():
        if not path.exists():
            problems.append(f"{path.name}: missing (run python notebooks/build.py)")
            continue
        committed = path.read_text(encoding="utf-8")
        if has_outputs(nbformat.reads(committed, as_version=4)):
            problems.append(f"{path.name}: holds outputs (rebuild it from src/ with python notebooks/build.py)")
        elif committed != text:
            problems.append(f"{path.name}: differs from src/{path.stem}.py (edit the source, then rebuild)")
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
    for source in sources():
        target(source).write_text(render(build_notebook(source)), encoding="utf-8")
        print(f"wrote {target(source).relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
