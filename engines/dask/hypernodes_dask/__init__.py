"""Dask engine for hypernodes-dist: ``map()`` compiled into a batched Dask task graph.

Registered under the entry point ``dask`` of the ``hypernodes_dist.engines`` group, so
``from hypernodes_dist.engines import DaskEngine`` and ``Graph(..., engine="dask")`` find it.
"""

from __future__ import annotations

from hypernodes_dist.errors import UnpicklableError  # one type on every engine

from . import limits as _limits  # noqa: F401  (cluster-wide node limits on distributed workers)
from .engine import DaskEngine, auto_partition_size
from .mainguard import MainModuleError

__all__ = ["DaskEngine", "MainModuleError", "UnpicklableError", "auto_partition_size"]
