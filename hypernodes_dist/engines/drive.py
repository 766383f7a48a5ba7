"""``drive_chunks``: the loop every pool-backed engine shares.

Submit every chunk of a map, hand each ``BatchResult`` to ``sink`` in the driver as it
completes (any order, as the engine contract allows), and on the first error (an
``on_error="raise"`` failure, an interrupt) cancel the chunks not started and let the error
propagate. An engine supplies only ``submit`` (where a chunk runs), as dask's schedulers
supply ``apply_async`` to one ``get_async``; with a thread pool an engine is a few lines::

    with ThreadPoolExecutor(2) as pool:
        drive_chunks(job, pool.submit, sink, size=100)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future, as_completed
from typing import Any

from hypernodes_dist.execution.batch import execute_batch
from hypernodes_dist.execution.job import BatchResult, MapJob, Sink

__all__ = ["drive_chunks", "run_chunk", "Submit"]

Submit = Callable[..., "Future[BatchResult]"]  # ``submit(fn, *args)``, as ``Executor.submit``


def run_chunk(job: MapJob, start: int, stop: int) -> BatchResult:
    """Items ``start .. stop`` of ``job`` through the shared plan executor."""
    return execute_batch(job.plan, job.chunk(start, stop), job.settings)


def drive_chunks(job: MapJob, submit: Submit, sink: Sink, size: int,
                 completed: Callable[[list[Any]], Iterable[Any]] = as_completed) -> None:
    """Run ``job`` in chunks of ``size`` items (``job.bounds``: full batch-node calls), each
    through ``submit(run_chunk, job, start, stop)``; ``sink`` gets each result as
    ``completed(futures)`` yields its future. The first error cancels the rest."""
    futures = [submit(run_chunk, job, start, stop) for start, stop in job.bounds(size)]
    try:
        for future in completed(futures):
            sink(future.result())
    finally:  # an error or an interrupt: the chunks not started never start
        for future in futures:
            future.cancel()
