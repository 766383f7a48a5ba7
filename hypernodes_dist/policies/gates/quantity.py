"""A quantity-rate gate: ``rate_limit={"tokens": "N/period"}`` on a metered quantity.

``enter`` reserves what the attempt is expected to meter (``usage.estimate``: the mean of
the node's last calls in this process) from the limit's rate (``limits.Rate``: the backend's,
reserved in blocks), and waits for the time that amount may start (less a bounded burst:
``limits.paced``); an amount larger than the whole window's limit could never start, so the
attempt fails at once (``WindowLimitError``, naming the limit); ``exit`` corrects the
reservation by what the attempt really metered (gives back, or takes more), so the next
call sees what this one spent.
"""

from __future__ import annotations

from typing import ClassVar

from hypernodes_dist.errors import WindowLimitError
from hypernodes_dist.policies.gates.base import Entry
from hypernodes_dist.policies.limits import Rate, quantity
from hypernodes_dist.policies.spec import QuantityRate
from hypernodes_dist.policies.usage import estimate

__all__ = ["QuantityGate", "PACE"]

# Metered quantities are paced at this share of their declared rate: a provider counting
# on its own clock in a sliding window sees our start times shifted by network and loop
# jitter, and pacing at exactly its limit keeps every window at the edge (1% of requests
# refused at 100%, measured by ``benchmarks/bench_paid_api.py``).
PACE = 0.98


class QuantityGate:
    holds: ClassVar[bool] = False
    meters: ClassVar[bool] = True

    def __init__(self, node: str, q: QuantityRate, key: str | None = None) -> None:
        self.node, self.quantity, self.q = node, q.quantity, q  # ``node``: whose calls
        # are estimated; ``key``: the limit's owner. A bounded burst, as calls have.
        self.rate: Rate = quantity(f"{key or node}:{q.quantity}", q.count * PACE, q.per)
        self.reason = f"rate_limit {q.text}"

    async def enter(self, entry: Entry) -> float:
        expected = estimate(self.node, self.quantity)
        if expected > self.q.count:
            raise self._too_large(entry, expected)
        wait = self.rate.reserve(expected)
        entry.keep(self, expected)
        if wait <= 0:
            return 0.0
        entry.throttle(wait, self.reason)
        await entry.sleep(wait)
        return wait

    def _too_large(self, entry: Entry, expected: float) -> WindowLimitError:
        q, item = self.q, entry.item
        where = f"node {self.node!r}" if item is None else f"node {self.node!r} (item {item})"
        return WindowLimitError(
            f"{where} did not start: its calls meter about {expected:g} {q.quantity} each, more "
            f"than rate_limit {q.quantity}={q.count:g} per {q.per:g}s allows in a whole window, "
            f"so it could never start. Raise the limit (what the provider allows) or make "
            f"calls smaller", self.node, q.quantity, expected, q.count, q.per)

    def exit(self, entry: Entry, error: BaseException | None) -> None:
        delta = entry.metered().get(self.quantity, 0.0) - entry.kept_by(self)
        if delta:
            self.rate.correct(delta)
