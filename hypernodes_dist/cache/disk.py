"""``DiskCache``: the embedded cache of one machine (every process of it), in one SQLite file.

Layout: ``<path>/hn-cache.db`` holds one row per *segment* (see ``segments.py``: one node's
results of one batch, pickled a block at a time): ``(id, scope, node, entries, nbytes, idx,
data, used, file)``. Why not one row per entry (diskcache's layout, used before): each of its
rows cost ~16 us to insert (four indexes, triggers) and the cold map paid ~25x the uncached
map; one row per batch costs one insert per node and batch, whatever the batch size.

* **Large segments in files.** The data of a segment of ``FILE_BYTES`` (64 KiB) or more goes
  to ``<path>/segments/<random>.seg`` (written under a temporary name, then renamed) and its
  row names the file (``data`` empty), as diskcache does for large values: SQLite then writes
  only the index, not the data twice (WAL, then database), ~2 ms less per 256 KiB segment.
  A row is inserted only after its file is complete; a file without a row (a writer killed
  in between) is removed by ``prune`` once an hour old.

* **Concurrency.** SQLite in WAL mode with a 60 s busy timeout: each ``set_many`` is one short
  ``INSERT`` transaction, readers never block writers. Segment ids grow in commit order, so a
  process loads only the indexes with ``id`` above the last one it saw (one indexed query per
  lookup that misses).
* **Reads.** Blocks are read with SQLite's incremental blob I/O, or ``pread`` on the segment's
  file (only the block's bytes).
* **Pages.** A new database has 4 KiB pages (``PAGE_BYTES``; a database keeps the page size
  it was made with, so an older 64 KiB-page cache goes on working as it is). Every insert
  dirties a few pages (table leaf, indexes, ``hn_total``), each written whole into the WAL:
  with 64 KiB pages a one-entry ``set_many`` wrote ~330 KB, with 4 KiB pages ~23 KB, at
  ~1/4 of the CPU; segments of 1-60 KiB write 3.5-12x less, file segments 2.3x less (their
  row), and reads cost the same (``benchmarks/bench_cache_pages.py``). Large pages paid off
  when large segments were blobs in the database; those are files now.
* **Visibility.** ``prepare()`` writes ``<path>/hn-marker`` once (atomically: a temporary file
  hard-linked into place); a worker whose ``<path>`` holds no such marker -- another machine,
  or a relative path under another working directory -- raises ``CacheNotVisibleError``.
* **Size limit.** ``size_limit`` bounds the bytes of the stored segments (data and index):
  every ``put`` is one ``BEGIN IMMEDIATE`` transaction that reads the running total (kept by
  triggers in ``hn_total``), deletes the least recently used segments (``used``: the time of
  the write or of the last batched ``touch``) until the new one fits with a tenth of the limit
  spare, and inserts it, so the limit holds at every commit whatever the number of writing
  processes. Freed pages are reused by the next writes; ``prune`` also gives them back to the
  file system (incremental vacuum). The WAL is truncated after each eviction and whenever it
  passes 1/16 of the limit (4 to 64 MiB). The directory exceeds the limit by that WAL and
  SQLite's page slack (less than one page, 4 KiB in a new database, per segment stored in
  the database).
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
from collections.abc import Collection
from typing import Any

from hypernodes_dist.cache.segcache import SegmentCache
from hypernodes_dist.cache.segments import Packed, SegmentIndex
from hypernodes_dist.cache.store import FoundIndex, Group, Pruned, Stored, Usage

__all__ = ["DiskCache"]

DB_NAME = "hn-cache.db"
MARKER = "hn-marker"
FILES = "segments"
FILE_BYTES = 64 << 10  # segments with this much data or more are files
_TABLE = (
    "CREATE TABLE IF NOT EXISTS hn_segments(id INTEGER PRIMARY KEY AUTOINCREMENT, "
    "scope TEXT NOT NULL, node TEXT NOT NULL, entries INTEGER NOT NULL, nbytes INTEGER NOT NULL, "
    "idx BLOB NOT NULL, data BLOB NOT NULL, used REAL NOT NULL DEFAULT 0, file TEXT)"
)
_COLUMNS = (  # added to a database made before them
    ("used", "REAL NOT NULL DEFAULT 0"),
    ("file", "TEXT"),
)
_SCHEMA = (  # after the table (and its ``used`` column in a database made before it)
    "CREATE INDEX IF NOT EXISTS hn_segments_node ON hn_segments(scope, node, id)",
    "CREATE INDEX IF NOT EXISTS hn_segments_used ON hn_segments(used, id)",
    "CREATE TABLE IF NOT EXISTS hn_total(id INTEGER PRIMARY KEY CHECK (id = 0), "
    "nbytes INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO hn_total SELECT 0, COALESCE(SUM(nbytes), 0) FROM hn_segments",
    "CREATE TRIGGER IF NOT EXISTS hn_segments_add AFTER INSERT ON hn_segments BEGIN "
    "UPDATE hn_total SET nbytes = nbytes + new.nbytes WHERE id = 0; END",
    "CREATE TRIGGER IF NOT EXISTS hn_segments_del AFTER DELETE ON hn_segments BEGIN "
    "UPDATE hn_total SET nbytes = nbytes - old.nbytes WHERE id = 0; END",
)
PAGE_BYTES = 4096  # of a new database (an existing one keeps its own)
_CHUNK = 500  # ids per ``IN (...)`` query


class DiskCache(SegmentCache):
    """Content-hashed store of node results in one directory of this machine.

    ``size_limit`` (bytes, or a string such as ``"10GB"``; ``None``: unbounded) keeps the
    stored segments under it by evicting the least recently used ones (an evicted entry is a
    miss: its node runs again). ``timeout`` is SQLite's busy timeout in seconds. See the
    module docstring for the layout and ``hypernodes_dist.cache.base`` for the guarantees every
    cache gives.
    """

    _errors = (OSError, sqlite3.Error)

    def __init__(self, path: str | os.PathLike = ".cache", scope: str = "global",
                 timeout: float = 60.0, size_limit: int | str | None = None) -> None:
        self.path: str = os.fspath(path)
        self.timeout = float(timeout)
        super().__init__(scope, size_limit)

    def __repr__(self) -> str:
        limit = "" if self.size_limit is None else f", size_limit={self.size_limit}"
        return f"DiskCache(path={self.path!r}, scope={self.scope!r}{limit})"

    def _config(self) -> dict[str, Any]:
        return {"path": self.path, "scope": self.scope, "timeout": self.timeout,
                "size_limit": self.size_limit}

    def _where(self) -> str:
        return f"DiskCache({self.path!r})"

    def _not_visible_hint(self) -> str:
        return (f"{os.path.abspath(self.path)!r} there is not the driver's directory (another "
                "machine, or another working directory for a relative path). A DiskCache "
                "serves one machine; use ObjectStoreCache('s3://bucket/prefix') or a "
                "directory every machine mounts, ObjectStoreCache('/shared/dir'), for a cluster")

    def _new_store(self, create: bool = True) -> _SQLiteStore:
        return _SQLiteStore(self.path, self.timeout, create, self.size_limit)


class _SQLiteStore:
    """Segments as rows of one SQLite table (see the module docstring); a ``SegmentStore``."""

    max_segment_bytes: int | None = 900_000_000  # SQLite's default blob limit is 1e9 bytes

    def __init__(self, path: str, timeout: float, create: bool,
                 size_limit: int | None = None) -> None:
        self.path = path
        self.timeout = timeout
        self.size_limit = size_limit
        self._con: sqlite3.Connection | None = None
        self._lock = threading.RLock()
        self._files: dict[int, str] = {}  # row id -> file name, of the segments seen here
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
                    _set_up(con, self.size_limit)
                    break
                except sqlite3.OperationalError as exc:
                    con.close()
                    if "locked" not in str(exc) or time.monotonic() > deadline:
                        raise
                    time.sleep(random.uniform(0.005, 0.05))
            self._con = con
        return self._con

    # -- segments --------------------------------------------------------------------------
    def put(self, scope: str, node: str, packed: Packed) -> Stored:
        """Insert one segment (its data in a file first if large); with a size limit, evict
        first in the same transaction."""
        file = self._write_file(packed.data) if len(packed.data) >= FILE_BYTES else None
        row = (scope, node, len(packed.keys), packed.nbytes, packed.index,
               b"" if file else packed.data, time.time(), file)
        try:
            ref = self._insert(row, packed.nbytes)
        except BaseException:
            self._unlink([file] if file else [])
            raise
        if file:
            self._files[ref] = file
        return Stored(ref, len(packed.data))

    def _insert(self, row: tuple[Any, ...], nbytes: int) -> int:
        insert = ("INSERT INTO hn_segments(scope, node, entries, nbytes, idx, data, used, file) "
                  "VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
        with self._lock:
            con = self._connect()
            if self.size_limit is None:
                return int(con.execute(insert, row).lastrowid or 0)
            evicted, files = Pruned(), list[str]()
            with _transaction(con):
                (total,) = con.execute("SELECT nbytes FROM hn_total WHERE id = 0").fetchone()
                if total + nbytes > self.size_limit:
                    spare = self.size_limit // 10
                    evicted, files = _evict_lru(con, total, self.size_limit - spare - nbytes)
                ref = int(con.execute(insert, row).lastrowid or 0)
            self._unlink(files)
            if evicted.segments or self._wal_bytes() > _wal_budget(self.size_limit):
                _reset_wal(con)  # the WAL stays a small part of the limit
            return ref

    # -- segment files -----------------------------------------------------------------------
    def _write_file(self, data: bytes) -> str:
        name = f"{uuid.uuid4().hex}.seg"
        target = os.path.join(self.path, FILES, name)
        tmp = f"{target}.tmp"
        try:
            f = open(tmp, "wb")
        except FileNotFoundError:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            f = open(tmp, "wb")
        with f:
            f.write(data)
        os.replace(tmp, target)  # complete or absent
        return name

    def _unlink(self, files: list[str]) -> None:
        for name in files:
            try:
                os.unlink(os.path.join(self.path, FILES, name))
            except FileNotFoundError:
                pass

    def _read_file(self, name: str, offset: int, length: int) -> bytes | None:
        try:
            fd = os.open(os.path.join(self.path, FILES, name), os.O_RDONLY)
        except FileNotFoundError:  # evicted or cleared by another process
            return None
        try:
            return os.pread(fd, length, offset)
        finally:
            os.close(fd)

    def _orphans(self, con: sqlite3.Connection, before: float) -> list[str]:
        """Segment files no row names, older than ``before`` (killed writers)."""
        try:
            names = os.listdir(os.path.join(self.path, FILES))
        except FileNotFoundError:
            return []
        named = {f for (f,) in con.execute("SELECT file FROM hn_segments WHERE file IS NOT NULL")}
        old = []
        for name in names:
            try:
                mtime = os.path.getmtime(os.path.join(self.path, FILES, name))
            except OSError:
                continue
            if name not in named and mtime < before:
                old.append(name)
        return old

    def _wal_bytes(self) -> int:
        try:
            return os.path.getsize(os.path.join(self.path, DB_NAME + "-wal"))
        except OSError:
            return 0

    def touch(self, refs: Collection[int]) -> None:
        """Record that the segments ``refs`` were just read (one short transaction)."""
        ids, now = list(refs), time.time()
        with self._lock:
            con = self._connect()
            with _transaction(con):
                for start in range(0, len(ids), _CHUNK):
                    chunk = ids[start:start + _CHUNK]
                    con.execute(f"UPDATE hn_segments SET used = ? WHERE id IN "
                                f"({','.join('?' * len(chunk))})", (now, *chunk))

    def prune(self, older_than: float | None, max_bytes: int | None) -> Pruned:
        """Delete by age, then by recency down to ``max_bytes``; give the space back."""
        removed, files = Pruned(), list[str]()
        with self._lock:
            con = self._connect()
            with _transaction(con):
                if older_than is not None:
                    removed, files = _delete_where(con, "used < ?", (time.time() - older_than,))
                if max_bytes is not None:
                    (total,) = con.execute("SELECT nbytes FROM hn_total WHERE id = 0").fetchone()
                    more, more_files = _evict_lru(con, total, max_bytes)
                    removed, files = removed + more, files + more_files
                files += self._orphans(con, time.time() - 3600)
            self._unlink(files)
            if removed.segments:
                con.execute("PRAGMA incremental_vacuum").fetchall()  # one step per page
                con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        return removed

    def version(self, scope: str, node: str | None) -> int:
        """Changes whenever another connection commits (``PRAGMA data_version``)."""
        with self._lock:
            return int(self._connect().execute("PRAGMA data_version").fetchone()[0])

    def scan(self, scope: str, node: str | None, known: SegmentIndex) -> list[FoundIndex]:
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
            for start in range(0, len(new), _CHUNK):
                chunk = new[start:start + _CHUNK]
                for ref, size, idx, file in con.execute(
                        "SELECT id, nbytes - length(idx), idx, file FROM hn_segments WHERE id IN "
                        f"({','.join('?' * len(chunk))})", chunk):
                    if file:
                        self._files[ref] = file
                    out.append(FoundIndex(ref, size, idx))
            return out

    def read(self, ref: int, offset: int, length: int) -> bytes | None:
        file = self._files.get(ref)
        if file is not None:
            return self._read_file(file, offset, length)
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
            con = self._connect()
            with _transaction(con):
                _, files = _delete_where(con, "id = ?", (ref,))
        self._files.pop(ref, None)
        self._unlink(files)

    def drop(self, scope: str | None, node: str | None) -> int:
        where, args = _filter(scope, node)
        with self._lock:
            con = self._connect()
            with _transaction(con):
                removed, files = _delete_where(con, where or "1", args)
        self._unlink(files)
        return removed.entries

    def usage(self) -> dict[Group, Usage]:
        with self._lock:
            rows = self._connect().execute(
                "SELECT scope, node, SUM(entries), SUM(nbytes) FROM hn_segments GROUP BY scope, node"
            ).fetchall()
        return {Group(scope, node): Usage(int(n), int(b)) for scope, node, n, b in rows}

    def size_bytes(self) -> int:
        total = 0
        for root, _dirs, names in os.walk(self.path):
            for name in names:
                try:
                    total += os.path.getsize(os.path.join(root, name))
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
    return " AND ".join(parts), tuple(args)


class _transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on any error) on an autocommit
    connection: the write lock is taken at once, so the reads inside stay true."""

    def __init__(self, con: sqlite3.Connection) -> None:
        self.con = con

    def __enter__(self) -> sqlite3.Connection:
        self.con.execute("BEGIN IMMEDIATE")
        return self.con

    def __exit__(self, kind: object, *exc: object) -> None:
        self.con.execute("ROLLBACK" if kind is not None else "COMMIT")


def _wal_budget(size_limit: int) -> int:
    """The WAL's share of a size limit: 1/16 of it, between 4 and 64 MiB."""
    return min(64 << 20, max(4 << 20, size_limit // 16))


def _reset_wal(con: sqlite3.Connection, tries: int = 20) -> None:
    """Checkpoint and truncate the WAL. Another process's checkpoint makes this one return
    busy at once (no busy wait), and writers that keep checkpointing each other would let the
    WAL grow without end: retry a few times, shortly."""
    for _ in range(tries):
        r = con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if r[0] == 0:
            return
        time.sleep(random.uniform(0.001, 0.01))


def _delete_where(con: sqlite3.Connection, where: str, args: tuple[Any, ...]
                  ) -> tuple[Pruned, list[str]]:
    """Inside a write transaction: delete the rows ``where``; what they held, their files."""
    found = con.execute(f"SELECT COUNT(*), COALESCE(SUM(entries), 0), COALESCE(SUM(nbytes), 0) "
                        f"FROM hn_segments WHERE {where}", args).fetchone()
    files: list[str] = []
    if found[0]:
        files = [f for (f,) in con.execute(
            f"SELECT file FROM hn_segments WHERE ({where}) AND file IS NOT NULL", args)]
        con.execute(f"DELETE FROM hn_segments WHERE {where}", args)
    return Pruned(*map(int, found)), files


def _evict_lru(con: sqlite3.Connection, total: int, target: int) -> tuple[Pruned, list[str]]:
    """Inside a write transaction: delete the least recently used segments until at most
    ``target`` bytes remain (``total``: the bytes now); what was removed, its files."""
    removed, files = Pruned(), list[str]()
    while total > target:
        rows = con.execute("SELECT id, entries, nbytes, file FROM hn_segments ORDER BY used, id "
                           "LIMIT 64").fetchall()
        if not rows:
            break
        ids = []
        for ref, entries, nbytes, file in rows:
            ids.append(ref)
            if file:
                files.append(file)
            removed += Pruned(1, entries, nbytes)
            total -= nbytes
            if total <= target:
                break
        con.execute(f"DELETE FROM hn_segments WHERE id IN ({','.join('?' * len(ids))})", ids)
    return removed, files


def _set_up(con: sqlite3.Connection, size_limit: int | None) -> None:
    # a new database: pages freed by eviction or pruning can go back to the file system, and
    # small pages (every insert writes a few whole pages to the WAL; see the module docstring)
    con.execute(f"PRAGMA page_size={PAGE_BYTES}")  # first: auto_vacuum fixes the page size
    con.execute("PRAGMA auto_vacuum=INCREMENTAL")
    if con.execute("PRAGMA journal_mode").fetchone()[0] != "wal":  # WAL persists in the file
        # a switch that loses a race returns the old mode without an error, and that
        # connection would then stay out of WAL (its checkpoints see no frames): retry
        if con.execute("PRAGMA journal_mode=WAL").fetchone()[0] != "wal":
            raise sqlite3.OperationalError("database is locked (switching to WAL)")
    con.execute("PRAGMA synchronous=NORMAL")
    if size_limit is not None:  # the WAL stays a small part of the limit
        con.execute("PRAGMA wal_autocheckpoint=0")  # ``put`` truncates it (see _reset_wal)
        con.execute("PRAGMA journal_size_limit=0")
    with _transaction(con):
        con.execute(_TABLE)
        columns = [row[1] for row in con.execute("PRAGMA table_info(hn_segments)")]
        for name, kind in _COLUMNS:
            if name not in columns:
                con.execute(f"ALTER TABLE hn_segments ADD COLUMN {name} {kind}")
        if "used" not in columns:  # a database made before recency: its segments count as new
            con.execute("UPDATE hn_segments SET used = ?", (time.time(),))
        for statement in _SCHEMA:
            con.execute(statement)

