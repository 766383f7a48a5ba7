"""A map's Batch API loop in the driver: run the rows, submit what they recorded, wait for
answers, run the waiting rows again, until none waits.

``BatchLoop.run(run_rows, wait)`` takes the map's rows as one callable: ``run_rows()`` runs
the rows not finished yet (the resume machinery: a rerun computes only unfinished rows) and
returns how many wait for a batch. Between two runs the loop submits the requests the
workers recorded (``RequestLog``, one ``BatchDriver`` per resource's transport, one answer
store for the map) and polls with back-off, submitting again between polls what needs it
(lines of failed or expired batches, files held back by the provider's queue limit) without
running the rows, until answers arrive. ``wait=False`` returns once every request is
submitted (waiting out a queue-limit refusal), with the number of rows still waiting; a
rerun on the same folder adopts, collects and submits nothing twice. A map whose batches
the user cancels (``batchcontrol.cancel_batches``) returns its waiting rows at once.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypernodes_dist.batchapi import BatchNotFoundError, BatchTransport, transport_for
from hypernodes_dist.batchapi.driver import BatchDriver, Reserve
from hypernodes_dist.batchapi.identity import map_tag
from hypernodes_dist.batchapi.store import AnswerStore, FileState, RequestLog
from hypernodes_dist.events import Event
from hypernodes_dist.execution.syncio import run_sync
from hypernodes_dist.run.batchview import BatchSummary, batch_event, summarize

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
                 reserve: Reserve | None = None, backoff: Backoff = Backoff(),
                 stores: tuple[RequestLog, AnswerStore] | None = None) -> None:
        """``stores``: the folder's request log and answer store when the caller has them
        (a map: this process's, which its workers here read too: one answer index)."""
        self.folder, self.backoff = Path(folder), backoff
        self.log, self.answers = stores or (RequestLog(self.folder), AnswerStore(self.folder))
        self.drivers = {name: BatchDriver(t, str(self.folder), attempts=attempts,
                                          online_after=online_after, keep_files=keep_files,
                                          ledger_folder=str(self.folder / "ledgers" / name),
                                          resubmit_lost=resubmit_lost, reserve=reserve,
                                          answers=self.answers)
                        for name, t in transports.items()}
        self._reserve: Reserve | None = reserve
        self.on_change: Callable[[BatchSummary], None] | None = None  # the bar
        # the map's callbacks: a BatchSubmittedEvent / BatchEndedEvent per batch
        self.on_event: Callable[[Event], None] | None = None
        self.ids = ("", "")  # the map's session id and run-id prefix, for the events
        self.owners: dict[str, str] = {}  # resource -> the (first) batch node receiving it
        self._told: set[str] = set()  # files whose running batch the events announced
        for name, d in self.drivers.items():
            d.on_batch = functools.partial(self._batch_changed, name)

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
        for name, d in self.drivers.items():  # batches an earlier run left running
            for f in [f for f in d.files.values() if f.state == "submitted"]:
                self._batch_changed(name, f, 0, 0)
        while True:
            waiting = run_rows()
            if waiting == 0:
                return 0
            run_sync(self._submit())
            self._changed()
            if not wait:
                self._wait_for_answers(until_submitted=True)
                return waiting
            self._wait_for_answers()
            if self.stopped:
                return run_rows()
            self._check_lost()

    def _check_lost(self) -> None:
        lost = {name: d.lost for name, d in self.drivers.items() if d.lost}
        if lost and not self.running:
            exc = BatchNotFoundError(", ".join(i for ids in lost.values() for i in ids),
                                     ", ".join(f"resource {name!r}" for name in lost))
            exc.add_note(f"to submit their requests again: hypernodes-dist batches "
                         f"resubmit-lost {self.folder} (or resubmit_lost_batches), then run "
                         "the map again")
            raise exc

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self.summary())

    def _batch_changed(self, resource: str, f: FileState, answered: int, failed: int) -> None:
        """A driver's batch was created or ended: its event to the map's callbacks."""
        if self.on_event is None or (f.state == "submitted" and f.fid in self._told):
            return
        self._told.add(f.fid)
        self.on_event(batch_event(f, resource, self.owners.get(resource, resource), self.ids,
                                  answered, failed))

    def summary(self) -> BatchSummary:
        """The batches by state and the lines done, failed, sent again and online."""
        return summarize(self.drivers.values())

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

    @property
    def stopped(self) -> bool:
        """The user cancelled the map's batches while it ran."""
        return any(d.stopped for d in self.drivers.values())

    async def _recover(self) -> int:
        return sum([await d.recover() for d in self.drivers.values()])

    async def _submit(self) -> int:
        """Each driver submits from the request log, read anew (a generator: no request is
        kept in memory between two submits)."""
        starting = getattr(self._reserve, "round", None)
        if starting is not None:
            starting(sum(d.counts.lines_answered for d in self.drivers.values()), self._live())
        sent = sum([await d.submit_log(self.log, name) for name, d in self.drivers.items()])
        unknown = sorted(self.log.sources - set(self.drivers))
        if unknown:
            raise ValueError(f"a request was recorded by resource {unknown[0]!r}, which this "
                             f"map does not batch ({sorted(self.drivers)})")
        return sent

    async def _poll(self) -> int:
        ended = 0
        for d in self.drivers.values():
            ended += await d.poll()
        await self._recover()  # a batch not yet confirmed as the map's (after a crash)
        return ended

    def _wait_for_answers(self, until_submitted: bool = False) -> None:
        """Poll (with back-off, from the start when a batch ends) and submit again what
        needs it, until answers arrived for at least half of the lines running when it
        began (``until_submitted``: until no file is held back by the queue limit), the user
        cancels, or nothing is left to wait for. Half, not any: each round runs every
        waiting row again, so a map whose batches end one by one runs its rows a few times
        in all (the waiting lines at least halve each round), not once per batch."""
        delay, answered, live = self.backoff.first, self._answers(), self._live()
        while not (until_submitted and not self.held):
            if run_sync(self._poll()):
                delay = self.backoff.first
            self._changed()
            if any(d.again for d in self.drivers.values()):
                run_sync(self._submit())
            if self.stopped or not (self.running or self.held):
                return
            if until_submitted and not self.held:
                return
            if not until_submitted and 2 * (self._answers() - answered) >= max(1, live):
                return
            time.sleep(delay)
            delay = min(delay * self.backoff.factor, self.backoff.most)

    @property
    def held(self) -> bool:
        """Files held back by a provider's queue limit, to be submitted later."""
        return any(d.held for d in self.drivers.values())

    def _answers(self) -> int:
        """Answers written so far (a row waiting for one of them may go on)."""
        return sum(d.counts.answers for d in self.drivers.values())

    def _live(self) -> int:
        """Lines in batches running at the provider."""
        return sum(len(f.digests) for d in self.drivers.values() for f in d.files.values()
                   if f.state == "submitted")
