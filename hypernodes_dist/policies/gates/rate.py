"""The calls-rate gate: ``rate_limit="N/period"``, one start time per attempt.

Each attempt (retries included: each is a request) takes the next start time of the node's
``limits.Rate`` (spaced ``period/N`` seconds, across every process the backend serves) and
sleeps until then, keeping its concurrency unit and its window place.
"""

from __future__ import annotations

from typing import ClassVar

from hypernodes_dist.policies.gates.base import Entry
from hypernodes_dist.policies.limits import Rate, rate

__all__ = ["RateGate"]


class RateGate:
    holds: ClassVar[bool] = False
    meters: ClassVar[bool] = False

    def __init__(self, node: str, count: float, per: float, text: str) -> None:
        self.rate: Rate = rate(node, count, per)
        self.reason = f"rate_limit={text}"

    async def enter(self, entry: Entry) -> float:
        wait = self.rate.reserve()
        if wait > 0:
            entry.throttle(wait, self.reason)
            await entry.sleep(wait)
        return wait

    def exit(self, entry: Entry, error: BaseException | None) -> None:
        pass
