"""The ``engine`` fixture: every conformance test runs once per engine variant.

Engines are session-scoped (a Dask cluster or a Daft runner starts once per variant)."""

from __future__ import annotations

import pytest

from .engines import all_engines

_ENGINES = all_engines()


@pytest.fixture(scope="session", params=[f for _, f in _ENGINES], ids=[n for n, _ in _ENGINES])
def engine(request):
    eng = request.param()
    yield eng
    eng.close()


@pytest.fixture
def logs(tmp_path) -> str:
    """A fresh folder where the graphs' logging nodes leave one file per call."""
    d = tmp_path / "logs"
    d.mkdir()
    return str(d)
