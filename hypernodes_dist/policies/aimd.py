"""A node's concurrency that backs off on rate-limit errors and recovers (AIMD).

A node with ``concurrency=N`` calls through a shared limit of N units (every process of the
machine, or of the cluster). In front of it each process keeps its own gate (``Backoff``),
N wide at first. When a call is refused for its rate (HTTP 429, a ``RateLimitError``, a
``Retry-After``), the gate halves (multiplicative decrease, at most once per ``COOL``
seconds, never below one); each ``RECOVER`` successful calls in a row widen it by one
(additive increase) back to N. The gate is the process's own, so a process always keeps at
least one call going: processes that back off together can never hold the shared limit's
units among them and starve each other.
"""

from __future__ import annotations

import os
import threading
import time

from hypernodes_dist.policies.limits import Slots

__all__ = ["Backoff", "backoff_for", "rate_limited", "Gate"]

COOL = 1.0  # seconds between two decreases
RECOVER = 16  # successful calls in a row that widen the gate by one


def rate_limited(exc: BaseException) -> bool:
    """Whether ``exc`` says the provider refused the call for its rate."""
    status = getattr(exc, "status_code", None) or getattr(
        getattr(exc, "response", None), "status_code", None)
    return status == 429 or "RateLimit" in type(exc).__name__


class Gate:
    """Units of this process only, whose number can change (a ``Slots`` backend)."""

    def __init__(self, n: int) -> None:
        self.width, self.used = n, 0
        self.changed = threading.Condition(threading.Lock())

    def try_take(self) -> bool:
        with self.changed:
            if self.used < self.width:
                self.used += 1
                return True
            return False

    def take(self) -> None:
        with self.changed:
            while self.used >= self.width:
                self.changed.wait()
            self.used += 1

    def give(self) -> None:
        with self.changed:
            self.used -= 1
            self.changed.notify()

    def resize(self, width: int) -> None:
        with self.changed:
            self.width = width
            self.changed.notify_all()


class Backoff:
    """One node's gate in this process: ``slots`` (acquire/release like any limit)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.gate = Gate(n)
        self.slots = Slots(self.gate)
        self.lock = threading.Lock()
        self.successes = 0
        self.cut_at = -COOL

    @property
    def allowed(self) -> int:
        """Calls this process lets run at once now."""
        return self.gate.width

    def refused(self) -> bool:
        """A call was refused for its rate: halve the gate; whether it narrowed."""
        with self.lock:
            now = time.monotonic()
            if now - self.cut_at < COOL or self.gate.width <= 1:
                return False
            self.cut_at, self.successes = now, 0
            self.gate.resize(max(1, self.gate.width // 2))
        return True

    def succeeded(self) -> None:
        """A call succeeded: after ``RECOVER`` in a row, widen the gate by one."""
        if self.gate.width >= self.n:
            return
        with self.lock:
            self.successes += 1
            if self.successes >= RECOVER:
                self.successes = 0
                self.gate.resize(min(self.n, self.gate.width + 1))


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


if hasattr(os, "register_at_fork"):  # a forked child's gates start anew (no calls of its own)
    os.register_at_fork(after_in_child=_forget_in_child)
