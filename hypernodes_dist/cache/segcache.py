"""``SegmentCache``: the ``Cache`` protocol over any store of immutable segments.

A backend supplies a *store* (where segment bytes live: SQLite rows, files, objects), written
down as the ``store.SegmentStore`` protocol; this class does everything else the protocol
promises: packing a batch (``segments.pack``), the per-process index, checksums before
unpickling, evicting bad segments, the degraded modes, pickling the handle and the visibility
marker. Recency (what ``size_limit`` eviction and ``prune(older_than=...)`` go by): this class
tells the store which segments were read (``touch``), batched: at most once per
``touch_seconds`` per process, before its own writes under a size limit, and on ``close``.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
import warnings
from collections.abc import Mapping, Sequence
from itertools import compress, repeat
from operator import and_, getitem, rshift
from typing import Any

from hypernodes_dist.cache.base import CacheNotVisibleError, check_scope
from hypernodes_dist.cache.segments import (
    ENTRY_BITS,
    ENTRY_MASK,
    SEGMENT_BYTES,
    WHOLE,
    BlockAt,
    Refreshed,
    SegmentIndex,
    Written,
    decode_block,
    decode_index,
    log,
    pack,
)
from hypernodes_dist.cache.store import Pruned, SegmentStore
from hypernodes_dist.cache.units import parse_age, parse_size
from hypernodes_dist.missing import MISSING

__all__ = ["SegmentCache", "NO_NODE", "worker_name"]

NO_NODE = "_"  # the group of entries written without a node name
_FEW = 64  # lookups of at most this many hits read single blocks, not whole segments
_ABANDONED: list[Any] = []  # stores inherited through fork: never closed by the child
_SLICE = 8  # with a size limit, one segment takes at most this fraction of it


def worker_name() -> str:
    return f"{socket.gethostname()} (pid {os.getpid()})"


class SegmentCache:
    """Base class of ``DiskCache`` and ``ObjectStoreCache`` (see the module docstring).

    Subclasses set ``_errors`` (the storage exceptions to absorb), ``refresh_seconds`` and
    implement ``_new_store()``, ``_where()`` and ``_not_visible_hint()``. ``size_limit``
    (bytes, or a string such as ``"10GB"``; ``None``: unbounded) is handed to the store."""

    refresh_seconds: float = 0.0
    touch_seconds: float = 1.0  # a reading process records what it used at most this often
    _errors: tuple[type[BaseException], ...] = (OSError,)

    def __init__(self, scope: str = "global", size_limit: int | str | None = None) -> None:
        check_scope(scope)
        self.scope: str = scope
        self.size_limit: int | None = parse_size(size_limit)
        self._token: str | None = None
        self._prepared_by = -1
        self._reset()

    def _reset(self) -> None:
        self._store: SegmentStore[Any] | None = None
        self._touched: set[Any] = set()
        self._touched_at = time.monotonic()
        self._pid = -1
        self._lock = threading.RLock()
        self._known = SegmentIndex()
        self._disabled = False
        self._read_only = False
        self._warned = False
        self._checked = False

    # -- to implement ----------------------------------------------------------------------
    def _new_store(self, create: bool = True) -> SegmentStore[Any]:
        raise NotImplementedError

    def _where(self) -> str:
        raise NotImplementedError

    def _not_visible_hint(self) -> str:
        raise NotImplementedError

    def _config(self) -> dict[str, Any]:
        raise NotImplementedError

    # -- pickling: ship the configuration, never a connection ------------------------------
    def __getstate__(self) -> dict[str, Any]:
        return {**self._config(), "_token": self._token, "_prepared_by": self._prepared_by}

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        token, prepared_by = state.pop("_token"), state.pop("_prepared_by")
        self.__init__(**state)  # type: ignore[misc]  # unpickling rebuilds the handle from its config
        self._token, self._prepared_by = token, prepared_by

    # -- the store, per process -------------------------------------------------------------
    def _open(self) -> SegmentStore[Any] | None:
        if self._pid == os.getpid():
            return self._store
        with self._lock:
            if self._pid == os.getpid():
                return self._store
            if self._pid != -1:  # forked child: drop (never close) the parent's handles
                _ABANDONED.append(self._store)
                self._reset()
            if self._token is not None and os.getpid() != self._prepared_by and not self._checked:
                self.check_visible()
            try:
                self._store = None if self._disabled else self._new_store()
            except self._errors as exc:
                self._degrade("cannot open", exc)
            self._pid = os.getpid()
            return self._store

    def _degrade(self, what: str, exc: BaseException, writes_only: bool = False) -> None:
        if writes_only:
            self._read_only = True
        else:
            self._disabled = True
            self._store = None
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"hypernodes-dist: {what} the cache {self._where()} ({type(exc).__name__}: "
                f"{exc}); {'writing' if writes_only else 'caching'} is disabled for this cache "
                "instance", RuntimeWarning, stacklevel=4)

    # -- visibility --------------------------------------------------------------------------
    def prepare(self) -> None:
        """Driver side: leave a marker in the store that every worker must be able to see."""
        store = self._open()
        if store is None or self._token is not None:
            return
        token = uuid.uuid4().hex
        try:
            self._token = store.put_marker(token)
        except self._errors as exc:
            log.debug("hypernodes cache: cannot write the marker", exc_info=True)
            self._degrade("cannot write to", exc, writes_only=True)
            return
        self._prepared_by = os.getpid()

    def check_visible(self, worker: str | None = None) -> None:
        """Raise :class:`CacheNotVisibleError` if this process cannot see the prepared store."""
        if self._token is None or os.getpid() == self._prepared_by:
            return
        store_cls = self._marker_reader()
        try:
            seen = store_cls(self._token)
        except self._errors:
            seen = False
        if not seen:
            name = worker or worker_name()
            raise CacheNotVisibleError(
                f"worker {name} cannot see the cache {self._where()} that the driver uses: "
                f"{self._not_visible_hint()}")
        self._checked = True

    def _marker_reader(self) -> Any:
        """``has_marker`` of a store that is not opened (opening may create the directory)."""
        return self._new_store(create=False).has_marker

    # -- batch API -----------------------------------------------------------------------------
    def get_many(self, keys: Sequence[str], node: str | None = None) -> dict[str, Any]:
        """``{key: value}`` for the keys that hit (a cached ``None`` is a hit)."""
        store = self._open()
        if store is None or not keys:
            return {}
        known = self._known
        locs = list(map(known.index.get, keys))
        found = list(filter(None, locs))
        if len(found) < len(keys) and (known.pending or self._due(store, node)):
            self._refresh(store, node)
            locs = list(map(known.index.get, keys))
            found = list(filter(None, locs))
        if not found:
            return {}
        hit_keys = list(compress(keys, locs))
        if len(found) <= _FEW:  # a few keys (one run's node): read only their blocks
            out = self._get_blocks(store, hit_keys)
            self._touch_if_due(store)
            return out
        numbers = list(map(rshift, found, repeat(ENTRY_BITS)))
        values_of: dict[int, list[Any]] = {}
        for number in set(numbers):
            values = self._segment_values(store, number)
            if values is not None:
                values_of[number] = values
        if len(values_of) < len(set(numbers)):  # a bad segment was evicted: drop its keys
            keep = [n in values_of for n in numbers]
            hit_keys, found, numbers = (list(compress(x, keep)) for x in (hit_keys, found, numbers))
        entries = map(and_, found, repeat(ENTRY_MASK))
        out = dict(zip(hit_keys, map(getitem, map(values_of.__getitem__, numbers), entries)))
        self._touch_if_due(store)
        return out

    def _get_blocks(self, store: SegmentStore[Any], keys: list[str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for where, pairs in self._known.locate(keys).items():
            values = self._block(store, where)
            if values is not None:
                out.update([(key, values[pos]) for key, pos in pairs])
        return out

    # -- recency: which segments this process used ---------------------------------------------
    def _used(self, number: int) -> None:
        seg = self._known.segments[number]
        if seg is not None:
            self._touched.add(seg.ref)

    def _touch_if_due(self, store: SegmentStore[Any] | None, now: bool = False) -> None:
        """Tell the store which segments were read (batched: see ``touch_seconds``)."""
        if not self._touched or store is None or self._read_only:
            return
        if not now and time.monotonic() - self._touched_at < self.touch_seconds:
            return
        with self._lock:
            refs, self._touched = self._touched, set()
            self._touched_at = time.monotonic()
        try:
            store.touch(refs)
        except self._errors:
            log.debug("hypernodes cache: recording use failed", exc_info=True)

    def _segment_values(self, store: SegmentStore[Any], number: int) -> list[Any] | None:
        """Every value of one segment, decoded once (one read) and kept in the LRU."""
        known = self._known
        where = BlockAt(number, WHOLE)
        self._used(number)
        values = known.cached_block(where)
        if values is not None:
            return values
        seg = known.segments[number]
        if seg is None:
            return None
        try:
            data = store.read(seg.ref, 0, seg.size)
        except self._errors:
            log.debug("hypernodes cache: read failed", exc_info=True)
            data = None
        out: list[Any] = []
        for b, (off, length) in enumerate(zip(seg.offsets, seg.lengths)):
            blob = data[off:off + length] if data is not None else None
            values = self._decoded(BlockAt(number, b), blob, keep=False)
            if values is None:
                return None
            out += values
        with self._lock:
            known.keep_block(where, out, seg.size)
        return out

    def _due(self, store: SegmentStore[Any], node: str | None) -> bool:
        """Whether a miss should reload indexes: the store changed since the last load (when
        it can tell cheaply: SQLite's data version, a directory's mtime), or, when it cannot
        (object stores), ``refresh_seconds`` passed."""
        last = self._known.refreshed.get(node)
        if last is None:
            return True
        try:
            version = store.version(self.scope, node)
        except self._errors:  # cannot tell: the refresh reports what is wrong
            return True
        if version is not None:
            return version != last.version
        return time.monotonic() - last.at >= self.refresh_seconds

    def _refresh(self, store: SegmentStore[Any], node: str | None) -> None:
        """Load the indexes written since the last refresh (of ``node``, or of every node)."""
        with self._lock:
            known = self._known
            for written in known.pending:  # this process's own writes
                known.add(*written)
            known.pending.clear()
            if not self._due(store, node):
                return
            try:
                version = store.version(self.scope, node)
                found = store.scan(self.scope, node, known)
            except self._errors as exc:
                log.debug("hypernodes cache: listing failed", exc_info=True)
                self._warn_once("cannot list", exc)
                return
            known.refreshed[node] = Refreshed(time.monotonic(), version)
            for seg in found:
                decoded = decode_index(seg.index)
                if decoded is None:
                    log.debug("hypernodes cache: bad index %r, evicting", seg.ref)
                    known.known.add(seg.ref)
                    self._delete(store, seg.ref)
                    continue
                known.add(seg.ref, seg.size, *decoded)

    def _block(self, store: SegmentStore[Any], where: BlockAt) -> list[Any] | None:
        number, b = where
        self._used(number)
        values = self._known.cached_block(where)
        if values is not None:
            return values
        seg = self._known.segments[number]
        if seg is None:
            return None
        try:
            blob = store.read(seg.ref, seg.offsets[b], seg.lengths[b])
        except self._errors:
            log.debug("hypernodes cache: read failed", exc_info=True)
            blob = None
        return self._decoded(where, blob)

    def _decoded(self, where: BlockAt, blob: bytes | None,
                 keep: bool = True) -> list[Any] | None:
        """Verify and unpickle one block; a bad one evicts its segment."""
        known = self._known
        number, b = where
        seg = known.segments[number]
        if seg is None:
            return None
        values = decode_block(blob, seg.counts[b])
        if values is None:
            log.debug("hypernodes cache: bad block %d of %r, evicting the segment", b, seg.ref)
            with self._lock:
                ref = known.drop(number)
            if ref is not None and blob is not None and self._store is not None:
                self._delete(self._store, ref)  # a vanished segment needs no delete
            return None
        if keep:
            with self._lock:
                known.keep_block(where, values, seg.lengths[b])
        return values

    def _delete(self, store: SegmentStore[Any], ref: Any) -> None:
        try:
            store.delete(ref)
        except self._errors:
            log.debug("hypernodes cache: eviction failed", exc_info=True)

    def _warn_once(self, what: str, exc: BaseException) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(f"hypernodes-dist: {what} the cache {self._where()} "
                          f"({type(exc).__name__}: {exc}); treated as misses",
                          RuntimeWarning, stacklevel=4)

    def set_many(self, items: Mapping[str, Any], node: str | None = None) -> None:
        """Store every item as one segment of ``node``; never raises on storage errors."""
        if not items or self._read_only:
            return
        store = self._open()
        if store is None:
            return
        group = node or NO_NODE
        limit, what = store.max_segment_bytes, "stores in one piece"
        if self.size_limit is not None:
            self._touch_if_due(store, now=True)  # this process's reads count before evicting
            if limit is None or self.size_limit < limit:
                limit, what = self.size_limit, "may hold (size_limit)"
        for packed in pack(items, self._segment_bytes()):
            if limit is not None and packed.nbytes > limit:  # one huge value: skip it only
                warnings.warn(
                    f"hypernodes-dist: {len(packed.keys)} result(s) of node {group!r} take "
                    f"{packed.nbytes} bytes, more than {self._where()} {what} ({limit}); not "
                    "cached", RuntimeWarning, stacklevel=2)
                continue
            try:
                stored = store.put(self.scope, group, packed)
            except self._errors as exc:
                self._degrade("cannot write to", exc, writes_only=True)
                return
            with self._lock:  # indexed lazily: a cold map never reads back what it wrote
                self._known.pending.append(Written(stored.ref, stored.size, packed.keys,
                                                   packed.rows))
                self._known.known.add(stored.ref)

    def _segment_bytes(self) -> int:
        """Segments stay a small slice of ``size_limit``: one batch never evicts everything."""
        if self.size_limit is None:
            return SEGMENT_BYTES
        return max(1, min(SEGMENT_BYTES, self.size_limit // _SLICE))

    # -- single-key API ------------------------------------------------------------------------
    def get(self, key: str, default: Any = MISSING) -> Any:
        """Value of ``key`` or ``default`` (``MISSING`` unless given) on a miss."""
        return self.get_many([key]).get(key, default)

    def set(self, key: str, value: Any, node: str | None = None) -> None:
        """Store one value."""
        self.set_many({key: value}, node)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is indexed; ``get`` may still miss if its data turns out corrupt."""
        if not isinstance(key, str) or self._open() is None:
            return False
        if key not in self._known.index and self._store is not None:
            self._refresh(self._store, None)
        return key in self._known.index

    # -- maintenance ---------------------------------------------------------------------------
    def clear(self, scope: str | None = None, node: str | None = None) -> int:
        """Delete every entry, or those of one scope and/or one node; return the count."""
        check_scope(scope, allow_none=True)
        store = self._open()
        if store is None:
            return 0
        removed = store.drop(scope, node)
        with self._lock:
            self._known = SegmentIndex()
        return int(removed)

    def prune(self, older_than: float | str | None = None,
              max_size: int | str | None = None) -> Pruned:
        """Delete the segments not used for ``older_than`` (seconds, or ``"7d"``, ``"12h"``),
        then the least recently used ones until at most ``max_size`` (bytes, or ``"10GB"``)
        remain; return what was removed. Removed entries are misses (recomputed)."""
        age = None if older_than is None else parse_age(older_than)
        size = parse_size(max_size, "max_size")
        store = self._open()
        if store is None:
            return Pruned()
        self._touch_if_due(store, now=True)
        removed = store.prune(age, size)
        with self._lock:
            self._known = SegmentIndex()
        return removed

    def stats(self) -> dict[str, Any]:
        """Entries and bytes in all, per scope and per node; state flags."""
        store = self._open()
        info: dict[str, Any] = {"path": self._where(), "scope": self.scope,
                                "enabled": store is not None, "size_limit": self.size_limit}
        if store is None:
            return info
        by_scope: dict[str, dict[str, int]] = {}
        by_node: dict[str, dict[str, int]] = {}
        for (scope, node), (entries, nbytes) in store.usage().items():
            for table, name in ((by_scope, scope), (by_node, node)):
                row = table.setdefault(name, {"entries": 0, "bytes": 0})
                row["entries"] += entries
                row["bytes"] += nbytes
        info["entries"] = sum(r["entries"] for r in by_scope.values())
        info["size_bytes"] = store.size_bytes()
        info["by_scope"] = by_scope
        info["by_node"] = by_node
        info["writable"] = not self._read_only
        return info

    def close(self) -> None:
        """Close this process's connections (reopened lazily on the next use)."""
        with self._lock:
            if self._store is not None and self._pid == os.getpid():
                self._touch_if_due(self._store, now=True)
                self._store.close()
            token, prepared_by = self._token, self._prepared_by
            self._reset()
            self._token, self._prepared_by = token, prepared_by

    def __enter__(self) -> SegmentCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
