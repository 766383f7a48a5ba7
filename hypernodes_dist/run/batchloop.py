"""A map's Batch API loop in the driver: run the rows, submit what they recorded, wait for
answers, run the waiting rows again, until none waits.

``BatchLoop.run(run_rows, wait)`` takes the map's rows as one callable: ``run_rows()`` runs
the rows not finished yet (the resume machinery: a rerun computes only unfinished rows) and
returns how many wait for a batch. Between two runs the loop submits the requests the
workers recorded (``RequestLog``, one ``BatchDriver`` per resource's transport, one answer
store for the map) and polls with back-off until a batch has ended. ``wait=False`` returns
once every request is submitted, with the number of rows still waiting; a rerun on the same
folder adopts, collects and submits nothing twice.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypernodes_dist.batchapi import BatchNotFoundError, BatchTransport, transport_for
from hypernodes_dist.batchapi.driver import BatchDriver, Reserve
from hypernodes_dist.batchapi.identity import map_tag
from hypernodes_dist.batchapi.store import AnswerStore, Request, RequestLog
from hypernodes_dist.execution.syncio import run_sync

__all__ = ["batch_folder", "transports_for", "Backoff", "BatchLoop"]


def batch_folder(into: str | os.PathLike[str] | None, cache_dir: str | os.PathLike[str] | None,
                 map_id: str) -> Path:
    """Where a map keeps its batches: ``into/_hn_batches/``, else in the cache's folder;
    ``ValueError`` when there is neither (the ledger must outlive the process)."""
    if into is not None:
        return Path(into) / "_hn_batches"
    if cache_dir is not None:
        return Path(cache_dir) / "_hn_batches" / map_tag(map_id)
    raise ValueError("a map with batch_api=True nodes keeps a ledger of its batches so that "
                     "each request is submitted once across crashes and reruns: give it "
                     "into= (a folder) or a cache with a folder (cache=DiskCache(...))")


def transports_for(clients: Mapping[str, Any], map_id: str, node: str) -> dict[str, Any]:
    """One transport per resource client of a ``batch_api=True`` node; an unsupported client
    raises ``UnsupportedClientError`` naming the node, the resource and the supported ones."""
    return {name: transport_for(client, map_id, f"node {node!r}, resource {name!r}")
            for name, client in clients.items()}


@dataclass(frozen=True)
class Backoff:
    """Seconds between polls: ``first``, times ``factor`` after each idle poll, at most
    ``most``; back to ``first`` when a batch ends."""

    first: float = 2.0
    factor: float = 1.5
    most: float = 60.0


class BatchLoop:
    """The driver's side of a map's batches (see the module doc)."""

    def __init__(self, folder: str | os.PathLike[str], transports: Mapping[str, BatchTransport],
                 *, attempts: int = 1, online_after: float | None = None,
                 keep_files: bool = False, resubmit_lost: bool = False,
                 reserve: Reserve | None = None, backoff: Backoff = Backoff()) -> None:
        self.folder, self.backoff = Path(folder), backoff
        self.log, self.answers = RequestLog(self.folder), AnswerStore(self.folder)
        self.drivers = {name: BatchDriver(t, str(self.folder), attempts=attempts,
                                          online_after=online_after, keep_files=keep_files,
                                          ledger_folder=str(self.folder / "ledgers" / name),
                                          resubmit_lost=resubmit_lost, reserve=reserve)
                        for name, t in transports.items()}
        self.requests: dict[str, list[Request]] = {name: [] for name in transports}
        self._reserve: Reserve | None = reserve

    def reserve(self, reserve: Reserve) -> None:
        """Budgets: ``reserve(request)`` for every request about to go into a batch; one
        with a ``round(answered, live)`` method hears the counts before each submission."""
        self._reserve = reserve
        for d in self.drivers.values():
            d.reserve = reserve

    def recorder(self, source: str) -> Callable[[str, Mapping[str, Any]], None]:
        """What a worker's recording client of resource ``source`` records with."""
        return self.log.recorder(source)

    def run(self, run_rows: Callable[[], int], wait: bool = True) -> int:
        """Run the rows until none waits (``wait``) or every request is submitted; the rows
        still waiting."""
        run_sync(self._recover())
        while True:
            waiting = run_rows()
            if waiting == 0:
                return 0
            run_sync(self._submit())
            if not wait:
                return waiting
            self._wait_for_answers()
            self._check_lost()

    def _check_lost(self) -> None:
        lost = {name: d.lost for name, d in self.drivers.items() if d.lost}
        if lost and not self.running:
            exc = BatchNotFoundError(", ".join(i for ids in lost.values() for i in ids),
                                     ", ".join(f"resource {name!r}" for name in lost))
            exc.add_note("to submit their requests again, rerun the map with "
                         "resubmit_lost=True")
            raise exc

    def states(self) -> dict[str, int]:
        """The map's batch files by state (new, submitted, done, failed, lost): progress."""
        out: dict[str, int] = {}
        for d in self.drivers.values():
            for f in d.files.values():
                out[f.state] = out.get(f.state, 0) + 1
        return out

    @property
    def running(self) -> int:
        """Batches at the provider not yet downloaded."""
        return sum(d.running for d in self.drivers.values())

    async def _recover(self) -> int:
        return sum([await d.recover() for d in self.drivers.values()])

    async def _submit(self) -> int:
        for req in self.log.new():
            if req.source not in self.requests:
                raise ValueError(f"a request was recorded by resource {req.source!r}, which "
                                 f"this map does not batch ({sorted(self.requests)})")
            self.requests[req.source].append(req)
        starting = getattr(self._reserve, "round", None)
        if starting is not None:
            starting(sum(d.counts.lines_answered for d in self.drivers.values()),
                     sum(len(f.digests) for d in self.drivers.values()
                         for f in d.files.values() if f.state == "submitted"))
        return sum([await d.submit(self.requests[name]) for name, d in self.drivers.items()])

    async def _poll(self) -> int:
        ended = 0
        for d in self.drivers.values():
            ended += await d.poll()
        await self._recover()  # a batch not yet confirmed as the map's (after a crash)
        return ended

    def _wait_for_answers(self) -> None:
        """Poll until a batch has ended; with none at the provider (refused for its queue
        limit, or every line given up), wait once and let the rows run again."""
        delay = self.backoff.first
        while not run_sync(self._poll()):
            time.sleep(delay)
            if not self.running:
                return
            delay = min(delay * self.backoff.factor, self.backoff.most)
