"""Every map test of the conformance suite (``test_map.py``) on ``TinyEngine``: an engine of
a few lines on the ``Engine`` base class reproduces every map behaviour."""

from __future__ import annotations

import pytest

from .test_map import *  # noqa: F403 - the map tests, collected again here with this engine
from .tiny_engine import TinyEngine


@pytest.fixture(scope="module")
def engine():
    with TinyEngine() as tiny:
        yield tiny
