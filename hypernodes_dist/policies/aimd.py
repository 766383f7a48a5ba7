"""A concurrency that backs off on rate-limit errors and recovers (AIMD), one per API.

A node with ``concurrency=N`` calls through a shared limit of N units (every process of the
machine, or of the cluster). Its *width*, N at first, is the back-off of the API it calls
(``Backoff``: keyed by the resource the node receives, or by the node when it receives
none), kept in the limits backend (``shared``): one back-off for every node and process
calling the API. When a call is refused for its rate (HTTP 429, a ``RateLimitError``, a
``Retry-After``), the width halves (multiplicative decrease, at most once per ``COOL``
seconds whichever process saw it, never below one); each ``RECOVER`` successful calls in a
row of a process widen it by one (additive increase) back to N; every process reads the
width within ``REFRESH`` seconds; a width untouched for ``FORGET`` seconds is forgotten.
The concurrency gate makes a lowered width bind in total
(``shrink.Shrink``: the shared units beyond it are withheld) and in each process
(``Places``: a finished call hands its place to a waiting one only while the place is
within the width; every process keeps at least one place, so processes backing off
together never starve each other).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

from hypernodes_dist.perprocess import Memo
from hypernodes_dist.policies.backend import SharedValue
from hypernodes_dist.policies.limits import backend, shared

__all__ = ["Backoff", "backoff_for", "rate_limited", "Places"]

COOL = 1.0  # seconds between two decreases
RECOVER = 16  # successful calls in a row that add a place
REFRESH = 0.1  # seconds a process trusts the shared width it last read
# a width no process cut or widened for this long is forgotten (the API's full width
# again): a back-off left by an earlier run, or an API idle since, does not hold calls back
FORGET = 60.0


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

    def within(self) -> bool:
        """Whether a place being returned is still in force (the width not lowered past it):
        only then may it pass straight to a waiting call."""
        with self.lock:
            return self.used <= self.width

    def resize(self, width: int) -> None:
        with self.lock:
            self.width = width
            self.changed.notify_all()


class Backoff:
    """One API's back-off as this process sees it: the ``width`` every process shares
    through the limits backend (``state``: ``{"width", "cut_at"}``; none yet: ``n``). A cut
    or a recovery by any process is read by every other within ``REFRESH`` seconds and
    passed to the gates ``watch``-ing it (each sizes its places and its shared units).
    """

    def __init__(self, n: int, state: SharedValue) -> None:
        self.n = n
        self.width = n
        self.state = state
        self.lock = threading.Lock()
        self.successes = 0
        self.read_at = -math.inf
        self.watchers: list[Callable[[int], None]] = []

    @property
    def allowed(self) -> int:
        """Calls the API's width lets run at once now (every process together)."""
        return self.width

    def watch(self, resize: Callable[[int], None]) -> None:
        """``resize(width)`` now and whenever the width changes."""
        self.watchers.append(resize)
        resize(self.width)

    def refresh(self) -> None:
        """Read the shared width (at most every ``REFRESH`` seconds) and pass it on."""
        now = time.monotonic()
        if now - self.read_at >= REFRESH:
            self.read_at = now
            self._apply(self.state.get())

    def _apply(self, found: Any) -> None:
        width = _width(found, self.n)
        if width != self.width:
            self.width = width
            for resize in list(self.watchers):
                resize(width)

    def refused(self) -> bool:
        """A call was refused for its rate: halve the width (every process's, at most once
        per ``COOL`` seconds, never below one); whether it narrowed."""
        cut = [False]

        def change(old: Any) -> dict[str, Any]:
            width, now = _width(old, self.n), time.time()
            at = float(old.get("cut_at", 0)) if isinstance(old, dict) else 0.0
            if now - at < COOL or width <= 1:
                return {"width": width, "cut_at": at, "at": now}
            cut[0] = True
            return {"width": max(1, width // 2), "cut_at": now, "at": now}

        self._apply(self.state.update(change))
        self.read_at = time.monotonic()
        with self.lock:
            self.successes = 0
        return cut[0]

    def succeeded(self) -> None:
        """A call succeeded: after ``RECOVER`` in a row in this process, widen by one (every
        process's) back to ``n``."""
        if self.width >= self.n:
            return
        with self.lock:
            self.successes += 1
            if self.successes < RECOVER:
                return
            self.successes = 0
        n = self.n

        def change(old: Any) -> dict[str, Any]:
            found = old if isinstance(old, dict) else {}
            return {**found, "width": min(n, _width(old, n) + 1), "at": time.time()}

        self._apply(self.state.update(change))
        self.read_at = time.monotonic()


def _width(found: Any, n: int) -> int:
    """The width a shared state says (``n``: none, or untouched for ``FORGET`` seconds)."""
    if not isinstance(found, dict) or not isinstance(found.get("width"), int):
        return n
    at = found.get("at", found.get("cut_at"))
    if not isinstance(at, (int, float)) or time.time() - at > FORGET:
        return n
    return max(1, min(n, found["width"]))


_BACKOFFS: Memo[Backoff] = Memo("policies.aimd")  # a forked child starts anew


def backoff_for(key: str, n: int) -> Backoff:
    """This process's ``Backoff`` of the API ``key`` (a node's name when it calls through no
    resource) with ``concurrency=n``, over the limits backend in force here."""
    where = backend()
    ident = (where.name, where.directory, key, n)
    return _BACKOFFS.get(ident, lambda: Backoff(n, shared(f"aimd-{n}-{key}")))
