"""Can worker processes start from this program? Checked before a process pool starts.

Worker processes started with ``spawn`` or ``forkserver`` (Dask's default, and the only way
on macOS and Windows) import the program's ``__main__`` module again. A script that calls
``map()`` at its top level, outside ``if __name__ == "__main__":``, then runs the map again
in every worker, which dies starting processes of its own; a program read from standard
input cannot be imported at all. Either way the pool breaks with a worker that "died" and
no hint why. ``check_main`` finds both before any process starts and says what to do.
"""

from __future__ import annotations

import ast
import os
import sys
from types import FrameType, ModuleType

__all__ = ["MainModuleError", "check_main"]


class MainModuleError(RuntimeError):
    """Worker processes cannot import the program's ``__main__`` module."""


def check_main(start_method: str | None, what: str = "Dask worker processes") -> None:
    """Raise ``MainModuleError`` when processes started with ``start_method`` would fail to
    import ``__main__``; ``fork`` (no import) and interactive sessions always pass."""
    if start_method == "fork":
        return
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not isinstance(path, str):
        return  # an interactive session, python -c, a notebook: nothing is re-imported
    if path.startswith("<") or not os.path.exists(path):
        raise MainModuleError(
            f"{what} cannot start from a program read from standard input ({path}): each "
            "worker process imports the main module again, and this one has no file. Save "
            "the program to a file and put the map under `if __name__ == \"__main__\":`, or "
            "use DaskEngine(scheduler=\"threads\") (no worker processes)"
        )
    line = _module_line(main)
    if line is not None and not _guarded(path, line):
        raise MainModuleError(
            f"{what} import the main module {os.path.basename(path)!r} again, and it starts "
            f"this map at its top level (line {line}), outside `if __name__ == \"__main__\":`: "
            "every worker would run the map again and die. Move the code that runs the map "
            "under `if __name__ == \"__main__\":` (or into a function called from there)"
        )


def _module_line(main: ModuleType) -> int | None:
    """The line the main module's top-level code is executing (None: it is not running)."""
    frame: FrameType | None = sys._getframe(1)
    namespace = vars(main)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is namespace:
            return frame.f_lineno
        frame = frame.f_back
    return None


def _guarded(path: str, line: int) -> bool:
    """Whether ``line`` of the script at ``path`` lies inside a top-level main guard."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return True  # cannot tell: do not block the map
    for stmt in tree.body:
        if isinstance(stmt, ast.If) and _is_main_test(stmt.test):
            if stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno):
                return True
    return False


def _is_main_test(test: ast.expr) -> bool:
    """A test comparing ``__name__`` with ``"__main__"`` (``==``, ``in``; alone or inside
    ``and``/``or``, either side)."""
    for expr in ast.walk(test):
        if not isinstance(expr, ast.Compare):
            continue
        sides = [expr.left, *expr.comparators]
        if any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and any(
                isinstance(c, ast.Constant) and c.value == "__main__"
                for s in sides for c in ast.walk(s)):
            return True
    return False
