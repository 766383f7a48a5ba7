"""Retry-After: the provider's own wait, read from an error, and the hold-off it sets.

``retry_after(exc, most)`` (``signals.py``) finds the wait an error carries (garbage, or
longer than the node's ``max_retry_after``: none). ``HoldOff`` is a node's "no
new call before" time, shared through the limits backend (every process of the machine;
the cluster on ``distributed``), read at most every ``REFRESH`` seconds per process.
"""

from __future__ import annotations

import math
import time

from hypernodes_dist.perprocess import Memo
from hypernodes_dist.policies.backend import SharedValue
from hypernodes_dist.policies.limits import shared
from hypernodes_dist.policies.signals import retry_after

__all__ = ["retry_after", "HoldOff", "holdoff_for", "REFRESH"]

REFRESH = 0.1  # seconds a process trusts the hold-off it last read


class HoldOff:
    """Node ``name``'s hold-off: no new call starts before ``until()`` (wall clock)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.local_until = 0.0
        self.read_at = -math.inf

    def _shared(self) -> SharedValue:
        return shared(f"holdoff-{self.name}")

    def until(self) -> float:
        """The hold-off's end (0.0 or a past time: none)."""
        now = time.monotonic()
        if now - self.read_at >= REFRESH:
            self.read_at = now
            shared = self._shared().get()
            if isinstance(shared, (int, float)) and shared > self.local_until:
                self.local_until = float(shared)
        return self.local_until

    def extend(self, seconds: float) -> None:
        """No new call of the node for ``seconds`` from now (everywhere the backend reaches)."""
        end = time.time() + seconds
        if end <= self.local_until:
            return
        self.local_until = end
        self._shared().update(lambda old: max(float(old or 0.0), end))


_HOLDOFFS: Memo[HoldOff] = Memo("policies.retryafter")  # a forked child starts anew


def holdoff_for(name: str) -> HoldOff:
    """This process's ``HoldOff`` of node ``name`` (one per node: what it last read is
    shared by every guard of the node, so a guard made per call reads the store at most
    every ``REFRESH`` seconds too)."""
    return _HOLDOFFS.get(name, lambda: HoldOff(name))
