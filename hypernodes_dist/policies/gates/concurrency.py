"""The concurrency gate: ``concurrency=N`` calls at once, backing off on rate-limit errors.

A call takes one of this gate's places in this process (``aimd.Places``: as many as the
API's width, N at first) then a unit of the shared limit (``limits.Slots`` over the
backend's semaphore of N units: every process of the machine or cluster); ``exit`` gives
them back the other way round. The width is the API's back-off (``aimd.Backoff``: keyed
by the resource the node calls, or by the node when it receives none), halved on a 429 or
a Retry-After seen by any process or node calling that API. A lowered width K binds in
total: N - K of the shared units are withheld (``shrink.Shrink``) and a finished call's
unit pays what is still owed before it passes to a waiting call, so at most K calls run
at once across every process (per process only on a backend whose units cannot be
withheld). A place passes straight to a waiting call only while it is within the width.
"""

from __future__ import annotations

from typing import ClassVar

from hypernodes_dist.policies.aimd import Backoff, Places, backoff_for, rate_limited
from hypernodes_dist.policies.gates.base import Entry
from hypernodes_dist.policies.limits import Slots, shared, slots
from hypernodes_dist.policies.shrink import Shrink
from hypernodes_dist.policies.signals import final, retry_after

__all__ = ["ConcurrencyGate"]


class ConcurrencyGate:
    holds: ClassVar[bool] = True
    meters: ClassVar[bool] = False

    def __init__(self, node: str, n: int, api: str | None = None) -> None:
        self.n = n
        self.reason = f"concurrency={n}"
        self.places = Places(n)
        self.waiting = Slots(self.places)  # calls waiting for a place, FIFO
        self.shared: Slots = slots(node, n)
        self.shrink = Shrink(self.shared.sem, n, shared(f"withheld-{n}-{node}"), api or node)
        self.backoff: Backoff = backoff_for(api or node, n)
        self.backoff.watch(self._resize)

    def _resize(self, width: int) -> None:
        self.places.resize(width)
        self.shrink.resize(width)

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
        try:  # learn first: a refused call's unit must not pass to a waiting call past the cut
            self._learn(entry, error)
        finally:
            try:
                if not self.shrink.retire():  # owed to a lowered width: withheld instead
                    self.shared.release()
            finally:
                self._give_place()

    def _learn(self, entry: Entry, error: BaseException | None) -> None:
        if error is None:
            self.backoff.succeeded()
        elif isinstance(error, Exception) and not final(error) and (
                rate_limited(error) or retry_after(error) is not None):
            if self.backoff.refused():
                total = "in total" if self.shrink.able else "in each process"
                entry.throttle(0.0, f"rate limited: concurrency lowered to "
                               f"{self.backoff.allowed} of {self.n} {total}")

    def _give_place(self) -> None:
        if self.waiting.waiters and self.places.within():
            self.waiting.release()  # straight to the first waiting call
        else:  # a call queueing meanwhile is woken by the waiting list's own lease thread
            self.places.give()
