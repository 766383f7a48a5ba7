"""The ``Cache`` protocol: the one place a cache backend plugs into hypernodes-dist.

Engines and the executor talk to a cache only through these methods; ``DiskCache`` (one
machine) and ``ObjectStoreCache`` (storage many machines share) implement them. A backend is
any object with these attributes, no base class needed.

Keys are the hex strings of :mod:`hypernodes_dist.cache.keys` (content addresses: a key's value
never changes, so a backend may keep any copy of it). Values are any picklable object, ``None``
included (a cached ``None`` is a hit). A backend promises:

* **Batched.** ``get_many`` / ``set_many`` take a whole batch; the executor calls them once
  per node and batch (``set_many`` through ``keys.WriteBuffer``, at least every 0.5 s of
  finished work). ``node`` names the graph node whose results a call holds: writes are
  grouped by it (``clear(node=...)``, ``stats()["by_node"]``); on reads it is only a hint.
* **Scope.** ``scope`` is ``"global"``, ``"session"`` or ``"run"``; the executor mixes the
  session or run id into keys of the last two (``keys.scope_token``); the backend stores it
  with each entry so ``clear(scope=...)`` can drop one scope.
* **Picklable handle.** Pickling ships the configuration (path/URL, scope, options), never a
  connection; the store is (re)opened lazily in each process, also after ``fork``.
* **Corrupt entry = miss.** A checksum is verified before anything is unpickled; a corrupt,
  truncated, garbage or vanished entry is a miss (the node runs again and its result is
  written anew), the bad data is evicted, nothing is raised.
* **Read-only or full store.** Storage errors never reach the caller: a store that cannot be
  opened turns the cache off, a failing write turns writing off, with one ``RuntimeWarning``
  per cache instance. Unpicklable results are skipped with a ``RuntimeWarning`` naming the type.
* **Bounded.** A backend may take ``size_limit`` (bytes or ``"10GB"``): it then evicts the
  least recently used entries (recency: last read or write) to stay under it while maps
  write from any number of processes. An evicted entry is a miss (recomputed), never wrong.
  ``prune`` does the same on demand, by age and/or size (``hypernodes-dist cache prune``).
* **Reachable from every worker.** ``prepare()`` runs in the driver before a map (it leaves a
  marker in the store); ``check_visible(worker)`` runs on a worker and raises
  :class:`CacheNotVisibleError` when this process cannot see the store the driver prepared
  (another machine's local directory). Engines call it on every worker before the map where
  they can; a backend also checks lazily on first use in a process other than the driver.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from hypernodes_dist.cache.store import Pruned

__all__ = ["Cache", "CacheChecker", "CacheNotVisibleError", "SCOPES", "Scope",
           "check_scope", "prepare_cache"]

SCOPES = ("global", "session", "run")
Scope = Literal["global", "session", "run"]


class CacheNotVisibleError(RuntimeError):
    """A worker cannot see the cache store the driver prepared (e.g. another machine)."""


def check_scope(scope: str | None, allow_none: bool = False) -> None:
    """Raise ``ValueError`` naming the allowed scopes for anything else."""
    if scope is None and allow_none:
        return
    if scope not in SCOPES:
        raise ValueError(f"invalid cache scope {scope!r}; allowed scopes: {', '.join(SCOPES)}")


class CacheChecker(Protocol):
    """What ``prepare_cache`` needs of an engine (``engines.base.Engine`` implements it)."""

    def check_cache(self, cache: Cache) -> None:
        """Raise ``CacheNotVisibleError`` if a worker cannot see ``cache``."""
        ...


def prepare_cache(cache: Cache, engine: CacheChecker) -> None:
    """Driver side, before a map: the cache's marker, then the engine's check on its workers."""
    cache.prepare()
    engine.check_cache(cache)


@runtime_checkable
class Cache(Protocol):
    """What every cache backend implements (see the module docstring for the guarantees)."""

    scope: str

    def get_many(self, keys: Sequence[str], node: str | None = None) -> dict[str, Any]:
        """``{key: value}`` of the keys that hit; never raises on storage errors."""
        ...

    def set_many(self, items: Mapping[str, Any], node: str | None = None) -> None:
        """Store every item (results of ``node``); never raises on storage errors."""
        ...

    def clear(self, scope: str | None = None, node: str | None = None) -> int:
        """Delete the entries of one scope and/or one node (all by default); return the count."""
        ...

    def stats(self) -> dict[str, Any]:
        """At least ``entries``, ``size_bytes`` and ``by_node`` (node -> entries, bytes)."""
        ...

    def prune(self, older_than: float | str | None = None,
              max_size: int | str | None = None) -> Pruned:
        """Delete entries unused for ``older_than`` (seconds or ``"7d"``), then the least
        recently used beyond ``max_size`` (bytes or ``"10GB"``); return what was removed."""
        ...

    def prepare(self) -> None:
        """Driver side, before a map: make the store checkable from workers."""
        ...

    def check_visible(self, worker: str | None = None) -> None:
        """Worker side: raise :class:`CacheNotVisibleError` if the prepared store is not here."""
        ...

    def close(self) -> None:
        """Release this process's connections (reopened lazily on the next use)."""
        ...
