"""hypernodes-dist: function graphs over very large batches, on local, Dask and Daft engines.

``import hypernodes_dist`` stays light: engines (dask, daft) load only through
``hypernodes_dist.engines`` when asked for, and the disk cache on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .engine import Engine, GraphEngine
from .graph import Graph
from .nodes import (
    END,
    BranchNode,
    FunctionNode,
    GateNode,
    HyperNode,
    InterruptNode,
    branch,
    gate,
    node,
)
from .results import GraphResult, MapResult, NodeExecution
from .trace import TraceCollector

if TYPE_CHECKING:
    from .cache import DiskCache

__all__ = [
    "node",
    "branch",
    "gate",
    "END",
    "InterruptNode",
    "Graph",
    "GraphEngine",
    "Engine",
    "DiskCache",
    "GraphResult",
    "MapResult",
    "NodeExecution",
    "HyperNode",
    "FunctionNode",
    "BranchNode",
    "GateNode",
    "TraceCollector",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "DiskCache":
        from .cache import DiskCache

        return DiskCache
    raise AttributeError(f"module 'hypernodes_dist' has no attribute {name!r}")
