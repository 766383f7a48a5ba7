"""``DiskCache``: the content-addressed node-result store shared by every engine and process.

Storage is one plain ``diskcache.Cache`` directory (SQLite index + files for large values):

* **Entry format.** Each value is stored as ``bytes``: a 22-byte header (magic ``b"HNDC"``,
  format version, codec byte, xxh3_128 digest of the payload) followed by the payload
  (``pickle`` protocol 5 for builtin scalars, ``cloudpickle`` protocol 5 otherwise, so classes
  and functions defined in ``__main__`` load in worker processes). diskcache keeps small blobs in
  the SQLite row and blobs of at least ``disk_min_file_size`` (32 KiB) in separate files. The
  digest is verified *before* unpickling; a short, garbage, unpicklable or missing-file entry is
  a miss, is evicted (only if it is still bad) and is logged at debug level.
* **Scope tag.** Every entry is stored with ``tag=<scope>`` (``"global" | "session" | "run"``):
  free on the hot path (one column of the same INSERT) and used by ``clear(scope)`` and the CLI.
  Keys themselves are the plain hex ids of :func:`hypernodes_dist.hashing.node_key`.
* **Concurrency.** Why not ``FanoutCache``: its ``set`` swallows ``diskcache.Timeout`` (default
  10 ms SQLite timeout) and returns ``False``, so writes are silently lost under contention.
  Measured with ``benchmarks/bench_cache_store.py`` (N spawned processes x 1,000 ``set`` calls
  each into one directory, 200-byte values, this container): ``FanoutCache()`` defaults lost
  10-20 of 8,000 writes with 8 processes and 195 of 16,000 with 16, with no exception raised;
  ``Cache(timeout=60)`` and ``DiskCache`` lost 0 of 8,000 and 0 of 16,000, never "database is
  locked". So: one plain ``diskcache.Cache`` with a 60 s busy timeout. The small values of one
  ``set_many`` go in one ``transact()`` (one SQLite write transaction, ~15k keys/s); values
  that become files are written before it, each in its own short transaction.
* **Reads.** ``get_many`` runs one ``SELECT ... WHERE key IN (...)`` per 500 keys on a
  per-thread, per-pid read connection to diskcache's ``Cache`` table (falling back to
  ``Cache.get`` per key if that layout ever changes). It takes no write lock (``transact()`` is
  ``BEGIN IMMEDIATE`` and would serialise readers with writers): 1,000 small hits ~105k keys/s
  including checksum and unpickling (``Cache.get`` per key: ~42k keys/s).
* **Defaults.** ``timeout=60`` (SQLite busy timeout) and ``eviction_policy="none"`` (never
  drops results silently; pass ``eviction_policy=..., size_limit=...`` to bound the size).
  Any other keyword is passed to ``diskcache.Cache``.
* **Degraded mode.** An unopenable or unreadable directory (read-only, under a regular file,
  not a database) turns caching off for this instance, and a failing write (disk full, read-only
  database) turns writing off, with ONE ``RuntimeWarning`` per instance in all; the caller never
  sees the error. A disabled cache's ``get_many`` returns ``{}``. Unpicklable results are
  skipped with a ``RuntimeWarning`` naming their type.
* **Processes.** Pickling ships only ``(path, scope, options)``; the connection is (re)opened
  lazily on first use, also in a forked child (the pid is tracked).
"""

from __future__ import annotations

import logging
import os
import pickle
import sqlite3
import struct
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import diskcache
from xxhash import xxh3_128_digest

__all__ = ["MISSING", "SCOPES", "DiskCache"]

log = logging.getLogger(__name__)

SCOPES = ("global", "session", "run")
Scope = Literal["global", "session", "run"]
MISSING: Any = type("_Missing", (), {"__repr__": lambda self: "MISSING"})()

_MAGIC = b"HNDC"
_FORMAT = 1
_HEADER = struct.Struct("<4sBB16s")
_PICKLE, _CLOUDPICKLE = 0, 1
_PLAIN = (str, bytes, int, float, bool, type(None), complex)
_BAD: Any = object()
_DEFAULTS: dict[str, Any] = {"timeout": 60, "eviction_policy": "none"}
_ABANDONED: list[Any] = []  # connections inherited through fork: never closed by the child
_DB_ERRORS = (OSError, sqlite3.Error, diskcache.Timeout)


class _CheckedDisk(diskcache.Disk):
    """Disk that turns an unreadable value file into empty bytes (then a checksum miss)."""

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        try:
            return super().fetch(mode, filename, value, read)
        except OSError:
            return b""


def encode(value: Any) -> bytes:
    """Serialize ``value`` into a checksummed entry (header + pickle payload)."""
    if type(value) in _PLAIN:
        codec, payload = _PICKLE, pickle.dumps(value, protocol=5)
    else:
        import cloudpickle

        codec, payload = _CLOUDPICKLE, cloudpickle.dumps(value, protocol=5)
    return _HEADER.pack(_MAGIC, _FORMAT, codec, xxh3_128_digest(payload)) + payload


def decode(blob: Any) -> Any:
    """Verify and unpickle an entry; return the private ``_BAD`` marker if anything is wrong."""
    if type(blob) is not bytes or len(blob) < _HEADER.size:
        return _BAD
    magic, fmt, _codec, digest = _HEADER.unpack_from(blob)
    if magic != _MAGIC or fmt != _FORMAT:
        return _BAD
    payload = memoryview(blob)[_HEADER.size :]
    if xxh3_128_digest(payload) != digest:
        return _BAD
    try:
        return pickle.loads(payload)
    except Exception:  # noqa: BLE001 - any unpickling failure is a miss
        log.debug("hypernodes cache: unpicklable entry", exc_info=True)
        return _BAD


class DiskCache:
    """Content-hashed on-disk store of node results (see module docstring for the format)."""

    def __init__(
        self, path: str | os.PathLike = ".cache", scope: Scope = "global", **options: Any
    ) -> None:
        if scope not in SCOPES:
            raise ValueError(f"invalid cache scope {scope!r}; allowed scopes: {', '.join(SCOPES)}")
        self.path: str = os.fspath(path)
        self.scope: str = scope
        self._options = options
        self._cache: diskcache.Cache | None = None
        self._pid = -1
        self._lock = threading.Lock()
        self._disabled = False
        self._read_only = False
        self._bulk_ok = True
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"DiskCache(path={self.path!r}, scope={self.scope!r})"

    # -- pickling: never ship a connection -------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "scope": self.scope, "options": self._options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["scope"], **state["options"])  # type: ignore[misc]

    # -- connection ------------------------------------------------------------------------

    def _open(self) -> diskcache.Cache | None:
        cache = self._cache
        if cache is not None and self._pid == os.getpid():
            return cache
        if self._disabled:
            return None
        with self._lock:
            if self._cache is not None and self._pid == os.getpid():
                return self._cache
            if self._cache is not None:  # forked child: drop, never close, the parent's handle
                _ABANDONED.append(self._cache)
                self._cache = None
            opts = {**_DEFAULTS, "disk": _CheckedDisk, **self._options}
            try:
                self._cache = diskcache.Cache(self.path, **opts)
            except _DB_ERRORS as exc:
                self._degrade("cannot open the cache directory", exc)
                return None
            self._pid = os.getpid()
            return self._cache

    def _degrade(self, what: str, exc: BaseException, writes_only: bool = False) -> None:
        first = not (self._disabled or self._read_only)
        if writes_only:
            self._read_only = True
        else:
            self._disabled = True
        if first:
            warnings.warn(
                f"hypernodes-dist: {what} {self.path!r} ({type(exc).__name__}: {exc}); "
                "caching is disabled for this cache instance",
                RuntimeWarning,
                stacklevel=4,
            )

    # -- batch API -------------------------------------------------------------------------

    def get_many(self, keys: Sequence[str]) -> dict[str, Any]:
        """Return ``{key: value}`` for the keys that hit (a cached ``None`` is a hit)."""
        cache = self._open()
        if cache is None:
            return {}
        try:
            raw = self._read_blobs(cache, keys)
        except _DB_ERRORS as exc:
            self._degrade("cannot read the cache", exc)
            return {}
        out: dict[str, Any] = {}
        bad: list[str] = []
        for key, blob in raw.items():
            value = decode(blob)
            if value is _BAD:
                bad.append(key)
            else:
                out[key] = value
        if bad:
            self._evict(cache, bad)
        return out

    def _read_blobs(self, cache: diskcache.Cache, keys: Sequence[str]) -> dict[str, Any]:
        """Fetch raw entries: bulk ``SELECT ... IN`` on a per-thread read connection.

        One statement per 500 keys is ~5x faster than one ``Cache.get`` per key and, unlike
        ``transact()`` (``BEGIN IMMEDIATE``), takes no write lock. Falls back to ``Cache.get``
        per key if diskcache's table layout is not the expected one.
        """
        if self._bulk_ok and all(type(k) is str for k in keys):
            try:
                return self._bulk_select(cache, keys)
            except sqlite3.OperationalError as exc:
                if "no such" not in str(exc):
                    raise
                self._bulk_ok = False
        raw = {}
        for key in keys:
            blob = cache.get(key, MISSING)
            if blob is not MISSING:
                raw[key] = blob
        return raw

    def _connection(self, cache: diskcache.Cache) -> sqlite3.Connection:
        """This thread's own autocommit connection to the cache database (reopened after fork)."""
        local = self._local
        con = getattr(local, "con", None)
        if con is None or local.pid != os.getpid():
            db = os.path.join(cache.directory, diskcache.core.DBNAME)
            timeout = float(self._options.get("timeout", _DEFAULTS["timeout"]))
            con = sqlite3.connect(db, timeout=timeout, isolation_level=None)
            # diskcache's own connection settings: WAL journal, no fsync per commit, a 32 MiB
            # page cache and 64 MiB of mmap (random-key index inserts stay in memory)
            for pragma in ("synchronous=NORMAL", "cache_size=8192", "mmap_size=67108864"):
                con.execute(f"PRAGMA {pragma}")
            local.con, local.pid = con, os.getpid()
        return con

    def _bulk_select(self, cache: diskcache.Cache, keys: Sequence[str]) -> dict[str, Any]:
        con = self._connection(cache)
        raw: dict[str, Any] = {}
        now = time.time()
        for start in range(0, len(keys), 500):
            chunk = list(keys[start : start + 500])
            rows = con.execute(
                "SELECT key, mode, filename, CAST(value AS BLOB) FROM Cache WHERE raw = 1 AND key IN "
                f"({','.join('?' * len(chunk))}) AND (expire_time IS NULL OR expire_time > ?)",
                (*chunk, now),
            ).fetchall()
            for key, mode, filename, value in rows:
                if mode == diskcache.core.MODE_RAW and type(value) is bytes:
                    raw[key] = value
                elif mode == diskcache.core.MODE_BINARY and filename:
                    raw[key] = _read_file(os.path.join(cache.directory, filename))
                else:
                    raw[key] = b""  # not one of our entries: a checksum miss, then evicted
        return raw

    def set_many(self, items: Mapping[str, Any]) -> None:
        """Store every item; small ones in one transaction. Never raises on storage errors."""
        if not items or self._read_only:
            return
        cache = self._open()
        if cache is None:
            return
        small: list[tuple[str, bytes]] = []
        large: list[tuple[str, bytes]] = []
        limit = cache.disk_min_file_size
        for key, value in items.items():
            try:
                blob = encode(value)
            except Exception as exc:  # noqa: BLE001 - an unpicklable result is just not cached
                warnings.warn(
                    f"hypernodes-dist: result of type {type(value).__qualname__} cannot be "
                    f"pickled and is not cached ({type(exc).__name__}: {exc})",
                    RuntimeWarning,
                    stacklevel=2,
                )
                continue
            (small if len(blob) < limit else large).append((key, blob))
        tag = self.scope
        try:
            for key, blob in large:
                cache.set(key, blob, tag=tag)
            if small:
                self._insert_small(cache, small, tag)
        except _DB_ERRORS as exc:
            self._degrade("cannot write to the cache", exc, writes_only=True)

    def _insert_small(self, cache: diskcache.Cache, rows: list[tuple[str, bytes]], tag: str) -> None:
        """One ``executemany`` in one write transaction (~10x diskcache's per-key ``set``).

        Keys are content addresses, so an existing row already holds this value: conflicts
        are skipped. diskcache's own triggers keep its count/size settings right."""
        if not self._bulk_ok:
            with cache.transact():
                for key, blob in rows:
                    cache.set(key, blob, tag=tag)
            return
        con = self._connection(cache)
        now = time.time()
        con.execute("BEGIN IMMEDIATE")
        try:
            con.executemany(
                "INSERT INTO Cache(key, raw, store_time, expire_time, access_time, access_count,"
                " tag, size, mode, filename, value) VALUES (?, 1, ?, NULL, ?, 0, ?, 0, ?, NULL, ?)"
                " ON CONFLICT(key, raw) DO NOTHING",
                [(key, now, now, tag, diskcache.core.MODE_RAW, blob) for key, blob in rows],
            )
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")

    def _evict(self, cache: diskcache.Cache, bad: Sequence[str]) -> None:
        log.debug("hypernodes cache: evicting %d corrupt entries from %s", len(bad), self.path)
        try:
            with cache.transact():
                for key in bad:
                    try:
                        current = cache.get(key, MISSING)  # a concurrent writer may have fixed it
                    except sqlite3.OperationalError:  # a TEXT value that is not UTF-8: garbage
                        current = b""
                    if current is not MISSING and decode(current) is _BAD:
                        cache.delete(key)
        except _DB_ERRORS:
            log.debug("hypernodes cache: eviction failed", exc_info=True)

    # -- single-key API --------------------------------------------------------------------

    def get(self, key: str, default: Any = MISSING) -> Any:
        """Value of ``key`` or ``default`` (``MISSING`` unless given) on a miss."""
        return self.get_many([key]).get(key, default)

    def set(self, key: str, value: Any) -> None:
        """Store one value."""
        self.set_many({key: value})

    def __contains__(self, key: object) -> bool:
        """Cheap row-existence test; ``get`` may still miss if the entry turns out corrupt."""
        cache = self._open()
        if cache is None:
            return False
        try:
            return key in cache
        except _DB_ERRORS:
            return False

    # -- maintenance -----------------------------------------------------------------------

    def clear(self, scope: str | None = None) -> int:
        """Delete every entry (``scope=None``) or the entries of one scope; return the count."""
        if scope is not None and scope not in SCOPES:
            raise ValueError(f"invalid cache scope {scope!r}; allowed scopes: {', '.join(SCOPES)}")
        cache = self._open()
        if cache is None:
            return 0
        return cache.clear(retry=True) if scope is None else cache.evict(scope, retry=True)

    def stats(self) -> dict[str, Any]:
        """Entries, bytes on disk, entries and file bytes per scope tag, and state flags."""
        cache = self._open()
        info: dict[str, Any] = {
            "path": self.path,
            "scope": self.scope,
            "enabled": cache is not None,
        }
        if cache is None:
            return info
        info["entries"] = len(cache)
        info["size_bytes"] = _dir_size(self.path)
        info["by_scope"] = _count_by_tag(cache)
        info["writable"] = not self._read_only
        return info

    def close(self) -> None:
        """Close this process's connection (reopened lazily on the next use)."""
        with self._lock:
            if self._cache is not None and self._pid == os.getpid():
                self._cache.close()
                con = getattr(self._local, "con", None)
                if con is not None and self._local.pid == os.getpid():
                    con.close()
            self._cache = None
            self._local = threading.local()

    def __enter__(self) -> DiskCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_file(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""  # file deleted by hand or by a concurrent eviction: a miss


def _dir_size(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def _count_by_tag(cache: diskcache.Cache) -> dict[str, dict[str, int]] | None:
    """Per-tag entry counts and file bytes, read straight from diskcache's ``Cache`` table."""
    db = os.path.join(cache.directory, diskcache.core.DBNAME)
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
        try:
            rows = con.execute(
                "SELECT tag, COUNT(*), COALESCE(SUM(size), 0) FROM Cache GROUP BY tag"
            ).fetchall()
        finally:
            con.close()
    except sqlite3.Error:
        return None
    return {str(tag): {"entries": n, "file_bytes": size} for tag, n, size in rows}
