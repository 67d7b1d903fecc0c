"""The house rules of ``pipeline/``: layers import downward only, no import cycles, no module or
function too long to read in one go.

Every module under ``pipeline/`` and ``solvers/`` is parsed with :mod:`ast`, not imported, and
each of its imports is seen: at module level, inside functions, under ``TYPE_CHECKING``, and
``importlib.import_module`` of a literal name.

==========  ===================================================  ==============================
layer       modules                                              may import
==========  ===================================================  ==============================
solvers     ``solvers``                                          nothing of ``pipeline``
bottom      ``pipeline`` itself, every module directly under     bottom
            ``pipeline/`` (``settings``, ``naming``,
            ``features``, ``durable``, ``timestamps``,
            ``value_checks``, ...) and the ``pipeline.storage``
            package
ingest      ``pipeline.ingest``                                  bottom
serving     ``pipeline.serving``                                 bottom
training    ``pipeline.training``                                ingest, serving, bottom
refresh     ``pipeline.refresh`` (the streaming refresher)       training and below
cli         ``pipeline.cli``                                     everything
==========  ===================================================  ==============================

(every layer may also import its own modules and ``solvers``.) Ingest and serving are peers:
neither imports the other, so a change of ingest's internals never reaches a lookup; what both
need (the feature checks, event times) sits in the bottom layer.

A new subpackage of ``pipeline/`` fails :func:`test_every_module_has_a_layer` until it is given a
layer here.
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ROOTS = ("pipeline", "solvers")
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80

BOTTOM_PACKAGES = ("pipeline.storage",)
LAYER_OF_PACKAGE = {"pipeline.ingest": "ingest", "pipeline.serving": "serving",
                    "pipeline.training": "training", "pipeline.refresh": "refresh",
                    "pipeline.cli": "cli", "solvers": "solvers"}
MAY_IMPORT = {
    "solvers": {"solvers"},
    "bottom": {"bottom", "solvers"},
    "ingest": {"ingest", "bottom", "solvers"},
    "serving": {"serving", "bottom", "solvers"},
    "training": {"training", "ingest", "serving", "bottom", "solvers"},
    "refresh": {"refresh", "training", "ingest", "serving", "bottom", "solvers"},
    "cli": {"cli", "refresh", "training", "ingest", "serving", "bottom", "solvers"},
}


def module_files(repo: Path = REPO) -> dict[str, Path]:
    """Dotted name → path of every module under :data:`ROOTS` in ``repo``."""
    out = {}
    for root in ROOTS:
        for path in sorted((repo / root).rglob("*.py")):
            parts = path.relative_to(repo).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = module_files()


def layer_of(module: str, modules=MODULES) -> str | None:
    """The layer of ``module`` (see the table above), or ``None`` for an unplaced one."""
    for package, layer in LAYER_OF_PACKAGE.items():
        if module == package or module.startswith(package + "."):
            return layer
    if module == "pipeline" or any(module == p or module.startswith(p + ".")
                                   for p in BOTTOM_PACKAGES):
        return "bottom"
    parts = module.split(".")
    if len(parts) == 2 and parts[0] == "pipeline" and modules.get(module, Path()).name != \
            "__init__.py":
        return "bottom"      # a module file directly under pipeline/
    return None


def imports_of(module: str, path: Path, modules=MODULES) -> list[tuple[int, str, str]]:
    """``(line, imported module, source text)`` of every import of ``pipeline`` or ``solvers``
    in ``path``; ``from a import b`` counts as ``a.b`` when that is a module."""
    source = path.read_text()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source, str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                       for a in node.names]
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and (getattr(node.func, "attr", None) == "import_module"
                   or getattr(node.func, "id", None) == "import_module")):
            targets = [node.args[0].value]
        for target in targets:
            if target.split(".")[0] in ROOTS:
                found.append((node.lineno, target, ast.get_source_segment(source, node)))
    return found


def known_module(target: str, modules) -> str | None:
    """The longest prefix of ``target`` that is a module (``a.b.name`` → ``a.b``)."""
    parts = target.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in modules:
            return ".".join(parts[:n])
    return None


def import_graph(modules: dict[str, Path]) -> dict[str, dict[str, str]]:
    """``{module: {imported module: "path:line"}}`` over the modules of ``pipeline`` (module
    level and inside functions alike: a cycle through a function's import only waits for its
    first call)."""
    graph: dict[str, dict[str, str]] = {}
    for module, path in modules.items():
        if not module.startswith("pipeline"):
            continue
        depth = module.count(".") + 1 + (path.name == "__init__.py")
        where = "/".join(path.parts[-depth:])
        edges = graph.setdefault(module, {})
        for line, target, _ in imports_of(module, path, modules):
            name = known_module(target, modules)
            if name and name != module and name.startswith("pipeline"):
                edges.setdefault(name, f"{where}:{line}")
    return graph


def find_cycles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """One shortest cycle ``[a, b, ..., a]`` through each strongly connected group of
    ``graph`` that has one (Tarjan's algorithm, then a breadth-first search within the
    group)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def connect(start):   # iterative Tarjan: no recursion limit on a long chain of imports
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(group)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    cycles = []
    for group in groups:
        start = min(group)
        came_from = {start: None}
        queue = deque([start])
        while queue:
            node = queue.popleft()
            for nxt in sorted(graph[node]):
                if nxt == start:   # back at the start: the path to node, then start again
                    back = []
                    while node is not None:
                        back.append(node)
                        node = came_from[node]
                    cycles.append(back[::-1] + [start])
                    queue.clear()
                    break
                if nxt in group and nxt not in came_from:
                    came_from[nxt] = node
                    queue.append(nxt)
    return cycles


def show_cycle(cycle: list[str], graph) -> str:
    """``a → b → a`` with where each import is."""
    steps = [f"{a} → {b} ({graph[a][b]})" for a, b in zip(cycle, cycle[1:])]
    return " → ".join(cycle) + "\n    " + "\n    ".join(steps)


def function_lengths(path: Path):
    """``(qualified name, first line, lines)`` of every function and method in ``path``."""
    out = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                out.append((name, child.lineno, child.end_lineno - child.lineno + 1))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(), str(path)), "")
    return out


# ------------------------------------------------------------------------------- the rules

def test_every_module_has_a_layer():
    assert len(MODULES) > 50, f"found only {len(MODULES)} modules under {ROOTS}"
    unplaced = [m for m in MODULES if layer_of(m) is None]
    assert not unplaced, f"give these modules a layer in tests/test_layers.py: {unplaced}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_downward_only(module):
    path = MODULES[module]
    own = layer_of(module)
    wrong = []
    for line, target, text in imports_of(module, path):
        theirs = layer_of(known_module(target, MODULES) or target)
        if own is not None and theirs is not None and theirs not in MAY_IMPORT[own]:
            wrong.append(f"{path.relative_to(REPO)}:{line}: {text!r} ({module}, layer {own}, "
                         f"imports {target}, layer {theirs}; {own} may import "
                         f"{', '.join(sorted(MAY_IMPORT[own]))})")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_no_import_cycles():
    graph = import_graph(MODULES)
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(show_cycle(c, graph) for c in cycles)


def test_no_module_over_the_size_limit():
    long = [f"{path.relative_to(REPO)}: {n} lines" for module, path in MODULES.items()
            if module.startswith("pipeline")
            and (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by job):\n" + \
        "\n".join(long)


def test_no_function_over_the_size_limit():
    long = [f"{path.relative_to(REPO)}:{line}: {name}, {n} lines"
            for module, path in MODULES.items() if module.startswith("pipeline")
            for name, line, n in function_lengths(path) if n > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


# ------------------------------------------------------------------------ the checker itself

@pytest.mark.parametrize("source, module, expected", [
    ("from pipeline.training.retrain import x", "pipeline.serving.publish",
     "pipeline.training.retrain"),
    ("def f():\n    from pipeline.cli import main", "pipeline.ingest.kafka", "pipeline.cli"),
    ("from pipeline import settings", "solvers.topk", "pipeline.settings"),
    ("from ..training import retrain", "pipeline.serving.publish", "pipeline.training.retrain"),
    ("importlib.import_module('pipeline.serving.lookup')", "pipeline.ingest.files",
     "pipeline.serving.lookup"),
    ("import pipeline.ingest.store", "pipeline.settings", "pipeline.ingest.store"),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pipeline.ingest import x",
     "pipeline.serving.lookup", "pipeline.ingest"),
])
def test_the_checker_sees_upward_imports(tmp_path, source, module, expected):
    """Each form of an import is found, and the layer of what it imports is not one the
    importer may import."""
    path = tmp_path / "module.py"
    path.write_text(source + "\n")
    found = imports_of(module, path)
    assert [target for _, target, _ in found] == [expected]
    assert layer_of(expected) not in MAY_IMPORT[layer_of(module)]


def test_the_checker_places_the_layers():
    assert layer_of("pipeline.settings") == layer_of("pipeline.storage.location") == "bottom"
    assert layer_of("pipeline.brand_new_helper") == "bottom"
    assert layer_of("pipeline.brand_new_package.x") is None
    assert "serving" not in MAY_IMPORT["ingest"] and "ingest" not in MAY_IMPORT["serving"]
    assert "training" not in MAY_IMPORT["serving"]


@pytest.mark.parametrize("b_source", [
    "from pipeline.a import f\n",                                   # module level
    "def g():\n    from pipeline import a\n    return a\n",          # inside a function
    "import importlib\nA = importlib.import_module('pipeline.a')\n",
])
def test_the_checker_finds_a_planted_cycle(tmp_path, b_source):
    """``pipeline.a`` imports ``pipeline.b`` inside a function; ``pipeline.b`` imports
    ``pipeline.a`` in each form; ``pipeline.c`` hangs off the cycle without being on it."""
    package = tmp_path / "pipeline"
    package.mkdir()
    (tmp_path / "solvers").mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from pipeline.b import g\n    return g\n")
    (package / "b.py").write_text(b_source)
    (package / "c.py").write_text("import pipeline.a\nimport pipeline.b\n")
    graph = import_graph(module_files(tmp_path))
    cycles = find_cycles(graph)
    assert cycles == [["pipeline.a", "pipeline.b", "pipeline.a"]]
    assert show_cycle(cycles[0], graph).startswith("pipeline.a → pipeline.b → pipeline.a\n")


def test_the_checker_finds_a_longer_cycle_and_no_false_one():
    graph = {"p.a": {"p.b": "a.py:1"}, "p.b": {"p.c": "b.py:1"}, "p.c": {"p.a": "c.py:1"},
             "p.d": {"p.a": "d.py:1"}, "p.e": {}}
    assert find_cycles(graph) == [["p.a", "p.b", "p.c", "p.a"]]
    assert find_cycles({"p.a": {"p.b": "a.py:1"}, "p.b": {}}) == []
