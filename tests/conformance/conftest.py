"""The ``engine`` fixture: every conformance test runs once per engine variant.

Engines are session-scoped (a Dask cluster or a Daft runner starts once per variant)."""

from __future__ import annotations

import pytest

from .engines import MEMORY, all_engines
from .engines_memory import MODULES as MEMORY_MODULES

_ENGINES = all_engines()


@pytest.fixture(scope="session", params=[f for _, f in _ENGINES], ids=[n for n, _ in _ENGINES])
def engine(request):
    eng = request.param()
    yield eng
    eng.close()


def pytest_collection_modifyitems(config, items):
    """The in-process limits variant runs only the modules that test limits."""
    ids = tuple(f"[{name}" for name, _ in MEMORY)
    off = [i for i in items if any(x in i.nodeid for x in ids)
           and i.module.__name__.rpartition(".")[2] not in MEMORY_MODULES]
    if off:
        config.hook.pytest_deselected(items=off)
        items[:] = [i for i in items if i not in set(off)]


@pytest.fixture
def logs(tmp_path) -> str:
    """A fresh folder where the graphs' logging nodes leave one file per call."""
    d = tmp_path / "logs"
    d.mkdir()
    return str(d)
