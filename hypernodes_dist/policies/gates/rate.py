"""The calls-rate gate: ``rate_limit="N/period"``, one start time per attempt.

Each attempt (retries included: each is a request) takes the next start time of the node's
``limits.Rate`` (spaced ``period/N`` seconds, across every process the backend serves) and
sleeps until then, keeping its concurrency unit and its window place. A call that wakes
later than the limit's burst allows (its tolerance, at least one spacing and ``LATE``) after
its start time (a busy loop or machine) takes a new one instead (up to ``LATE_TRIES``
times): calls woken together by a stall would reach the provider as a burst, which a nearly
spent key refuses; a wake-up late by less is within the burst and keeps its start time (a
new one would waste a start of the schedule every process shares).
"""

from __future__ import annotations

import time
from typing import ClassVar

from hypernodes_dist.policies.gates.base import Entry
from hypernodes_dist.policies.limits import Rate, rate

__all__ = ["RateGate", "LATE_TRIES"]

LATE_TRIES = 3
LATE = 0.02  # seconds: a wake-up later than this (and than one spacing) is a stall


class RateGate:
    holds: ClassVar[bool] = False
    meters: ClassVar[bool] = False

    def __init__(self, node: str, count: float, per: float, text: str) -> None:
        self.rate: Rate = rate(node, count, per)
        self.reason = f"rate_limit={text}"

    async def enter(self, entry: Entry) -> float:
        waited, late = 0.0, max(LATE, self.rate.stale)
        for _ in range(LATE_TRIES):
            wait = self.rate.reserve()
            if wait <= 0:
                return waited
            start = time.time() + wait
            entry.throttle(wait, self.reason)
            await entry.sleep(wait)
            waited += wait
            if time.time() - start <= late:
                return waited
        return waited

    def exit(self, entry: Entry, error: BaseException | None) -> None:
        pass
