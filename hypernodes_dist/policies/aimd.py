"""A node's concurrency that backs off on rate-limit errors and recovers (AIMD).

A node with ``concurrency=N`` calls through a shared limit of N units (every process of the
machine, or of the cluster). In front of it each process keeps its own places (``Backoff``),
N at first. When a call is refused for its rate (HTTP 429, a ``RateLimitError``, a
``Retry-After``), the places halve (multiplicative decrease, at most once per ``COOL``
seconds, never below one); each ``RECOVER`` successful calls in a row widen it by one
(additive increase) back to N. The places are the process's own, so a process always keeps at
least one call going: processes that back off together can never hold the shared limit's
units among them and starve each other.
"""

from __future__ import annotations

import os
import threading
import time

from hypernodes_dist.policies.limits import Slots

__all__ = ["Backoff", "backoff_for", "rate_limited", "Places"]

COOL = 1.0  # seconds between two decreases
RECOVER = 16  # successful calls in a row that add a place


def rate_limited(exc: BaseException) -> bool:
    """Whether ``exc`` says the provider refused the call for its rate."""
    status = getattr(exc, "status_code", None) or getattr(
        getattr(exc, "response", None), "status_code", None)
    return status == 429 or "RateLimit" in type(exc).__name__


class Places:
    """The places of one node in this process: units of this process only, whose number
    (``width``) can change (a ``Slots`` backend). Plain lock on the path of a call; the
    condition only wakes a lease thread sleeping in ``take``."""

    def __init__(self, n: int) -> None:
        self.width, self.used = n, 0
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.sleeping = 0  # threads waiting in take()

    def try_take(self) -> bool:
        with self.lock:
            if self.used < self.width:
                self.used += 1
                return True
            return False

    def take(self) -> None:
        with self.lock:
            while self.used >= self.width:
                self.sleeping += 1
                try:
                    self.changed.wait()
                finally:
                    self.sleeping -= 1
            self.used += 1

    def give(self) -> None:
        with self.lock:
            self.used -= 1
            if self.sleeping:
                self.changed.notify()

    def resize(self, width: int) -> None:
        with self.lock:
            self.width = width
            self.changed.notify_all()


class Backoff:
    """One node's places in this process: ``slots`` (acquire/release like any limit)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.places = Places(n)
        self.slots = Slots(self.places)  # its waiting calls
        self.lock = threading.Lock()
        self.successes = 0
        self.cut_at = -COOL

    @property
    def allowed(self) -> int:
        """Calls this process lets run at once now."""
        return self.places.width

    def refused(self) -> bool:
        """A call was refused for its rate: halve the places; whether they narrowed."""
        with self.lock:
            now = time.monotonic()
            if now - self.cut_at < COOL or self.places.width <= 1:
                return False
            self.cut_at, self.successes = now, 0
            self.places.resize(max(1, self.places.width // 2))
        return True

    def succeeded(self) -> None:
        """A call succeeded: after ``RECOVER`` in a row, add a place."""
        if self.places.width >= self.n:
            return
        with self.lock:
            self.successes += 1
            if self.successes >= RECOVER:
                self.successes = 0
                self.places.resize(min(self.n, self.places.width + 1))


_BACKOFFS: dict[tuple[str, int], Backoff] = {}
_LOCK = threading.Lock()


def backoff_for(node: str, n: int) -> Backoff:
    """This process's ``Backoff`` of node ``node`` with ``concurrency=n``."""
    found = _BACKOFFS.get((node, n))
    if found is None:
        with _LOCK:
            found = _BACKOFFS.setdefault((node, n), Backoff(n))
    return found


def _forget_in_child() -> None:
    _BACKOFFS.clear()


if hasattr(os, "register_at_fork"):  # a forked child's places start anew (no calls of its own)
    os.register_at_fork(after_in_child=_forget_in_child)
