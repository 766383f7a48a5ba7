"""``PROCESS``: the one per-process registry object.

Several modules keep state that belongs to this process only: the limiters and their
backend (``policies/limits.py``), a node's gates, learned estimates, AIMD places and
Retry-After hold-offs (``policies/``), the resources built here (``resources/registry.py``)
and the process loop (``execution/syncio.py``). A forked child inherits that state but
none of the threads, locks or calls behind it, so each module registers here how to forget
its part, and one after-fork hook resets them all, in registration (import) order.
``PROCESS.names()`` lists what is per-process.
"""

from __future__ import annotations

import os
import threading
import traceback
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["PROCESS", "Registries", "Memo"]

V = TypeVar("V")


class Registries:
    """This process's registries, by name: each with the function that forgets it."""

    def __init__(self) -> None:
        self._resets: dict[str, Callable[[], None]] = {}

    def register(self, name: str, reset: Callable[[], None]) -> None:
        """``reset()`` forgets what registry ``name`` holds for this process."""
        self._resets[name] = reset

    def names(self) -> tuple[str, ...]:
        return tuple(self._resets)

    def reset(self) -> None:
        """Forget every registry (a forked child); one that fails does not stop the rest."""
        for reset in list(self._resets.values()):
            try:
                reset()
            except Exception:  # as os.register_at_fork does: report, go on
                traceback.print_exc()


PROCESS = Registries()


class Memo(Generic[V]):
    """Values made once per key in this process (``get(key, make)``; racing threads make
    one), registered in ``PROCESS`` as ``name``: a forked child starts empty."""

    def __init__(self, name: str) -> None:
        self.values: dict[Hashable, V] = {}
        self._lock = threading.Lock()
        PROCESS.register(name, self.forget)

    def get(self, key: Hashable, make: Callable[[], V]) -> V:
        found = self.values.get(key)
        if found is None:
            with self._lock:
                found = self.values.get(key)
                if found is None:
                    found = self.values[key] = make()
        return found

    def forget(self) -> None:
        """Every value dropped, and a new lock (a child's copy may be held by no thread)."""
        self.values.clear()
        self._lock = threading.Lock()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=PROCESS.reset)
