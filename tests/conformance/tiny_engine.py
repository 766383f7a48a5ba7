"""``TinyEngine``: a whole engine in a few lines, on the ``Engine`` base class.

An engine only decides where the batches of a map run: here, on a few threads of this
process, handed to ``sink`` as they finish (in any order, as the contract allows). The
core does everything else (inputs, cache, events, errors, result order), so this passes
every module of the conformance suite (it is one of its engines, ``engines.py``), like
httpx's ``MockTransport`` stands in for a transport. The loop (submit the chunks, hand
results to ``sink``, cancel on error) is the core's ``drive_chunks``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from hypernodes_dist.engines.base import Engine
from hypernodes_dist.engines.drive import drive_chunks
from hypernodes_dist.execution.job import MapJob, Sink


class TinyEngine(Engine):
    name = "tiny"

    def __init__(self, batch_size: int = 7, max_workers: int = 2) -> None:
        self.batch_size = batch_size
        self.max_workers = max_workers

    def execute_map(self, job: MapJob, sink: Sink) -> None:
        with ThreadPoolExecutor(self.max_workers) as pool:
            drive_chunks(job, pool.submit, sink, self.batch_size)
