"""docs/ARCHITECTURE.md is true to the tree: its table lists the files in import order.

Every import of the packages (at module level, in a function, under ``TYPE_CHECKING``) goes
to a file of its own row or of a row below it, and no files import each other in a loop.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"hypernodes_dist": "hypernodes_dist", "hypernodes_bench": "hypernodes_bench",
            "hypernodes_dask": "engines/dask/hypernodes_dask",
            "hypernodes_daft": "engines/daft/hypernodes_daft"}


def _rows() -> list[list[str]]:
    """The paths of the table's first column, one list per row, top row first."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    table = text[text.index("| where | one idea |"):].split("\n\n", 1)[0]
    return [re.findall(r"`([^`]+)`", line.split("|")[1]) for line in table.splitlines()[2:]]


def _modules() -> dict[str, str]:
    """Dotted module name -> its file, relative to the repository."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [package, *path.relative_to(ROOT / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path.relative_to(ROOT).as_posix()
    return found


def _imports(module: str, path: str, modules: dict[str, str]) -> set[tuple[str, int]]:
    """``(module imported, line)`` for every import of one of ``modules`` in ``path``."""
    found = set()
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".")[: None if path.endswith("__init__.py") else -1]
                base = ".".join(here[: len(here) - node.level + 1] + [base] * bool(base))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                     for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add((name, node.lineno))
    return found


def _row_of(path: str, rows: list[list[str]]) -> int:
    matches = [(len(p), i) for i, row in enumerate(rows) for p in row
               if path == p or (p.endswith("/") and path.startswith(p))]
    assert matches, f"{path} is in no row of docs/ARCHITECTURE.md's table"
    return max(matches)[1]


def _graph() -> dict[str, set[tuple[str, int]]]:
    modules = _modules()
    return {m: _imports(m, path, modules) for m, path in modules.items()}


def test_imports_only_go_down_the_table() -> None:
    rows, modules = _rows(), _modules()
    upward = [f"{modules[m]}:{line} imports {modules[t]}"
              for m, targets in _graph().items() for t, line in sorted(targets)
              if _row_of(modules[t], rows) < _row_of(modules[m], rows)]
    assert upward == []


# Loops known and being removed, each with the way out; one removed must leave this list.
PENDING_LOOPS: set[frozenset[str]] = set()


def test_no_import_cycles() -> None:
    graph = {m: {t for t, _ in targets} for m, targets in _graph().items()}
    done: set[str] = set()

    def visit(m: str, path: list[str]) -> list[str] | None:
        if m in path:
            return path[path.index(m):]
        if m in done:
            return None
        for t in sorted(graph[m]):
            loop = visit(t, [*path, m])
            if loop:
                return loop
        done.add(m)
        return None

    loops = {frozenset(loop) for m in sorted(graph) if (loop := visit(m, []))}
    assert loops == PENDING_LOOPS, [" -> ".join(sorted(loop)) for loop in loops ^ PENDING_LOOPS]
