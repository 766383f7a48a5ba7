"""Code identity follows module attributes: editing ``helpers.fmt`` or ``prompts.SYSTEM``
invalidates the nodes that read them, and nothing else.

Real modules on disk, edited between runs the way a user edits a file and runs again (the
modules are re-imported fresh; the cache directory is the same).
"""

from __future__ import annotations

import importlib
import linecache
import sys
import textwrap
from pathlib import Path

import pytest

from hypernodes_dist import DiskCache, Graph

HELPERS = '''
import prompts

def fmt(x):
    return f"{x}{prompts.SUFFIX}"

def unrelated(x):
    return x
'''

PROMPTS = '''
SYSTEM = "You are terse."
SUFFIX = "!"
'''

PKG_INIT = "from . import sub\n"
PKG_SUB = "LIMIT = 10\n"

PIPELINE = '''
import helpers
import prompts
import pkg
from hypernodes_dist import node

@node(output_name="text")
def render(x):
    return helpers.fmt(x)

@node(output_name="prompt")
def ask(text):
    return prompts.SYSTEM + " " + text

@node(output_name="clipped")
def clip(prompt):
    return prompt[: pkg.sub.LIMIT]

@node(output_name="salted", version="1")
def salted(x):
    return helpers.fmt(x) + prompts.SYSTEM

@node(output_name="fresh", cache=False)
def fresh(x):
    return helpers.fmt(x)
'''

MODULES = ("helpers", "prompts", "pkg", "pkg.sub", "pipeline")


class Ends:
    def __init__(self) -> None:
        self.cached: dict[str, bool] = {}

    def on_node_end(self, event) -> None:
        self.cached[event.node_id] = event.cached


@pytest.fixture
def project(tmp_path, monkeypatch):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    files = {"helpers.py": HELPERS, "prompts.py": PROMPTS, "pipeline.py": PIPELINE,
             "pkg/__init__.py": PKG_INIT, "pkg/sub.py": PKG_SUB}
    for name, text in files.items():
        (src / name).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(src))
    # no .pyc: an edit of the same size within the second of the last import (SUFFIX "!" ->
    # "?") would import the stale bytecode (make test writes bytecode since 5b0f5e2)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    yield src
    for name in MODULES:
        sys.modules.pop(name, None)


def run(src: Path, cache_dir: Path) -> tuple[dict, dict]:
    """A fresh import of the project (a new run of the user's script), one ``run``."""
    for name in MODULES:
        sys.modules.pop(name, None)
    linecache.clearcache()
    importlib.invalidate_caches()
    import pipeline  # noqa: PLC0415 - imported fresh on purpose

    ends = Ends()
    nodes = [pipeline.render, pipeline.ask, pipeline.clip, pipeline.salted, pipeline.fresh]
    result = Graph(nodes, cache=DiskCache(cache_dir), callbacks=[ends]).run({"x": "hi"})
    return dict(result), ends.cached


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_module_attribute_edits_invalidate_exactly_the_readers(project, tmp_path):
    cache = tmp_path / "cache"
    out, cached = run(project, cache)
    assert out["clipped"] == "You are te" and not any(cached.values())
    _, cached = run(project, cache)  # nothing changed: every cacheable node hits
    assert cached == {"render": True, "ask": True, "clip": True, "salted": True, "fresh": False}

    edit(project / "helpers.py", "def unrelated(x):\n    return x", "def unrelated(x):\n    return 2 * x")
    _, cached = run(project, cache)  # a helper nobody calls: still hits
    assert cached["render"] and cached["ask"] and cached["clip"]

    edit(project / "prompts.py", '"You are terse."', '"You are verbose."')
    out, cached = run(project, cache)  # prompts.SYSTEM: ask misses, and clip downstream
    assert out["prompt"] == "You are verbose. hi!"
    assert cached == {"render": True, "ask": False, "clip": False, "salted": True, "fresh": False}

    edit(project / "helpers.py", 'return f"{x}{prompts.SUFFIX}"', 'return f"<{x}>{prompts.SUFFIX}"')
    out, cached = run(project, cache)  # helpers.fmt's body: render misses, and its readers
    assert out["text"] == "<hi>!" and out["prompt"] == "You are verbose. <hi>!"
    assert cached["render"] is False and cached["ask"] is False
    assert cached["salted"] is True  # version= is a manual salt: it overrides code identity
    assert out["salted"] == "hi!You are terse."  # ... and so serves the old answer by design

    edit(project / "prompts.py", 'SUFFIX = "!"', 'SUFFIX = "?"')
    out, cached = run(project, cache)  # read by helpers.fmt through a module attribute
    assert out["text"] == "<hi>?" and cached["render"] is False

    edit(project / "pkg" / "sub.py", "LIMIT = 10", "LIMIT = 3")
    out, cached = run(project, cache)  # pkg.sub.LIMIT: two attribute levels deep
    assert out["clipped"] == "You" and cached["clip"] is False and cached["ask"] is True
    assert cached["fresh"] is False  # cache=False: always runs
