"""A node's concurrency that backs off on rate-limit errors and recovers (AIMD).

A node with ``concurrency=N`` calls through a shared limit of N units (``limits.Slots``).
When a call is refused for its rate (HTTP 429, a ``RateLimitError``, a ``Retry-After``), this
process *parks* units of that limit: it holds them without calling, halving the calls it
lets run (multiplicative decrease, at most once per ``COOL`` seconds, never below one). Each
``RECOVER`` successful calls in a row give one parked unit back (additive increase). Parked
units are held like a call's, so on a shared backend every process of the machine (or of
the cluster) sees the lower concurrency; a process that ends gives them back (the kernel's
``SEM_UNDO``, a lease's expiry).
"""

from __future__ import annotations

import threading
import time
from typing import Any

__all__ = ["Backoff", "backoff_for", "rate_limited"]

COOL = 1.0  # seconds between two decreases
RECOVER = 16  # successful calls that give one parked unit back


def rate_limited(exc: BaseException) -> bool:
    """Whether ``exc`` says the provider refused the call for its rate."""
    status = getattr(exc, "status_code", None) or getattr(
        getattr(exc, "response", None), "status_code", None)
    return status == 429 or "RateLimit" in type(exc).__name__


class Backoff:
    """The parked units of one node's concurrency limit in this process."""

    def __init__(self, slots: Any, n: int) -> None:
        self.slots, self.n = slots, n
        self.lock = threading.Lock()
        self.parked = self.parking = 0
        self.successes = 0
        self.cut_at = -COOL

    @property
    def allowed(self) -> int:
        """Calls this process lets run at once now."""
        return self.n - self.parked - self.parking

    def refused(self) -> int:
        """A call was refused for its rate: park half of what runs; returns units parked."""
        with self.lock:
            now = time.monotonic()
            if now - self.cut_at < COOL or self.allowed <= 1:
                return 0
            self.cut_at, self.successes = now, 0
            more = self.allowed - max(1, self.allowed // 2)
            self.parking += more
        threading.Thread(target=self._park, args=(more,), daemon=True,
                         name="hn-aimd-park").start()
        return more

    def _park(self, count: int) -> None:
        for _ in range(count):
            _drive(self.slots.acquire(True))  # a blocking wait: never suspends
            with self.lock:
                self.parking -= 1
                self.parked += 1

    def succeeded(self) -> bool:
        """A call succeeded; True when it gave a parked unit back."""
        with self.lock:
            if not self.parked:
                return False
            self.successes += 1
            if self.successes < RECOVER:
                return False
            self.successes = 0
            self.parked -= 1
        self.slots.release()
        return True


def _drive(coro: Any) -> None:
    try:
        coro.send(None)
    except StopIteration:
        return
    coro.close()
    raise RuntimeError("a blocking limit wait suspended")


_BACKOFFS: dict[int, Backoff] = {}
_LOCK = threading.Lock()


def backoff_for(slots: Any, n: int) -> Backoff:
    """This process's ``Backoff`` of the concurrency limit ``slots`` (one per limit)."""
    found = _BACKOFFS.get(id(slots))
    if found is None or found.slots is not slots:
        with _LOCK:
            found = _BACKOFFS.get(id(slots))
            if found is None or found.slots is not slots:
                found = _BACKOFFS[id(slots)] = Backoff(slots, n)
    return found
