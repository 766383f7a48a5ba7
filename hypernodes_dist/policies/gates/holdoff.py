"""The Retry-After gate: no new attempt of a node while a provider told it to wait.

``enter`` waits out the node's hold-off (``retryafter.HoldOff``: shared by every process the
limits backend serves). ``exit`` reads the wait a failed attempt's error carries
(``signals.retry_after``: garbage, or longer than the node's ``max_retry_after``, is
ignored; a refusal for exhausted quota holds nothing off: waiting does not help), spread at random so the calls told the same time do not collide again,
and holds off every new call of the node that long (``entry.told``: the retry waits it too).
Every guarded node has this gate (and one per resource it receives: a Retry-After holds
off every node calling that API): any error may carry a Retry-After. The same hold-offs are
checked again once the call has its concurrency unit and rate turn (``recheck=True``: it
waits and learns nothing): a call that queued while a hold-off began waits it out too.
"""

from __future__ import annotations

import random
import time
from typing import ClassVar

from hypernodes_dist.policies.gates.base import Entry
from hypernodes_dist.policies.retryafter import holdoff_for
from hypernodes_dist.policies.signals import MAX_RETRY_AFTER, final, retry_after

__all__ = ["HoldOffGate", "RETRY_AFTER_SPREAD"]

# A retry told to wait by Retry-After waits up to this share longer, drawn at random: every
# call refused in one burst is told the same time, and would all retry at once again.
RETRY_AFTER_SPREAD = 0.25


class HoldOffGate:
    holds: ClassVar[bool] = False
    meters: ClassVar[bool] = False

    def __init__(self, node: str, most: float = MAX_RETRY_AFTER, recheck: bool = False
                 ) -> None:
        self.node, self.most, self.recheck = node, most, recheck
        self.holdoff = holdoff_for(node)

    async def enter(self, entry: Entry) -> float:
        holdoff, waited = self.holdoff, 0.0
        while True:
            wait = holdoff.until() - time.time()
            if wait <= 0:
                return waited
            waited += wait
            entry.throttle(wait, "Retry-After hold-off")
            await entry.sleep(wait)

    def exit(self, entry: Entry, error: BaseException | None) -> None:
        if self.recheck or not isinstance(error, Exception) or final(error):
            return
        told = retry_after(error, self.most)
        if not told:
            return
        told *= 1 + random.random() * RETRY_AFTER_SPREAD  # at least that long
        entry.told = told
        self.holdoff.extend(told)
        entry.event("hold_off", told,
                    f"Retry-After {told:g} s: no new call of {self.node!r} meanwhile")
