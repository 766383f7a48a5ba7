"""An in-process limits backend: every limit held by this process alone.

What ``httpx.MockTransport`` is to a transport: a whole ``backend.LimitsBackend`` with no
files, semaphores or scheduler behind it, for tests of the policy machinery and as the model
of a backend. Install it with ``limits.using(MemoryLimits())`` (engines whose calls run in
this process only: the local engine, Dask's threads, Daft's native runner).
"""

from __future__ import annotations

import copy
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

from hypernodes_dist.policies.backend import LimitsBackend

__all__ = ["MemoryLimits", "MemorySemaphore", "MemoryRate", "MemoryValue"]

_IDS = itertools.count(1)


class MemorySemaphore:
    """``n`` units of this process."""

    def __init__(self, n: int) -> None:
        self.sem = threading.Semaphore(n)
        self.ops = 0  # operations (tests read it: the backend was used)

    def try_take(self) -> bool:
        self.ops += 1
        return self.sem.acquire(blocking=False)

    def take(self) -> None:
        self.ops += 1
        self.sem.acquire()

    def give(self) -> None:
        self.ops += 1
        self.sem.release()

    def withhold(self, k: int) -> int:
        """Up to ``k`` free units out of circulation (``shrink.Shrink``)."""
        taken = 0
        while taken < k and self.sem.acquire(blocking=False):
            taken += 1
        return taken

    def retire(self) -> None:
        """A unit held here, kept out of circulation instead of given back."""

    def restore(self, k: int) -> None:
        if k > 0:
            self.sem.release(k)


class MemoryRate:
    """Start times ``per/count`` seconds apart (the reservation ``machine.FileRate`` keeps in
    a file)."""

    def __init__(self, count: float, per: float) -> None:
        self.interval = per / count
        self.lock = threading.Lock()
        self.tat = 0.0  # the next free start time
        self.ops = 0

    def reserve(self, k: float = 1) -> float:
        with self.lock:
            self.ops += 1
            start = max(self.tat, time.time())
            self.tat = start + k * self.interval
        return start


class MemoryValue:
    """A value of this process, updated under a lock."""

    def __init__(self, values: dict[str, Any], key: str, lock: threading.Lock) -> None:
        self.values, self.key, self.lock = values, key, lock

    def get(self) -> Any:
        with self.lock:
            return copy.deepcopy(self.values.get(self.key))

    def update(self, change: Callable[[Any], Any]) -> Any:
        with self.lock:
            value = change(copy.deepcopy(self.values.get(self.key)))
            self.values[self.key] = value
            return copy.deepcopy(value)

    def remove(self) -> None:
        with self.lock:
            self.values.pop(self.key, None)


class MemoryLimits(LimitsBackend):
    """Limits of this process only. Each instance is a backend of its own (fresh state)."""

    name = "memory"

    def __init__(self) -> None:
        self.directory = f"memory-{next(_IDS)}"
        self.values: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.made: list[Any] = []  # what it handed out (tests: it was used)

    def semaphore(self, key: str, n: int) -> MemorySemaphore:
        return self._made(MemorySemaphore(n))

    def rate(self, key: str, count: float, per: float) -> MemoryRate:
        return self._made(MemoryRate(count, per))

    def shared(self, key: str) -> MemoryValue:
        return self._made(MemoryValue(self.values, key, self.lock))

    def _made(self, found: Any) -> Any:
        self.made.append(found)
        return found
