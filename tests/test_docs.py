"""The documentation cannot drift from the code.

* The generated parts of docs/cli.md and docs/architecture.md (flag tables,
  presets, the module map) equal what ``python -m bsi.cli.docs`` makes now.
* Every ``--flag`` that a document, the README or a notebook names exists on
  some parser: ``bsi``'s, ``app.py``'s, a bench script's or a launcher's.
* Every repository path that a document names in back-quotes exists.
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pytest

from bsi.cli import build_parser
from bsi.cli.docs import (
    DOC_FILES,
    END,
    flag_tables,
    generate,
    markdown_inline,
    module_map,
    render,
    split_default,
    stale,
)

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = sorted([*ROOT.glob("docs/*.md"), ROOT / "README.md", *ROOT.glob("notebooks/src/*.py")])

#: Flags of the launchers the documents show bsi under (torchrun, accelerate launch), not bsi's own.
LAUNCHER_FLAGS = {"--nproc_per_node", "--standalone", "--num_processes", "--cpu",
                  "--model_args", "--tasks", "--include_path", "--apply_chat_template"}  # the last four: lm_eval's

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*(?![\w-])")
#: A source path in back-quotes (a module, a document, a notebook or a folder; outputs such as results.json are not).
PATH = re.compile(r"`((?:bsi|bench|tests|notebooks|docs|examples|\.ci)/(?:[\w./*-]*\.(?:py|md|ipynb|jsonl)|[\w./*-]*/)?)`")


def bsi_flags() -> set[str]:
    """Every option string of ``bsi`` and of each of its commands (``--no-...`` forms included)."""
    parser = build_parser()
    parsers = [parser] + [p for a in parser._actions if isinstance(a, argparse._SubParsersAction)
                          for p in a.choices.values()]
    return {o for p in parsers for a in p._actions for o in a.option_strings}


def script_flags() -> set[str]:
    """The ``--flags`` that app.py, notebooks/build.py and the bench scripts add (read with ast, not run)."""
    flags = set()
    for path in [ROOT / "app.py", ROOT / "notebooks" / "build.py", *sorted((ROOT / "bench").glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                flags |= {a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")}
    return flags


def makefile_pytest_flags() -> set[str]:
    """The pytest and pytest-xdist flags ``make test`` passes (the Makefile's ``PYTEST :=`` line)."""
    line = next(line for line in (ROOT / "Makefile").read_text().splitlines() if line.startswith("PYTEST :="))
    return set(FLAG.findall(line))


def test_the_generated_parts_are_what_the_code_generates():
    assert stale() == [], "regenerate them with `make docs` (python -m bsi.cli.docs)"


@pytest.mark.parametrize("document", DOCUMENTS, ids=[str(d.relative_to(ROOT)) for d in DOCUMENTS])
def test_every_flag_a_document_names_exists(document):
    known = bsi_flags() | script_flags() | LAUNCHER_FLAGS | makefile_pytest_flags()
    named = set(FLAG.findall(document.read_text(encoding="utf-8")))
    assert named - known == set(), f"{document.name} names flags no parser has: {sorted(named - known)}"


@pytest.mark.parametrize("document", DOCUMENTS, ids=[str(d.relative_to(ROOT)) for d in DOCUMENTS])
def test_every_path_a_document_names_exists(document):
    missing = [p for p in PATH.findall(document.read_text(encoding="utf-8"))
               if not any(ROOT.glob(p.rstrip("/"))) and not (ROOT / p).exists()]
    assert not missing, f"{document.name} names paths that do not exist: {missing}"


# ------------------------------------------------------------------ the generator itself
def test_every_flag_of_a_command_is_in_its_table():
    tables = flag_tables("compress")
    parser = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["compress"]
    for action in parser._actions:
        if action.option_strings and "-h" not in action.option_strings:
            assert f"`{action.option_strings[0]}" in tables, action.option_strings
    assert "| `--recover-distill` | `0.0` |" in tables  # the default as --help shows it
    assert "--no-skip-finetune" not in tables  # the --no- forms are said once, in prose


def test_the_other_commands_point_to_compress_for_the_shared_configuration_flags():
    sweep = flag_tables("sweep")
    assert "also takes the configuration flags of [`bsi compress`](#bsi-compress) except" in sweep
    assert "`--score`" in sweep.split("except")[1] and "| `--finetune-steps`" not in sweep


@pytest.mark.parametrize("text,split", [
    ("sigmas per layer (default: 16)", ("sigmas per layer", "16")),
    ("a folder (required)", ("a folder", "required")),
    ("in (0, 1) (default: the rule for the dtype)", ("in (0, 1)", "the rule for the dtype")),
    ("in (0, 1]", ("in (0, 1]", "")),
    ("cap (default: all; 2000 (generated))", ("cap", "all; 2000 (generated)")),
])
def test_split_default_takes_only_a_last_default_or_required(text, split):
    assert split_default(text) == split


def test_render_replaces_only_between_the_markers_and_is_stable(tmp_path):
    text = ("# Title\n\nprose before\n\n<!-- generated: flags chat (python -m bsi.cli.docs) -->\nstale table\n"
            f"{END}\n\nprose after\n")
    once = render(text)
    assert once.startswith("# Title\n\nprose before\n\n") and once.endswith(f"{END}\n\nprose after\n")
    assert "stale table" not in once and "| `--model MODEL` | required |" in once
    assert render(once) == once
    with pytest.raises(ValueError, match="no '<!-- end"):
        render("<!-- generated: presets (python -m bsi.cli.docs) -->\nno end\n")
    with pytest.raises(ValueError, match="unknown generated part"):
        generate("tables")


def test_the_module_map_lists_every_module_with_its_docstring(tmp_path):
    package = tmp_path / "bsi"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text('"""The package."""\n')
    (package / "one.py").write_text('"""One thing: :class:`~bsi.one.Thing` and ``code``.\n\nMore."""\nclass Thing: ...\n')
    (package / "sub" / "__init__.py").write_text('"""A sub-package."""\n')
    (package / "sub" / "two.py").write_text('"""Two things."""\nclass _Hidden: ...\n')
    assert module_map(tmp_path).splitlines()[2:] == [
        "| `bsi/__init__.py` | 1 | The package |  |",
        "| `bsi/one.py` | 4 | One thing: `Thing` and `code` | `Thing` |",
        "| **`bsi/sub/`** | 3 | A sub-package |  |",  # a package counts the lines of all its modules
        "| `two.py` | 2 | Two things |  |",
    ]
    (package / "three.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="three.py has no docstring"):
        module_map(tmp_path)


def test_markdown_inline():
    assert markdown_inline(":func:`bsi.config.make_config` and :mod:`~bsi.app.job`, ``x``") == \
        "`bsi.config.make_config` and `job`, `x`"


def test_the_documents_with_generated_parts_exist():
    assert all((ROOT / name).is_file() and "<!-- generated:" in (ROOT / name).read_text() for name in DOC_FILES)


def test_the_html_pages_of_the_docs_load_nothing_from_the_network():
    """``docs/`` is read offline too (a clone with no network): a page's scripts come from beside it."""
    pages = sorted((ROOT / "docs").glob("*.html"))
    assert pages
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"""<(?:script|link|img)[^>]*\b(?:src|href)\s*=\s*["']?(?:https?:)?//""", text), page.name
        scripts = re.findall(r"""<script[^>]*\bsrc=["']([^"']+)["']""", text)
        assert scripts, f"{page.name} loads no plotly.js: its figure would not draw"
        for src in scripts:
            assert (page.parent / src).is_file(), f"{page.name} loads {src}, which is not there"


def _readme_figures() -> list[Path]:
    """The figures README.md shows from docs/ (results, not the dashboard's screenshots under docs/img/)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return [ROOT / m for m in re.findall(r"!\[[^\]]*\]\((docs/[^)/]+\.png)\)", text)]


def test_the_readme_shows_only_figures_drawn_from_shipped_data():
    """A result figure on the front page must trace to a shipped sweep: its stamp is that stats.json's SHA-256."""
    from bsi.shipped import figure_stamp, file_sha256

    figures = _readme_figures()
    assert figures, "the README shows at least one result figure"
    for figure in figures:
        stats = ROOT / "data" / "sweeps" / figure.stem / "stats.json"
        assert stats.is_file(), f"{figure.name} is shown but data/sweeps/{figure.stem} does not ship"
        for drawn in (figure, figure.with_suffix(".html")):
            assert figure_stamp(drawn) == file_sha256(stats), \
                f"{drawn.name} was not drawn from the shipped {stats}: run `python -m bsi.shipped figure {figure.stem}`"


def test_a_drawn_sweep_figure_carries_its_data_and_stamp(tmp_path):
    """draw_sweep_figure: the PNG and HTML carry the source's SHA-256, and the HTML plots the shipped points."""
    import json

    from bsi.shipped import DATA, draw_sweep_figure, figure_stamp, file_sha256

    png, html = draw_sweep_figure("study-quick", docs=tmp_path)
    stats_path = DATA / "sweeps" / "study-quick" / "stats.json"
    assert figure_stamp(png) == figure_stamp(html) == file_sha256(stats_path)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from bsi.analysis.figures import study_figure

    stats = json.loads(stats_path.read_text())
    cells = sorted(stats["protocols"]["tuned"]["methods"]["bsi"].values(), key=lambda c: -c["params_total"])
    drawn = next(t for t in study_figure(stats).data if t.name == "bsi" and t.mode == "lines+markers")
    assert list(drawn.y) == [stats["dense"]["accuracy"]["estimate"] * 100] + [c["accuracy"]["estimate"] * 100 for c in cells]


def test_the_sweeps_side_by_side_rank_by_loss_and_say_where_the_order_changes():
    from bsi.analysis.study import methods_by_loss
    from bsi.cli.docs import _sweep_cells, sweeps_side_by_side

    _, _, cells, anchor = _sweep_cells("study-quick")
    for size in ("0.4", "0.15", "0.05"):
        order = methods_by_loss(cells, size)
        losses = [cells[method][size]["loss"]["estimate"] for method in order]
        assert losses == sorted(losses) and set(order) == {m for m in cells if size in cells[m]}
    same = sweeps_side_by_side("study-quick", "study-quick")
    order_rows = [line for line in same.splitlines() if line.endswith(" yes |") or line.endswith(" **no** |")]
    assert order_rows and all(line.endswith(" yes |") for line in order_rows)  # a sweep agrees with itself
    assert same.count("(the anchor)") == 2 * sum(1 for size in cells[anchor])
    # seed 1 alone against the pooled seeds: at 0.05 the order of the methods moves, and the table says so
    moved = sweeps_side_by_side("study-quick", "study-quick-seed1")
    assert any(line.startswith("| 0.05 |") and line.endswith(" **no** |") for line in moved.splitlines())


def test_the_per_seed_table_gives_each_seeds_own_difference_from_the_rows():
    import json

    from bsi.cli.docs import sweep_seeds

    rows = [json.loads(line) for line in (ROOT / "data" / "sweeps" / "study-quick" / "results.jsonl").open()]
    cell = {(r["method"], r["target"], r["seed"]): r for r in rows if r["protocol"] == "tuned"}
    table = sweep_seeds("study-quick", "basel")
    line = next(line for line in table.splitlines() if line.startswith("| `basel` |") and ";" in line)
    first = line.split("|")[2].strip()  # the 0.4 column: "a0, a1 [lo, hi]; l0, l1 [lo, hi]"
    accuracy, loss = (part.split("[")[0].strip(" *").split(", ") for part in first.split(";"))
    for seed in (0, 1):
        bsi, basel = cell[("bsi", 0.4, seed)], cell[("basel", 0.4, seed)]
        assert float(accuracy[seed]) == pytest.approx(100 * (bsi["accuracy"] - basel["accuracy"]), abs=0.051)
        assert float(loss[seed]) == pytest.approx(bsi["loss"] - basel["loss"], abs=0.0006)
    assert table.splitlines()[2].startswith("| `bsi` | 49.5% / 0.083 |")  # the pooled cell: both seeds' mean


def test_the_speed_tables_read_the_committed_measurements():
    import json

    from bsi.cli.docs import run_profiles, speed_evaluation

    folder = ROOT / "data" / "speed"
    profile = json.loads((folder / "profile-tour-2026-11-28.json").read_text())
    table = run_profiles("profile-tour-2026-11-28")
    recovery = next(line for line in table.splitlines() if line.startswith("| recovery |"))
    assert recovery == f"| recovery | {profile['parts']['recovery']['seconds']:.0f} " \
                       f"({profile['parts']['recovery']['share']:.1%}) |"
    assert any(line.startswith("| &nbsp;&nbsp;&nbsp;&nbsp;&nbsp;&nbsp;&nbsp;&nbsp;factorisation") for line in
               table.splitlines())  # two levels down: inside the conversion, inside the pruning stage
    speed = json.loads((folder / "evaluation-2026-11-28-compressed.json").read_text())["evaluate"]
    rows = speed_evaluation("evaluation-2026-11-28-compressed").splitlines()[2:]
    assert len(rows) == len(speed["timings"]) and "| baseline |" in rows[0]
    draft = next(row for row in rows if "| batch 16 gold draft |" in row)
    assert f"| {speed['ratios']['batch 16 gold draft']:.2f}x | 0 | 0 |" in draft


def test_the_test_suite_table_shows_every_files_seconds_once():
    """The longest files, then the rest together: the column adds up to the seconds inside tests."""
    import json

    from bsi.cli.docs import suite_durations

    name = "test-durations-2026-11-28-one-process"
    record = json.loads((ROOT / "data" / "speed" / f"{name}.json").read_text())
    lines = suite_durations(name, rows=5).splitlines()
    files = [line for line in lines[2:] if line.startswith(("| `tests/", "| tests/", "| the other"))]
    assert len(files) == 6 and files[-1].startswith(f"| the other {len(record['files']) - 5} files |")
    for line in files[:-1]:  # a file merged into another since is named as such, not as a path that exists
        file = line.split("|")[1].strip().strip("`").removesuffix(" (no longer in the suite)")
        assert (ROOT / file).exists() == line.startswith("| `"), line
    gone = suite_durations("test-durations-2026-12-02-intel-xeon-2w", rows=40)
    assert "| tests/test_fsdp.py (no longer in the suite) |" in gone and "`tests/test_distributed.py`" in gone
    assert sum(float(line.rsplit("|", 2)[1]) for line in files) == pytest.approx(record["seconds_in_tests"], abs=0.5)
    assert lines[-1] == f"| result | {record['summary']} |"
