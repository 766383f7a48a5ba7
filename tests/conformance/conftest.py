"""The ``engine`` fixture: every conformance test runs once per engine variant.

Engines are session-scoped (a Dask cluster or a Daft runner starts once per variant)."""

from __future__ import annotations

import pytest

from tests.groups import finish_after_group

from .engines import DAFT, MEMORY, all_engines
from .engines_memory import MODULES as MEMORY_MODULES

try:
    from .engines_daft import RAY_MODULES
except ImportError:
    RAY_MODULES = ()

_ENGINES = all_engines()


@pytest.fixture(scope="session", params=[f for _, f in _ENGINES], ids=[n for n, _ in _ENGINES])
def engine(request):
    eng = request.param()
    yield eng
    eng.close()


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """The in-process limits variant and Daft on Ray run only the modules that test limits.

    Every test of one engine variant is in one ``xdist_group``: under ``--dist loadgroup``
    one pytest-xdist worker runs them all, so each variant (a Dask cluster, a process pool,
    a Daft runner) starts once per run instead of once per worker."""
    only = [(f"[{name}", MEMORY_MODULES) for name, _ in MEMORY]
    only += [(f"[{name}", RAY_MODULES) for name, _ in DAFT if name == "daft-ray"]
    off = [i for i in items for x, modules in only if x in i.nodeid
           and i.module.__name__.rpartition(".")[2] not in modules]
    if off:
        config.hook.pytest_deselected(items=off)
        items[:] = [i for i in items if i not in set(off)]
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "engine" in callspec.indices:
            name = _ENGINES[callspec.indices["engine"]][0]
            item.add_marker(pytest.mark.xdist_group(f"engine-{name}"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """An engine variant (its cluster, process pool) stops after its group's last test."""
    result = yield
    finish_after_group(item, nextitem, ("engine",))
    return result


@pytest.fixture
def logs(tmp_path) -> str:
    """A fresh folder where the graphs' logging nodes leave one file per call."""
    d = tmp_path / "logs"
    d.mkdir()
    return str(d)
