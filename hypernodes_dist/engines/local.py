"""The local reference engine ``GraphEngine``: every batch runs in this process."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, ClassVar

from hypernodes_dist.cache.keys import batch_writes
from hypernodes_dist.engines.base import Engine
from hypernodes_dist.engines.drive import drive_chunks
from hypernodes_dist.execution.batch import batch_round, execute_batch, run_batch
from hypernodes_dist.execution.batching import item_window
from hypernodes_dist.execution.flow import Flow, Window, drive, finish, start_flow
from hypernodes_dist.execution.job import MapJob, Sink
from hypernodes_dist.execution.syncio import gather_tasks, run_sync

if TYPE_CHECKING:  # pyarrow loads only for dataset maps
    from hypernodes_dist.datasets.job import DatasetJob
    from hypernodes_dist.datasets.report import PartReport

__all__ = ["GraphEngine"]


class GraphEngine(Engine):
    """The local reference engine: ``run``, ``map`` and ``iter`` in this process.

    ``map`` runs items in batches of ``batch_size`` through the shared plan executor. Items
    of plans with async nodes or waiting policies flow one by one, up to ``batch_size``
    in flight (not counting items sleeping in a retry back-off), across batch boundaries;
    results come back per batch, in item order. With ``parallel_nodes=True``,
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
        if job.plan.flows and not (self.parallel_nodes and self.max_workers > 1):
            run_sync(self._flow(job, sink))
            return
        if job.plan.is_async and not job.plan.flows:  # async batch nodes: calls gathered
            run_sync(self._gathered(job, sink))
            return
        bounds = list(job.bounds(self.batch_size))
        if not self.parallel_nodes or self.max_workers == 1 or len(bounds) == 1:
            with batch_writes(job.settings.cache, None) as writes:  # one buffer for all batches
                for start, stop in bounds:
                    sink(execute_batch(job.plan, job.chunk(start, stop), job.settings, writes))
            return
        with ThreadPoolExecutor(self.max_workers, thread_name_prefix="hn-map") as pool:
            drive_chunks(job, pool.submit, sink, self.batch_size)

    def execute_dataset(self, job: DatasetJob, report: Callable[[PartReport], None]) -> None:
        """Parts one after another through the core's part pipeline (steps sized by time,
        at most ``batch_size`` async calls in flight)."""
        job.run_here(report, concurrency=self.batch_size)

    async def _flow(self, job: MapJob, sink: Sink) -> None:
        """Plans whose items flow (``Plan.flows``): the items of every batch under one window
        of ``batch_size`` items, so the next batch's calls are in flight while a batch
        finishes; each batch goes to ``sink`` when its last item is done."""
        settings = job.settings
        # one buffer for all batches; their rows are one round of a map with batches
        with batch_round(settings.batch), batch_writes(settings.cache, None) as writes:
            def items() -> Iterator[tuple[Flow, int]]:
                for start, stop in job.bounds(self.batch_size):
                    flow = start_flow(job.plan, job.chunk(start, stop), settings, writes)
                    for i in range(stop - start):
                        yield flow, i

            def done(flow: Flow) -> None:
                if flow.pending == 0:
                    sink(finish(flow))

            window = item_window(job.plan, self.batch_size)  # batch nodes: calls, not items
            await drive(items(), Window(window), done)

    async def _gathered(self, job: MapJob, sink: Sink) -> None:
        """Columnar plans whose async nodes are batch nodes: batches of ``batch_size`` calls
        each (``batching.item_window``), two batches at once, so the next batch's calls are
        in flight while one ends with its slowest call."""
        size = item_window(job.plan, self.batch_size)
        slots = asyncio.Semaphore(2)
        with batch_writes(job.settings.cache, None) as writes:
            async def one(start: int, stop: int) -> None:
                async with slots:
                    sink(await run_batch(job.plan, job.chunk(start, stop), job.settings, writes))

            await gather_tasks(one(a, b) for a, b in job.bounds(size))

    def __repr__(self) -> str:
        return (
            f"GraphEngine(parallel_nodes={self.parallel_nodes}, max_workers={self.max_workers}, "
            f"batch_size={self.batch_size})"
        )
