"""What the pytest-xdist workers import as they start, compiled once before they start.

A clean clone's virtualenv holds no bytecode for its packages (uv installs none): the first
import of a module compiles it and writes its ``.pyc``. The workers start together and each
imports the same ~5,500 modules while collecting (anthropic alone is ~3,150), so each
compiles them: six cold imports at once took 50 CPU s on a fresh virtualenv, where one
compile and six reads of the bytecode take 26. The controller imports them first, in two
processes (one per CPU); with the bytecode already there this costs ~2 CPU s.
"""

from __future__ import annotations

import subprocess
import sys

# two groups of about equal compile time; what the test modules and conftests import at
# collection (the rest, e.g. Ray, is imported later, by one test at a time)
GROUPS = (
    ("anthropic",),
    ("openai", "pandas", "daft", "numpy", "hypothesis", "aiohttp", "pyarrow.dataset",
     "distributed", "tests.conformance.conftest"),
)


def compile_what_workers_import() -> None:
    """Import ``GROUPS`` in child interpreters (writing their bytecode) and wait for them; a
    failure is left to the workers' own imports to report."""
    children = [subprocess.Popen([sys.executable, "-c", "import " + ", ".join(group)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for group in GROUPS]
    for child in children:
        child.wait()
