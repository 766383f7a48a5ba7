"""The learned-limits gate: a resource declaring no limit paces by its provider's headers.

Until this process (or another, through the backend) has seen a response of the resource's
client (``policies/learned.py``), one call goes alone: its response states the limits; the
others wait for it (at most ``PROBE`` seconds). Then each attempt takes a start time of a
rate of ``LEARNED_PACE`` x the stated requests per minute (a token bucket refilled
continuously, shared by every process through the backend; its burst that of a
per-second limit: a key's remaining requests are not assumed) and, for a node that meters
``tokens``, reserves its expected tokens from ``PACE`` x the stated tokens per minute.
A client stating nothing passes.

Remaining and reset pace the start: when the first limits this gate reads say fewer
requests remain than ``SLACK`` seconds of the provider's refill (at least 1), the rate's
next start moves on by the missing ones, so calls start once the key has that much in hand
(from a nearly spent key, the first calls wait a moment instead of being refused); later,
only a response saying none remain moves it on (by one), at most once per refill of it.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from hypernodes_dist.policies.gates.base import Entry
from hypernodes_dist.policies.gates.quantity import QuantityGate
from hypernodes_dist.policies.gates.rate import RateGate
from hypernodes_dist.policies.learned import Learned, learned_for, period_of
from hypernodes_dist.policies.spec import QuantityRate

__all__ = ["LearnedGate", "PROBE", "LEARNED_PACE", "SLACK"]

PROBE = 10.0  # seconds calls wait at most for the first response to state the limits
# a learned limit is paced at this share (the key's slack grows by the rest; a provider's
# clock and ours disagree by the network's and the event loop's jitter)
LEARNED_PACE = 0.95
SLACK = 0.25  # seconds of the provider's refill kept in hand before calls start
_PROBING = object()
_STEP = 0.005


class LearnedGate:
    holds: ClassVar[bool] = False
    meters: ClassVar[bool] = True

    def __init__(self, node: str, key: str) -> None:
        self.node, self.key = node, key
        self.learned: Learned = learned_for(key)
        self.made: dict[tuple[str, float, float], Any] = {}
        self.probed = False  # this process's probe is over
        self.pushed = 0.0  # until then (wall clock), the rate has waited for the slack

    async def enter(self, entry: Entry) -> float:
        state = self.learned.current()
        waited = 0.0
        if state is None:
            if self._probe(entry):
                return 0.0
            waited = await self._wait_probe(entry)
            state = self.learned.state
            if state is None:
                return waited
        gates = self._gates(state)
        if gates and isinstance(gates[0], RateGate):
            self._slack(state, gates[0])
        entry.keep(self, gates)
        for gate in gates:
            waited += await gate.enter(entry)
        return waited

    def exit(self, entry: Entry, error: BaseException | None) -> None:
        kept = entry.kept_by(self)
        if kept is _PROBING:
            self.learned.probing, self.probed = False, True
        elif kept:
            for gate in reversed(kept):
                gate.exit(entry, error)

    def _probe(self, entry: Entry) -> bool:
        """Whether this call goes alone to learn the limits."""
        learned = self.learned
        if self.probed:  # (read without the lock: it only ever turns True)
            return False
        with learned.lock:
            if learned.probing or self.probed:
                return False
            learned.probing = True
        entry.keep(self, _PROBING)
        return True

    async def _wait_probe(self, entry: Entry) -> float:
        learned, waited = self.learned, 0.0
        while learned.probing and learned.state is None and waited < PROBE:
            await entry.sleep(_STEP)
            waited += _STEP
        if waited:
            entry.throttle(waited, f"learning the limits of {self.key}")
        return waited

    def _slack(self, state: dict[str, Any], gate: RateGate) -> None:
        """Fewer requests remaining than the slack: the next start waits for the rest."""
        limit, left = state["requests"][:2]
        per_second = limit / _period(state["requests"])
        slack = max(1.0, SLACK * per_second)
        if self.pushed:  # after the start: only a spent key (none remaining) waits
            slack = 1.0
        if left is None or left >= slack or state.get("at", 0.0) <= self.pushed:
            return
        self.pushed = time.time() + slack / per_second
        gate.rate.rate.reserve(slack - left)

    def _gates(self, state: dict[str, Any]) -> tuple[Any, ...]:
        gates: list[Any] = []
        requests, tokens = state.get("requests"), state.get("tokens")
        if requests:
            gates.append(self._made("calls", requests[0], _period(requests)))
        if tokens:
            gates.append(self._made("tokens", tokens[0], _period(tokens)))
        return tuple(gates)

    def _made(self, quantity: str, limit: float, per: float) -> Any:
        found = self.made.get((quantity, limit, per))
        if found is None:
            text = f"{limit:g}/{per:g}s (learned from {self.key}'s responses)"
            if quantity == "calls":
                # per second: a burst (1% of the count) of a second's worth at most
                found = RateGate(f"{self.key}:learned", limit * LEARNED_PACE / per, 1.0, text)
            else:
                found = QuantityGate(self.node, QuantityRate(quantity, limit, per),
                                     key=f"{self.key}:learned")
            self.made[(quantity, limit, per)] = found
        return found


def _period(seen: list[Any]) -> float:
    """A learned limit's period: the one its response kept (``Learned.saw``), else read."""
    return seen[3] if len(seen) > 3 else period_of(*seen[:3])
