"""The local reference engine ``GraphEngine``: every batch runs in this process."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from hypernodes_dist.cache.keys import batch_writes
from hypernodes_dist.engines.base import Engine
from hypernodes_dist.execution.batch import execute_batch
from hypernodes_dist.execution.job import MapJob, Sink

__all__ = ["GraphEngine"]


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

    def execute_dataset(self, job: Any, report: Callable[[Any], None]) -> None:
        """Parts one after another, each through the executor in steps of 10 000 items (at
        most ``batch_size`` async calls in flight): few executor calls per part."""
        job.run_here(report, step=max(self.batch_size, 10_000), concurrency=self.batch_size)

    def __repr__(self) -> str:
        return (
            f"GraphEngine(parallel_nodes={self.parallel_nodes}, max_workers={self.max_workers}, "
            f"batch_size={self.batch_size})"
        )
