"""The Retry-After gate: no new attempt of a node while a provider told it to wait.

``enter`` waits out the node's hold-off (``retryafter.HoldOff``: shared by every process the
limits backend serves). ``exit`` reads the wait a failed attempt's error carries
(``retry_after``), spread at random so the calls told the same time do not collide again,
and holds off every new call of the node that long (``entry.told``: the retry waits it too).
Every guarded node has this gate: any error may carry a Retry-After.
"""

from __future__ import annotations

import random
import time
from typing import ClassVar

from hypernodes_dist.errors import BudgetExceededError
from hypernodes_dist.policies.gates.base import Entry
from hypernodes_dist.policies.retryafter import holdoff_for, retry_after

__all__ = ["HoldOffGate", "RETRY_AFTER_SPREAD"]

# A retry told to wait by Retry-After waits up to this share longer, drawn at random: every
# call refused in one burst is told the same time, and would all retry at once again.
RETRY_AFTER_SPREAD = 0.25


class HoldOffGate:
    holds: ClassVar[bool] = False
    meters: ClassVar[bool] = False

    def __init__(self, node: str) -> None:
        self.node = node
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
        if not isinstance(error, Exception) or isinstance(error, BudgetExceededError):
            return
        told = retry_after(error)
        if not told:
            return
        told *= 1 + random.random() * RETRY_AFTER_SPREAD  # at least that long
        entry.told = told
        self.holdoff.extend(told)
        entry.event("hold_off", told,
                    f"Retry-After {told:g} s: no new call of {self.node!r} meanwhile")
