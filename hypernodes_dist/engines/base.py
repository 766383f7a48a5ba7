"""The engine interface: an engine only decides *where* batches of a map run.

It receives a ``MapJob``, cuts it into chunks, runs ``execute_batch`` (the shared plan
executor) on each chunk wherever it likes, and hands every ``BatchResult`` to ``sink`` in
the driver as it completes, in any order. Everything else — input expansion, ids, cache
keys, result assembly, events, progress, error policy — is the core's.
"""

from __future__ import annotations

from typing import ClassVar

from hypernodes_dist.execution.job import MapJob, Sink

__all__ = ["Engine"]


class Engine:
    """Base class of engines. Subclasses implement ``execute_map``."""

    name: ClassVar[str] = "engine"
    supports_iter: ClassVar[bool] = False
    parallel_nodes: bool = False
    max_workers: int = 4

    def execute_map(self, job: MapJob, sink: Sink) -> None:
        """Run every item of ``job``; call ``sink`` with each ``BatchResult`` in the driver."""
        raise NotImplementedError(f"{type(self).__name__} does not implement execute_map")

    def close(self) -> None:
        """Release what the engine started (clusters, pools). Idempotent."""

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
