"""Make the repository root importable, so worker processes can import ``tests.*`` modules."""

from __future__ import annotations

import os
import sys

import pytest

from hypernodes_bench.llm_server import LLMServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p
)


@pytest.fixture(scope="session")
def llm_server():
    """A loopback OpenAI-compatible server (``hypernodes_bench.llm_server``), 10-30 ms
    answers, no limits; shared by the whole session (``reset()`` clears its stats)."""
    with LLMServer() as server:
        yield server
