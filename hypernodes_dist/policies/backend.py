"""The limits backend: where the state shared by every process under one limit lives.

A backend hands out four kinds of objects, one per key (a node's limit, a map's budget):

- ``semaphore(key, n)``: ``n`` units (``concurrency=n``), a ``Semaphore``;
- ``rate(key, count, per)``: start times spaced ``per/count`` seconds (``rate_limit``; a
  metered quantity's rate reserves amounts), a ``RateStore``;
- ``shared(key)``: a small JSON value updated atomically (a map's budget totals, a node's
  Retry-After hold-off), a ``SharedValue``.

``machine.MachineLimits`` (every process of one machine) is the default; an engine whose
workers span machines registers its own (``limits.register_backend``: ``hypernodes_dask``'s
``DistributedLimits``); ``memory.MemoryLimits`` serves one process (tests, and the model
of a backend in one short module). The process side of each limit (units held, calls
waiting, blocks of start times) is ``limits.py``'s: a backend only keeps the shared state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

__all__ = ["Semaphore", "RemoteSemaphore", "RateStore", "SharedValue", "LimitsBackend"]


@runtime_checkable
class Semaphore(Protocol):
    """``n`` units shared by every process the backend serves."""

    def try_take(self) -> bool:
        """A unit if one is free now; never blocks."""
        ...

    def take(self) -> Any:
        """A unit, waiting for one (a ``RemoteSemaphore`` takes a timeout instead)."""
        ...

    def give(self) -> None:
        """Return a unit."""
        ...


class RemoteSemaphore(Protocol):
    """A semaphore each operation of which is a network round trip (``remote = True``): the
    core calls it only from a lease thread, and its ``take(timeout) -> bool`` gives up."""

    remote: bool

    def try_take(self) -> bool:
        """A unit if one is free now."""
        ...

    def take(self, timeout: float) -> bool:
        """A unit, waiting at most ``timeout`` seconds; ``False`` if none came."""
        ...

    def give(self) -> None:
        """Return a unit."""
        ...


class RateStore(Protocol):
    """Start times ``interval`` seconds apart, reserved in order by every process."""

    interval: float

    def reserve(self, k: float = 1) -> float:
        """The first of the next ``k`` start times (wall clock) and moves the next free one
        ``k * interval`` on; ``k`` may be fractional (amounts) or negative (given back)."""
        ...


class SharedValue(Protocol):
    """A small JSON value shared by every process the backend serves."""

    def get(self) -> Any:
        """The value (``None`` before the first update)."""
        ...

    def update(self, change: Callable[[Any], Any]) -> Any:
        """Replace the value by ``change(value)`` atomically; return the new value."""
        ...

    def remove(self) -> None:
        """Forget the value."""
        ...


class LimitsBackend(Protocol):
    """Where limits live. ``name`` and ``directory`` identify it (this process keeps one set
    of limiters per backend identity)."""

    name: str
    directory: str

    def semaphore(self, key: str, n: int) -> Semaphore | RemoteSemaphore: ...

    def rate(self, key: str, count: float, per: float) -> RateStore: ...

    def shared(self, key: str) -> SharedValue:
        """(A backend registered without it gets this machine's shared values.)"""
        ...
