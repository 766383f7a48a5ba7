"""The engine interface and the local reference engine ``GraphEngine``.

An engine only decides *where* batches of a map run: it receives a ``MapJob``, cuts it
into chunks, runs ``execute_batch`` (the shared plan executor) on each chunk wherever it
likes, and hands every ``BatchResult`` to ``sink`` in the driver as it completes, in any
order. Everything else — input expansion, ids, cache keys, result assembly, events,
progress, error policy — is the core's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

from .batch import BatchResult, BatchSettings, Chunk, execute_batch
from .keys import batch_writes
from .plan import Plan

__all__ = ["Engine", "GraphEngine", "MapJob", "Sink"]

Sink = Callable[[BatchResult], None]


@dataclass
class MapJob:
    """One ``map`` call, ready to run: the plan, the expanded item columns, the settings."""

    plan: Plan
    columns: dict[str, list[Any]]
    broadcast: dict[str, Any]
    n: int
    settings: BatchSettings

    def chunk(self, start: int, stop: int) -> Chunk:
        """Items ``start .. stop`` as a ``Chunk`` (mapped columns sliced, broadcast shared)."""
        cols = {k: v[start:stop] for k, v in self.columns.items()}
        return Chunk(start, stop - start, cols, self.broadcast)

    def bounds(self, size: int) -> Iterator[tuple[int, int]]:
        """``(start, stop)`` of consecutive chunks of at most ``size`` items."""
        size = max(1, int(size))
        for start in range(0, self.n, size):
            yield start, min(start + size, self.n)


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


class GraphEngine(Engine):
    """The local reference engine: ``run``, ``map`` and ``iter`` in this process.

    ``map`` runs items in batches of ``batch_size`` through the shared plan executor; async
    nodes run up to ``batch_size`` items concurrently. With ``parallel_nodes=True``,
    independent nodes of a run execute concurrently and map batches spread over
    ``max_workers`` threads.
    """

    name: ClassVar[str] = "local"
    supports_iter: ClassVar[bool] = True

    def __init__(self, parallel_nodes: bool = False, max_workers: int = 4, batch_size: int = 100):
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.parallel_nodes = parallel_nodes
        self.max_workers = max_workers
        self.batch_size = batch_size

    def execute_map(self, job: MapJob, sink: Sink) -> None:
        bounds = list(job.bounds(self.batch_size))
        if not self.parallel_nodes or self.max_workers == 1 or len(bounds) == 1:
            with batch_writes(job.settings.cache, None) as writes:  # one buffer for all batches
                for start, stop in bounds:
                    sink(execute_batch(job.plan, job.chunk(start, stop), job.settings, writes))
            return
        with ThreadPoolExecutor(self.max_workers, thread_name_prefix="hn-map") as pool:
            futures = [
                pool.submit(execute_batch, job.plan, job.chunk(a, b), job.settings)
                for a, b in bounds
            ]
            try:
                for f in futures:
                    sink(f.result())
            finally:
                for f in futures:
                    f.cancel()

    def __repr__(self) -> str:
        return (
            f"GraphEngine(parallel_nodes={self.parallel_nodes}, max_workers={self.max_workers}, "
            f"batch_size={self.batch_size})"
        )
