"""hypernodes-dist: function graphs over very large batches, on local, Dask and Daft engines.

``import hypernodes_dist`` stays light: engines (dask, daft) load only through
``hypernodes_dist.engines`` when asked for, and the disk cache on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hypernodes_dist.batchapi.recording import in_batch_api
from hypernodes_dist.engines.base import Engine
from hypernodes_dist.engines.local import GraphEngine
from hypernodes_dist.graph import Graph
from hypernodes_dist.nodes import (
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
from hypernodes_dist.policies.usage import meter
from hypernodes_dist.resources import resource
from hypernodes_dist.results import GraphResult, MapResult, NodeExecution
from hypernodes_dist.run.batchcontrol import batch_status, cancel_batches, resubmit_lost_batches
from hypernodes_dist.trace import TraceCollector

if TYPE_CHECKING:
    from hypernodes_dist.cache.disk import DiskCache
    from hypernodes_dist.cache.objectstore import ObjectStoreCache
    from hypernodes_dist.datasets.result import DatasetResult

__all__ = [
    "node",
    "branch",
    "gate",
    "END",
    "InterruptNode",
    "resource",
    "meter",
    "in_batch_api",
    "cancel_batches",
    "resubmit_lost_batches",
    "batch_status",
    "Graph",
    "GraphEngine",
    "Engine",
    "DiskCache",
    "ObjectStoreCache",
    "GraphResult",
    "MapResult",
    "DatasetResult",
    "NodeExecution",
    "HyperNode",
    "FunctionNode",
    "BranchNode",
    "GateNode",
    "TraceCollector",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in ("DiskCache", "ObjectStoreCache"):
        from hypernodes_dist import cache

        return getattr(cache, name)
    if name == "DatasetResult":  # loads pyarrow: only when asked for
        from hypernodes_dist.datasets.result import DatasetResult

        return DatasetResult
    raise AttributeError(f"module 'hypernodes_dist' has no attribute {name!r}")
