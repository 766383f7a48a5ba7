"""What the pytest-xdist workers import and collect as they start, compiled once before.

A clean clone has no bytecode: not for the virtualenv's packages (uv installs none), not for
the project's modules, not for the test modules as pytest rewrites them. The first import
of a module compiles it and writes its ``.pyc``; the workers start together and each
collects every test module, importing the same ~5,500 modules (anthropic alone is ~3,150),
so each compiles them all. Measured: six cold imports of the packages at once took 50 CPU s
where one compile and six reads take 26; a cold collection took 9 CPU s, a warm one 5.

Before starting its workers the controller imports the packages, then collects the tests,
each in two processes (one per CPU), unless a run before it left the bytecode.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# two groups of about equal compile time: what the test modules import at collection (what
# is imported later, e.g. Ray, is imported by one test at a time)
PACKAGES = (
    ("anthropic",),
    ("openai", "pandas", "daft", "numpy", "hypothesis", "aiohttp", "pyarrow.dataset",
     "distributed"),
)
COLLECT = (["tests/conformance"], ["tests", "--ignore=tests/conformance"])


def compile_what_workers_import() -> None:
    """Write the bytecode the workers would each write; a failure is left to the workers'
    own imports and collection to report."""
    if not _has_bytecode(PACKAGES[0][0]):
        _run_all([[sys.executable, "-c", "import " + ", ".join(group)] for group in PACKAGES])
    if not list((TESTS / "__pycache__").glob("conftest.*-pytest-*.pyc")):
        _run_all([[sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist",
                   "-p", "no:cacheprovider", *paths] for paths in COLLECT])


def _has_bytecode(package: str) -> bool:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return True  # not installed: nothing to compile
    return os.path.exists(importlib.util.cache_from_source(spec.origin))


def _run_all(commands: list[list[str]]) -> None:
    children = [subprocess.Popen(c, cwd=TESTS.parent, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL) for c in commands]
    for child in children:
        child.wait()
