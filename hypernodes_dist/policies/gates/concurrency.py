"""The concurrency gate: ``concurrency=N`` calls at once, backing off on rate-limit errors.

A call takes a place of this process's ``aimd.Backoff`` (as many as the API's width: N at
first, halved on a 429 or a Retry-After seen by any process, one back per ``RECOVER``
successes), then a unit of the shared limit (``limits.Slots`` over the backend's semaphore:
every process of the machine or cluster); ``exit`` gives them back the other way round. A
place passes straight to a waiting call only while it is within the width: after a cut,
finished calls return their places until the running calls fit the lowered width.
"""

from __future__ import annotations

from typing import ClassVar

from hypernodes_dist.policies.aimd import Backoff, backoff_for, rate_limited
from hypernodes_dist.policies.gates.base import Entry
from hypernodes_dist.policies.limits import Slots, slots
from hypernodes_dist.policies.signals import final, retry_after

__all__ = ["ConcurrencyGate"]


class ConcurrencyGate:
    holds: ClassVar[bool] = True
    meters: ClassVar[bool] = False

    def __init__(self, node: str, n: int) -> None:
        self.n = n
        self.reason = f"concurrency={n}"
        self.backoff: Backoff = backoff_for(node, n)
        self.waiting: Slots = self.backoff.slots  # calls waiting for a place, FIFO
        self.places = self.backoff.places
        self.shared: Slots = slots(node, n)

    async def enter(self, entry: Entry) -> float:
        self.backoff.refresh()  # a cut (or recovery) another process made
        # a free place is taken at once; with none free, the call queues (FIFO, no polling)
        waited = 0.0 if self.places.try_take() else await self.waiting.acquire(entry.blocking)
        try:
            waited += await self.shared.acquire(entry.blocking)
        except BaseException:
            self._give_place()
            raise
        entry.in_slot = True
        if waited > 0:
            entry.throttle(waited, self.reason)
        return waited

    def exit(self, entry: Entry, error: BaseException | None) -> None:
        try:  # learn first: a refused call's place must not pass to a waiting call past the cut
            self._learn(entry, error)
        finally:
            self.shared.release()
            self._give_place()

    def _learn(self, entry: Entry, error: BaseException | None) -> None:
        if error is None:
            self.backoff.succeeded()
        elif isinstance(error, Exception) and not final(error) and (
                rate_limited(error) or retry_after(error) is not None):
            if self.backoff.refused():
                entry.throttle(0.0, f"rate limited: concurrency lowered to "
                               f"{self.backoff.allowed} of {self.n} for every process")

    def _give_place(self) -> None:
        if self.waiting.waiters and self.places.within():
            self.waiting.release()  # straight to the first waiting call
        else:  # a call queueing meanwhile is woken by the waiting list's own lease thread
            self.places.give()
