"""One native DaftEngine per test session (Daft fixes its runner once per process)."""

from __future__ import annotations

import pytest

from hypernodes_daft import DaftEngine


@pytest.fixture(scope="session")
def daft_engine():
    engine = DaftEngine(batch_size=4)
    yield engine
    engine.close()
