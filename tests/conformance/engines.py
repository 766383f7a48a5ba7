"""Engine factories of the conformance suite: every engine passes every behaviour.

Each entry is ``(id, factory)``; the factory returns a fresh engine. Engine plugins add
their variants in ``engines_dask.py`` / ``engines_daft.py`` beside this file.
"""

from __future__ import annotations

from collections.abc import Callable

from hypernodes_dist import GraphEngine
from hypernodes_dist.engines.base import Engine

from .engines_memory import MemoryLimitsEngine
from .tiny_engine import TinyEngine

Factory = Callable[[], Engine]

LOCAL: list[tuple[str, Factory]] = [
    ("local", GraphEngine),
    ("local-batch1", lambda: GraphEngine(batch_size=1)),
    ("local-parallel", lambda: GraphEngine(parallel_nodes=True, max_workers=3, batch_size=7)),
    ("tiny", TinyEngine),  # an engine in a few lines (tiny_engine.py) passes every module
]


# the policy and usage behaviours over the in-process limits backend (``engines_memory.py``)
MEMORY: list[tuple[str, Factory]] = [("local-memory-limits", MemoryLimitsEngine)]

try:  # engine plugins are optional installs: their variants join when the plugin is there
    from .engines_dask import ENGINES as DASK
except ImportError:
    DASK = []
try:
    from .engines_daft import ENGINES as DAFT
except ImportError:
    DAFT = []


def all_engines() -> list[tuple[str, Factory]]:
    return [*LOCAL, *MEMORY, *DASK, *DAFT]
