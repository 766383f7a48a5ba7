"""``CacheView``: what an executor knows of the cache, one place for every executor.

A cached value can be in three places: the store (``Cache.get_many``), the caller's
unflushed writes (``keys.WriteBuffer``: finished by an earlier item or batch of the same
caller) or still being computed by an identical item of the same batch (a call in flight,
awaited instead of repeated). The columnar strategy asks for a column of keys at once; the
item flow and the reactive scheduler ask one key at a time; all ask here, so a capability
of calls (resources, batch calls, usage) meets one cache path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from hypernodes_dist.cache.base import Cache
from hypernodes_dist.cache.keys import WriteBuffer
from hypernodes_dist.missing import MISSING

__all__ = ["CacheView"]


class CacheView:
    """The store, the caller's pending writes and the calls in flight, for one batch."""

    __slots__ = ("cache", "writes", "running")

    def __init__(self, cache: Cache | None, writes: WriteBuffer | None,
                 running: dict[str, asyncio.Future[Any] | None] | None = None) -> None:
        self.cache = cache
        self.writes = writes
        # key -> the call computing it (its future once an item waits; None: nothing shared)
        self.running = running

    def fetch(self, node: str, keys: Sequence[str]) -> dict[str, Any]:
        """The values of ``keys`` found pending or in the store (a cold column: no Python
        work per key)."""
        store = self._store()
        pending = self.writes.pending(node) if self.writes is not None else None
        if pending and not pending.keys().isdisjoint(keys):
            found = {k: pending[k] for k in keys if k in pending}
            found.update(store.get_many([k for k in keys if k not in found], node))
            return found
        return store.get_many(keys, node)

    def _store(self) -> Cache:
        assert self.cache is not None, "a CacheView is read only where there is a cache"
        return self.cache

    def pending(self, node: str, key: str) -> Any:
        """``key``'s value among the caller's unflushed writes (``MISSING``: not there)."""
        pending = self.writes.pending(node) if self.writes is not None else None
        if pending and key in pending:
            return pending[key]
        return MISSING

    def get(self, node: str, key: str) -> Any:
        """``key``'s value, pending or stored (``MISSING``: not cached)."""
        value = self.pending(node, key)
        if value is not MISSING:
            return value
        return self._store().get_many([key], node).get(key, MISSING)

    def computing(self, key: str) -> bool:
        """Whether an identical call of this batch is computing ``key`` (``in_flight``)."""
        running = self.running
        return running is not None and key in running

    async def in_flight(self, key: str) -> Any:
        """What the identical call in flight produces (``MISSING``: none, or it failed)."""
        running = self.running
        if running is not None and key in running:
            done = running[key]
            if done is None:  # the first to wait makes the future
                done = running[key] = asyncio.get_running_loop().create_future()
            return await done
        return MISSING

    def begin(self, key: str) -> bool:
        """Mark ``key`` as computed by the caller (identical items then wait for it; their
        future is made when one waits: most keys are computed by one item only)."""
        if self.running is None:
            return False
        self.running[key] = None
        return True

    def end(self, key: str, value: Any) -> None:
        """The call computing ``key`` is over (``MISSING``: it failed; waiters compute)."""
        done = self.running.pop(key, None) if self.running is not None else None
        if done is not None and not done.done():
            done.set_result(value)

    def write(self, node: str, key: str, value: Any) -> None:
        """Store a computed value: through the write buffer, or at once without one."""
        if self.writes is not None:
            self.writes.add(key, value, node)
        else:
            self._store().set_many({key: value}, node)
