"""``DiskCache``: the embedded cache of one machine (every process of it), in one SQLite file.

Layout: ``<path>/hn-cache.db`` holds one row per *segment* (see ``segments.py``: one node's
results of one batch, pickled a block at a time): ``(id, scope, node, entries, nbytes, idx,
data)``. Why not one row per entry (diskcache's layout, used before): each of its rows cost
~16 us to insert (four indexes, triggers) and the cold map paid ~25x the uncached map; one row
per batch costs one insert per node and batch, whatever the batch size.

* **Concurrency.** SQLite in WAL mode with a 60 s busy timeout: each ``set_many`` is one short
  ``INSERT`` transaction, readers never block writers. Segment ids grow in commit order, so a
  process loads only the indexes with ``id`` above the last one it saw (one indexed query per
  lookup that misses).
* **Reads.** Blocks are read with SQLite's incremental blob I/O (only the block's bytes).
  Pages are 64 KiB: a segment is a large blob, written ~8x faster than through 4 KiB pages.
* **Visibility.** ``prepare()`` writes ``<path>/hn-marker`` once (atomically: a temporary file
  hard-linked into place); a worker whose ``<path>`` holds no such marker -- another machine,
  or a relative path under another working directory -- raises ``CacheNotVisibleError``.
* **Limits.** One segment is at most ~64 MiB; a single value must stay under SQLite's 1 GB
  blob limit (larger ones are not cached, with a warning).
"""

from __future__ import annotations

import os
import random
import sqlite3
import threading
import time
import uuid
from typing import Any

from hypernodes_dist.cache.segcache import SegmentCache
from hypernodes_dist.cache.segments import Packed

__all__ = ["DiskCache"]

DB_NAME = "hn-cache.db"
MARKER = "hn-marker"
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS hn_segments(id INTEGER PRIMARY KEY AUTOINCREMENT, "
    "scope TEXT NOT NULL, node TEXT NOT NULL, entries INTEGER NOT NULL, nbytes INTEGER NOT NULL, "
    "idx BLOB NOT NULL, data BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS hn_segments_node ON hn_segments(scope, node, id)",
)


class DiskCache(SegmentCache):
    """Content-hashed store of node results in one directory of this machine.

    ``timeout`` is SQLite's busy timeout in seconds. See the module docstring for the layout
    and ``hypernodes_dist.cache.base`` for the guarantees every cache gives.
    """

    _errors = (OSError, sqlite3.Error)

    def __init__(self, path: str | os.PathLike = ".cache", scope: str = "global",
                 timeout: float = 60.0) -> None:
        self.path: str = os.fspath(path)
        self.timeout = float(timeout)
        super().__init__(scope)

    def __repr__(self) -> str:
        return f"DiskCache(path={self.path!r}, scope={self.scope!r})"

    def _config(self) -> dict[str, Any]:
        return {"path": self.path, "scope": self.scope, "timeout": self.timeout}

    def _where(self) -> str:
        return f"DiskCache({self.path!r})"

    def _not_visible_hint(self) -> str:
        return (f"{os.path.abspath(self.path)!r} there is not the driver's directory (another "
                "machine, or another working directory for a relative path). A DiskCache "
                "serves one machine; use ObjectStoreCache('s3://bucket/prefix') or a "
                "directory every machine mounts, ObjectStoreCache('/shared/dir'), for a cluster")

    def _new_store(self, create: bool = True) -> _SQLiteStore:
        return _SQLiteStore(self.path, self.timeout, create)


class _SQLiteStore:
    """Segments as rows of one SQLite table (see the module docstring)."""

    max_segment_bytes = 900_000_000  # SQLite's default blob limit is 1e9 bytes

    def __init__(self, path: str, timeout: float, create: bool) -> None:
        self.path = path
        self.timeout = timeout
        self._con: sqlite3.Connection | None = None
        self._lock = threading.RLock()
        if create:
            os.makedirs(path, exist_ok=True)
            self._connect()

    def _connect(self) -> sqlite3.Connection:
        """The connection, set up on first use. Many processes opening a new database at once
        can see ``database is locked`` from the WAL switch or the schema, which SQLite's
        busy timeout does not always cover: set-up is retried until ``timeout``."""
        if self._con is None:
            deadline = time.monotonic() + self.timeout
            while True:
                con = sqlite3.connect(os.path.join(self.path, DB_NAME), timeout=self.timeout,
                                      isolation_level=None, check_same_thread=False)
                try:
                    _set_up(con)
                    break
                except sqlite3.OperationalError as exc:
                    con.close()
                    if "locked" not in str(exc) or time.monotonic() > deadline:
                        raise
                    time.sleep(random.uniform(0.005, 0.05))
            self._con = con
        return self._con

    # -- segments --------------------------------------------------------------------------
    def put(self, scope: str, node: str, packed: Packed) -> tuple[int, int]:
        with self._lock:
            cur = self._connect().execute(
                "INSERT INTO hn_segments(scope, node, entries, nbytes, idx, data) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (scope, node, len(packed.keys), len(packed.index) + len(packed.data),
                 packed.index, packed.data))
            return int(cur.lastrowid), len(packed.data)  # type: ignore[arg-type]

    def version(self, scope: str, node: str | None) -> int:
        """Changes whenever another connection commits (``PRAGMA data_version``)."""
        with self._lock:
            return int(self._connect().execute("PRAGMA data_version").fetchone()[0])

    def scan(self, scope: str, node: str | None, known: Any) -> list[tuple[int, int, bytes]]:
        """Indexes of the segments newer than the last scan (of this node, or of all)."""
        where, args = ("scope = ? AND id > ?", [scope]) if node is None else (
            "scope = ? AND node = ? AND id > ?", [scope, node])
        cursor = known.cursor.get(node, 0)
        with self._lock:
            con = self._connect()
            ids = [i for (i,) in con.execute(
                f"SELECT id FROM hn_segments WHERE {where} ORDER BY id", (*args, cursor))]
            if not ids:
                return []
            known.cursor[node] = ids[-1]
            new = [i for i in ids if i not in known.known]
            out = []
            for start in range(0, len(new), 500):
                chunk = new[start:start + 500]
                out += con.execute(
                    "SELECT id, length(data), idx FROM hn_segments WHERE id IN "
                    f"({','.join('?' * len(chunk))})", chunk).fetchall()
            return out

    def read(self, ref: int, offset: int, length: int) -> bytes | None:
        with self._lock:
            try:
                with self._connect().blobopen("hn_segments", "data", ref, readonly=True) as blob:
                    blob.seek(offset)
                    return blob.read(length)
            except sqlite3.OperationalError:  # the row is gone (cleared by another process)
                return None
            except ValueError:  # the blob is shorter than its index says: corrupt
                return b""

    def delete(self, ref: int) -> None:
        with self._lock:
            self._connect().execute("DELETE FROM hn_segments WHERE id = ?", (ref,))

    def drop(self, scope: str | None, node: str | None) -> int:
        where, args = _filter(scope, node)
        with self._lock:
            con = self._connect()
            con.execute("BEGIN IMMEDIATE")
            try:
                (count,) = con.execute(
                    f"SELECT COALESCE(SUM(entries), 0) FROM hn_segments {where}", args).fetchone()
                con.execute(f"DELETE FROM hn_segments {where}", args)
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")
        return int(count)

    def usage(self) -> dict[tuple[str, str], list[int]]:
        with self._lock:
            rows = self._connect().execute(
                "SELECT scope, node, SUM(entries), SUM(nbytes) FROM hn_segments GROUP BY scope, node"
            ).fetchall()
        return {(scope, node): [int(n), int(b)] for scope, node, n, b in rows}

    def size_bytes(self) -> int:
        total = 0
        for name in os.listdir(self.path):
            try:
                total += os.path.getsize(os.path.join(self.path, name))
            except OSError:
                pass
        return total

    # -- visibility marker ----------------------------------------------------------------
    def put_marker(self, token: str) -> str:
        """Write the directory's marker if it has none; return the marker's token."""
        marker = os.path.join(self.path, MARKER)
        tmp = f"{marker}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "w") as f:
            f.write(token)
        try:
            os.link(tmp, marker)  # atomic, never replaces an existing marker
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
        with open(marker) as f:
            return f.read().strip()

    def has_marker(self, token: str) -> bool:
        try:
            with open(os.path.join(self.path, MARKER)) as f:
                return f.read().strip() == token
        except OSError:
            return False

    def close(self) -> None:
        with self._lock:
            if self._con is not None:
                self._con.close()
                self._con = None


def _filter(scope: str | None, node: str | None) -> tuple[str, tuple[str, ...]]:
    parts, args = [], []
    if scope is not None:
        parts.append("scope = ?")
        args.append(scope)
    if node is not None:
        parts.append("node = ?")
        args.append(node)
    return ("WHERE " + " AND ".join(parts) if parts else ""), tuple(args)


def _set_up(con: sqlite3.Connection) -> None:
    # 64 KiB pages (for a new database): segments are large blobs, and large pages write
    # them ~8x faster than the default 4 KiB pages' overflow chains
    con.execute("PRAGMA page_size=65536")
    if con.execute("PRAGMA journal_mode").fetchone()[0] != "wal":  # WAL persists in the file
        con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    for statement in _SCHEMA:
        con.execute(statement)

