"""``PROCESS``: the one per-process registry object.

Several modules keep state that belongs to this process only: the limiters and their
backend (``policies/limits.py``), a node's gates, learned limits, AIMD places, Retry-After
hold-offs, usage estimates and policy counts (``policies/``), the resources built here
(``resources/registry.py``), the process loop (``execution/syncio.py``), batch calls in
flight (``execution/batching.py``), progress tickers and channels, and the engines' own
(mailboxes, shipped plans, watchers). A forked child inherits that state but none of the
threads, locks, sockets or calls behind it, so it must start as a spawned process does.
Each such registry is a ``Memo`` (values made once per key) or a ``Table`` (a dict and its
lock), which register themselves here, or registers how to forget it
(``PROCESS.register``); one after-fork hook resets them all, in registration (import)
order. ``PROCESS.names()`` lists what is per-process.

Not here, because a child may keep them: memos of immutable derived data (code
identities, a plan's slices, hashing dispatch, trace shapes), the backends plugins register
(``policies.limits.register_backend``), and the parent's cache handles a forked child
keeps open but never uses (``cache/segcache.py``).
"""

from __future__ import annotations

import os
import threading
import traceback
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["PROCESS", "Registries", "Memo", "Table"]

K = TypeVar("K", bound=Hashable)
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


class Table(dict[K, V]):
    """A dict of this process (``lock``: for writers that read before they write),
    registered in ``PROCESS`` as ``name``: a forked child starts empty, with a new lock."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.lock = threading.Lock()
        PROCESS.register(name, self.forget)

    def forget(self) -> None:
        """Every entry dropped, and a new lock (a child's copy may be held by no thread)."""
        self.clear()
        self.lock = threading.Lock()


class Memo(Generic[V]):
    """Values made once per key in this process (``get(key, make)``; racing threads make
    one), registered in ``PROCESS`` as ``name``: a forked child starts empty. ``keep``:
    only the newest ``keep`` keys are kept (the oldest made is dropped first)."""

    def __init__(self, name: str, keep: int | None = None) -> None:
        self.values: Table[Hashable, V] = Table(name)
        self.keep = keep

    def get(self, key: Hashable, make: Callable[[], V]) -> V:
        """``make()`` (never ``None``) for ``key`` the first time, the same value after."""
        found = self.values.get(key)
        if found is None:
            with self.values.lock:
                found = self.values.get(key)
                if found is None:
                    found = self.values[key] = make()
                    while self.keep is not None and len(self.values) > self.keep:
                        del self.values[next(iter(self.values))]
        return found

    def forget(self) -> None:
        self.values.forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=PROCESS.reset)
