"""The registry is the only place in ``pipeline/`` that names an algorithm: a module outside
``pipeline/training/registry.py`` and the families' own trainers (``pipeline/training/
trainers/``) that imports an estimator class, uses one, or holds an algorithm's name as a
string fails this test, naming the module, the line and the name. Docstrings and comments may
mention them. So a new family never has to be wired into the rest of the pipeline."""

from __future__ import annotations

import ast
from pathlib import Path

import solvers
from pipeline.training.registry import FAMILIES

REPO = Path(__file__).resolve().parents[1]
OWNERS = ("pipeline/training/registry.py", "pipeline/training/trainers/")


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _named(source: str, classes: set, names: set) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("solvers"):
            found += [(node.lineno, a.name) for a in node.names if a.name in classes]
        elif isinstance(node, ast.Name) and node.id in classes:
            found.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute) and node.attr in classes:
            found.append((node.lineno, node.attr))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docs
              and (node.value in classes or node.value.lower() in names)):
            found.append((node.lineno, repr(node.value)))
    return found


def test_no_module_outside_the_registry_names_an_algorithm():
    classes = set(solvers.ESTIMATORS)
    names = {n.lower() for n in FAMILIES}
    offenders = []
    for path in sorted((REPO / "pipeline").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith(OWNERS):
            continue
        offenders += [f"{rel}:{line}: {name}" for line, name in
                      _named(path.read_text(encoding="utf-8"), classes, names)]
    assert not offenders, "names an algorithm outside the registry:\n" + "\n".join(offenders)


def test_the_check_sees_each_way_of_naming_one():
    classes, names = {"AltSVM"}, {"altsvm"}
    source = ('"""AltSVM in a docstring is fine."""\n'
              "from solvers import AltSVM\n"
              "import solvers\n"
              "m = solvers.AltSVM()\n"
              "if cfg == 'altsvm':\n"
              "    pass  # AltSVM in a comment is fine\n")
    assert [line for line, _ in _named(source, classes, names)] == [2, 4, 5]
