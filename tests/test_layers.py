"""The one-way layer rule: layers import downward only, cli → serving/training → ingest →
solvers.

Every module under ``pipeline/`` and ``solvers/`` is parsed with :mod:`ast`, not imported, and
each of its imports is checked: at module level, inside functions, under ``TYPE_CHECKING``, and
``importlib.import_module`` of a literal name. A module may import from its own rank or a lower
one; ``solvers`` may import nothing from ``pipeline`` at all.

====  ====================================  ===================================================
rank  modules                               why there
====  ====================================  ===================================================
0     ``solvers``                           the numerical core; knows nothing of the pipeline
1     ``pipeline.naming``,                  shared utilities; they import nothing from
      ``pipeline.features``                 ``pipeline`` (``pipeline/__init__.py`` sits here
                                            too: it holds a docstring only)
2     ``pipeline.ingest``,                  ``settings`` is a shared utility, but
      ``pipeline.settings``,                ``Settings.load`` imports
      ``pipeline.storage``                  ``pipeline.ingest.events.parse_iso_ts``, so it
                                            cannot sit below ingest (and ingest's ``kafka`` and
                                            ``files`` read ``Settings``, so no higher either);
                                            ``storage`` (object stores) serves ingest's store
3     ``pipeline.serving``                  must not import training
4     ``pipeline.training``                 may import serving: publishing is a training step
5     ``pipeline.cli``                      the top
====  ====================================  ===================================================

A new module directly under ``pipeline/`` fails :func:`test_every_module_has_a_rank` until it is
given a rank here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ROOTS = ("pipeline", "solvers")
RANKS = {
    "solvers": 0,
    "pipeline": 1,
    "pipeline.naming": 1,
    "pipeline.features": 1,
    "pipeline.ingest": 2,
    "pipeline.settings": 2,
    "pipeline.storage": 2,
    "pipeline.serving": 3,
    "pipeline.training": 4,
    "pipeline.cli": 5,
}


def rank_of(module: str) -> int | None:
    """The rank of the longest prefix of ``module`` in :data:`RANKS` (``pipeline`` alone only
    for the package itself, so that an unranked new module is noticed)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in RANKS and (prefix != "pipeline" or module == "pipeline"):
            return RANKS[prefix]
    return None


def module_files() -> dict[str, Path]:
    """Dotted name → path of every module under :data:`ROOTS`."""
    out = {}
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = module_files()


def imports_of(module: str, path: Path) -> list[tuple[int, str, str]]:
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
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
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


def test_every_module_has_a_rank():
    assert len(MODULES) > 50, f"found only {len(MODULES)} modules under {ROOTS}"
    unranked = [m for m in MODULES if rank_of(m) is None]
    assert not unranked, f"give these modules a rank in RANKS: {unranked}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_downward_only(module):
    path = MODULES[module]
    own = rank_of(module)
    wrong = []
    for line, target, text in imports_of(module, path):
        target_rank = rank_of(target)
        if module.startswith("solvers") and target.split(".")[0] == "pipeline":
            wrong.append(f"{path.relative_to(REPO)}:{line}: {text!r} (solvers imports nothing "
                         "from pipeline)")
        elif target_rank is not None and own is not None and target_rank > own:
            wrong.append(f"{path.relative_to(REPO)}:{line}: {text!r} ({module}, rank {own}, "
                         f"imports {target}, rank {target_rank})")
    assert not wrong, "upward imports:\n" + "\n".join(wrong)


@pytest.mark.parametrize("source, module, expected", [
    ("from pipeline.training.retrain import x", "pipeline.serving.publish",
     "pipeline.training.retrain"),
    ("def f():\n    from pipeline.cli import main", "pipeline.ingest.kafka", "pipeline.cli"),
    ("from pipeline import settings", "solvers.topk", "pipeline.settings"),
    ("from ..training import retrain", "pipeline.serving.publish", "pipeline.training.retrain"),
    ("importlib.import_module('pipeline.serving.lookup')", "pipeline.ingest.files",
     "pipeline.serving.lookup"),
])
def test_the_checker_sees_upward_imports(tmp_path, source, module, expected):
    """The checker itself: each form of an upward import is found and ranked above the
    importer (or, for solvers, is an import of pipeline)."""
    path = tmp_path / "module.py"
    path.write_text(source + "\n")
    found = imports_of(module, path)
    assert [target for _, target, _ in found] == [expected]
    assert rank_of(expected) > rank_of(module) or module.startswith("solvers")
