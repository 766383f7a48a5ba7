"""``TinyEngine``: a whole engine in a few lines, on the ``Engine`` base class.

An engine only decides where the batches of a map run: here, on a few threads of this
process, handed to ``sink`` as they finish (in any order, as the contract allows). The
core does everything else (inputs, cache, events, errors, result order), so this passes
the conformance suite's map tests (``test_tiny_engine.py``), like httpx's
``MockTransport`` stands in for a transport.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, as_completed

from hypernodes_dist.engines.base import Engine
from hypernodes_dist.execution.batch import execute_batch
from hypernodes_dist.execution.job import MapJob, Sink


class TinyEngine(Engine):
    name = "tiny"

    def __init__(self, batch_size: int = 7, max_workers: int = 2) -> None:
        self.batch_size = batch_size
        self.max_workers = max_workers

    def execute_map(self, job: MapJob, sink: Sink) -> None:
        with ThreadPoolExecutor(self.max_workers) as pool:
            futures = [pool.submit(execute_batch, job.plan, job.chunk(start, stop), job.settings)
                       for start, stop in job.bounds(self.batch_size)]
            try:
                for future in as_completed(futures):
                    sink(future.result())
            finally:  # an error (on_error="raise") or an interrupt: the rest never starts
                for future in futures:
                    future.cancel()
