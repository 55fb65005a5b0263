"""The package's import graph: every arrow between two bsi modules points one way.

Read with the standard library's :mod:`ast`, without importing anything: an
``import`` anywhere in a module counts, inside functions too (a lazy import
still makes the two modules depend on each other), except under
``if TYPE_CHECKING:``, which never runs. ``importlib.import_module`` with a
string (the CLI's dispatch, ``bsi.__getattr__``) is not an import statement and
is not counted.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "bsi"

#: Import cycles known and waiting for their fix, each the set of modules in it. The test fails on any
#: other cycle; a cycle listed here is tolerated, not required, so remove it once it is fixed. None today.
KNOWN_IMPORT_CYCLES: list[frozenset[str]] = []


def module_name(path: Path) -> str:
    """``bsi/app/job.py`` -> ``bsi.app.job``; ``bsi/app/__init__.py`` -> ``bsi.app``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_nodes(tree: ast.AST, type_checking: bool = False):
    """Every Import / ImportFrom node of a module, skipping the bodies of ``if TYPE_CHECKING:`` unless asked."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        for child in ast.iter_child_nodes(node):
            if not type_checking and isinstance(child, ast.If) and _is_type_checking(child.test):
                stack.extend(child.orelse)  # the else branch does run
                continue
            stack.append(child)


def imported_modules(name: str, path: Path, modules: set[str], type_checking: bool = False) -> set[str]:
    """The bsi modules that module ``name`` (at ``path``) imports.

    ``from bsi.app import job`` names the module ``bsi.app.job``; ``from
    bsi.data import Example`` names the package ``bsi.data`` (its
    ``__init__``). Parent packages that Python runs on the way are not
    counted: they run first, whatever imports them.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in import_nodes(ast.parse(path.read_text(encoding="utf-8")), type_checking):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
            continue
        if node.level:  # relative: from . import x, from ..config import y
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            origin = ".".join(base + ([node.module] if node.module else []))
        else:
            origin = node.module or ""
        for alias in node.names:
            found.add(f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in modules else origin)
    return {m for m in found if m in modules and m != name}


def import_graph(type_checking: bool = False) -> dict[str, set[str]]:
    """Module -> the bsi modules it imports (``type_checking``: also those imported for type hints only)."""
    paths = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    return {name: imported_modules(name, path, set(paths), type_checking) for name, path in paths.items()}


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm): each is a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _path(graph: dict[str, set[str]], component: frozenset[str]) -> str:
    """One cycle through ``component``, written ``a -> b -> a``, for the failure message."""
    start = min(component)
    path, seen = [start], {start}
    while True:
        nexts = sorted(graph[path[-1]] & component)
        target = next((t for t in nexts if t == start and len(path) > 1), None) or \
            next((t for t in nexts if t not in seen), start)
        path.append(target)
        if target == start:
            return " -> ".join(path)
        seen.add(target)


def test_the_import_graph_has_no_cycle_but_the_known_ones():
    graph = import_graph()
    found = cycles(graph)
    new = [c for c in found if c not in KNOWN_IMPORT_CYCLES]
    assert not new, "import cycles: " + "; ".join(_path(graph, c) for c in new) + \
        " (give each concept one home so that the imports point one way)"


def test_no_two_modules_depend_on_each_other_even_for_type_hints():
    graph = import_graph(type_checking=True)
    found = cycles(graph)
    assert not found, "import cycles counting TYPE_CHECKING imports: " + "; ".join(_path(graph, c) for c in found)


def test_the_cycle_finder_sees_lazy_imports_and_skips_type_checking(tmp_path):
    """The reader itself, on a small made-up package: a function-level import counts, TYPE_CHECKING does not."""
    pkg = tmp_path / "bsi"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "sub/__init__.py": "from bsi.sub.b import B\n",
        "a.py": "def f():\n    from bsi import c\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from bsi.a import A\n",
        "c.py": "from .a import f\n",
        "sub/b.py": "from ..b import x\nclass B: ...\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    paths = {".".join(p.relative_to(tmp_path).with_suffix("").parts).removesuffix(".__init__"): p
             for p in pkg.rglob("*.py")}
    graph = {name: imported_modules(name, path, set(paths)) for name, path in paths.items()}
    assert graph["bsi.a"] == {"bsi.c"} and graph["bsi.c"] == {"bsi.a"}  # lazy and relative imports count
    assert graph["bsi.b"] == set()  # only under TYPE_CHECKING
    assert graph["bsi.sub"] == {"bsi.sub.b"} and graph["bsi.sub.b"] == {"bsi.b"}
    assert cycles(graph) == [frozenset({"bsi.a", "bsi.c"})]
    assert _path(graph, cycles(graph)[0]) == "bsi.a -> bsi.c -> bsi.a"


#: docs/architecture.md's layers, bottom up: a module may import its own layer or a lower one, never a higher one.
#: Every module of bsi has a layer (a test checks it): the longest name here that is the module or a package above
#: it gives it; ``bsi`` itself (lazy attributes, no import) is matched by that name only.
LAYERS = {
    # 0, the foundation: errors, safe files, the hub check, units, process settings, typed reports and results
    "bsi.errors": 0, "bsi.files": 0, "bsi.hub": 0, "bsi.units": 0, "bsi.runtime": 0, "bsi.reports": 0,
    "bsi.results": 0,
    "bsi.config": 1,  # settings, presets, the method registry: no torch
    "bsi.data": 2,  # tasks, texts, batches
    "bsi.method": 3,  # the maths and the engine
    "bsi.analysis": 4,  # statistics, tables, figures, spectra: numbers in, numbers out
    # 5, the run: stages, methods, evaluation, files; loading a model by name (a name may be a compressed folder,
    # which the export format reads) and chatting with it
    "bsi.pipeline": 5, "bsi.models": 5, "bsi.chat": 5,
    # 6, the surfaces: what a user drives
    "bsi.cli": 6, "bsi.app": 6, "bsi.teaching": 6, "bsi.shipped": 6, "bsi.progress": 6, "bsi.__main__": 6, "bsi": 6,
}

#: The surfaces a user drives: they ask the pipeline for what they show, they never build the engine themselves.
SURFACES = ("bsi.cli", "bsi.app", "bsi.teaching")


def layer_of(module: str) -> int | None:
    """The layer of a module (see :data:`LAYERS`); None when none is given (a test fails on that)."""
    found = [prefix for prefix in LAYERS if module == prefix or (prefix != "bsi" and module.startswith(prefix + "."))]
    return LAYERS[max(found, key=len)] if found else None


def test_every_module_has_a_layer():
    missing = sorted(name for name in import_graph() if layer_of(name) is None)
    assert not missing, f"modules without a layer in tests/test_imports.py LAYERS: {missing}"


def test_nothing_imports_upwards():
    """Each module imports its own layer or lower ones: bsi.method never a pipeline or surface module, and so on."""
    upwards = sorted(f"{a} -> {b}" for a, targets in import_graph().items() for b in targets
                     if layer_of(b) > layer_of(a))
    assert not upwards, f"imports against the layers of docs/architecture.md: {upwards}"


def test_the_layer_reader_orders_modules_by_their_longest_prefix():
    assert layer_of("bsi") == 6 and layer_of("bsi.config.presets") == 1 and layer_of("bsi.models") == 5
    assert layer_of("bsi.method.engine") == 3 and layer_of("bsi.nothing") is None


def test_a_surface_never_constructs_the_engine():
    """The dashboard, the command line and the notebooks' helpers go through the pipeline, never the Compressor.

    Read from the source: no surface module imports :mod:`bsi.method.engine`
    (where :class:`~bsi.method.engine.Compressor` lives), even lazily.
    """
    graph = import_graph()
    builders = sorted(name for name, targets in graph.items()
                      if name.startswith(SURFACES) and "bsi.method.engine" in targets)
    assert not builders, f"surfaces that import the engine (ask bsi.pipeline instead): {builders}"


def test_the_test_tiers_name_real_files_and_the_fast_tier_builds_no_model():
    """`make test-fast` stays fast: its files exist and none of them builds or loads a model or runs a pipeline."""
    from conftest import E2E_FILES, UNIT_FILES

    tests = Path(__file__).resolve().parent
    assert not UNIT_FILES & E2E_FILES
    for name in UNIT_FILES | E2E_FILES:
        assert (tests / name).is_file(), f"tests/conftest.py names {name}, which does not exist"
    uses = ("make_tiny_" + "llama", "load_model_" + "and_tokenizer", "from_" + "pretrained", "Pipeline" + "(",
            '"--' + 'preset"', "smoke_" + "app")  # spelt in pieces so that this file does not match itself
    heavy = re.compile("|".join(re.escape(use) for use in uses))
    for name in UNIT_FILES:
        found = heavy.search((tests / name).read_text(encoding="utf-8"))
        assert found is None, f"{name} is in the fast tier but uses {found.group()}: move it to the integration tier"


def test_the_method_registry_runs_what_the_configuration_names():
    from bsi.config import METHOD_SPECS
    from bsi.pipeline.methods import METHODS, EngineMethod, TruncationMethod

    assert list(METHODS) == list(METHOD_SPECS)
    for name, method in METHODS.items():
        spec = METHOD_SPECS[name]
        assert method.name == name and method.description == spec.description
        assert isinstance(method, EngineMethod if spec.is_engine else TruncationMethod)
        assert getattr(method, "compress_settings", {}) == spec.compress_settings
