"""Dask variants of the conformance ``engine`` fixture (picked up by ``engines.py``).

Small partitions (``partition_size=7``) make even the suite's small maps span several tasks,
so ordering, partition offsets and per-partition errors are exercised on every scheduler.
One LocalCluster (2 worker processes, 1 thread each) serves the whole session.
"""

from __future__ import annotations

from hypernodes_dask import DaskEngine

ENGINES = [
    ("dask-threads", lambda: DaskEngine(scheduler="threads", partition_size=7, num_workers=2)),
    ("dask-sync", lambda: DaskEngine(scheduler="sync")),
    ("dask-processes", lambda: DaskEngine(scheduler="processes", partition_size=7, num_workers=2)),
    ("dask-distributed", lambda: DaskEngine(
        scheduler="distributed", partition_size=7, num_workers=2,
        cluster_kwargs={"threads_per_worker": 1, "dashboard_address": ":0"},
    )),
]
