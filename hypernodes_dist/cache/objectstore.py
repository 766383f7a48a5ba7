"""``ObjectStoreCache``: the cache's keys and guarantees on storage many machines share.

``ObjectStoreCache(url, scope=...)`` takes ``s3://bucket/prefix``, ``gs://bucket/prefix``, any
other URI ``pyarrow.fs.FileSystem.from_uri`` understands (S3 options go in the query string:
``?endpoint_override=...&region=...``), any ``fsspec`` URI, or a plain directory that every
machine mounts. ``filesystem=`` passes a ready ``pyarrow.fs.FileSystem`` or fsspec filesystem.

Layout, under ``<url>/hncache-v1/``::

    <scope>/<node>/<time>-<writer>-<entries>.seg   the segment: blocks of pickled values
    <scope>/<node>/<time>-<writer>-<entries>.idx   its index (written last)
    marks/<token>                                   one per driver that ran a map
    used/<time>-<writer>-<random>.log               segments read (``<time> <stem>`` lines)

* **No shared mutable object.** Every write creates new, uniquely named objects (a random
  writer id in the name): writers on many machines never overwrite each other, and never need
  a lock. Keys are content addresses, so two writers storing the same key store the same value.
* **Atomic visibility.** The index is written after its segment and a reader only trusts
  indexes: an entry is complete or absent. On object stores each object is one PUT (visible
  only when complete); on files it is written under a temporary name and renamed.
* **No per-entry round trip.** One ``set_many`` is two PUTs whatever its size. A reader lists
  the node's prefix (one LIST, at most every ``refresh_seconds`` while lookups miss: 1 s on
  object stores, every time on files), GETs the indexes it has not seen, then one ranged GET
  per segment (or block) it needs. Another machine's writes are seen within ``refresh_seconds``.
* **Checksums** are verified before unpickling; a bad segment or index is deleted and its
  entries recomputed. ``cache info`` counts entries from object names (no GET per object).
* **Size limit.** Objects cannot be updated, so recency lives in small ``used/`` logs: a
  reading process writes one (the segments it read) at most every 10 s (and on ``close``). With
  ``size_limit`` each writer lists the store before its first write and again once it wrote
  an eighth of the room left at its last listing; when the segments take more than 90% of the
  limit it deletes the least recently used (recency: the later of the write, from the name,
  and the last use in the logs) down to 75%, and merges the logs it read into one. Many
  machines need no lock: writers that list at the same moment may each add one segment
  before the next listing evicts, so the store passes the limit by at most one segment (at
  most 1/8 of the limit) per other writer writing at that moment.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Collection
from typing import Any
from urllib.parse import quote, unquote

from hypernodes_dist.cache.objectlru import (
    MERGE_AFTER,
    USED,
    Listing,
    entries_of,
    evict_to,
    merge_logs,
    read_logs,
)
from hypernodes_dist.cache.segcache import SegmentCache
from hypernodes_dist.cache.segments import Packed, SegmentIndex
from hypernodes_dist.cache.store import FoundIndex, Group, Pruned, Stored, Usage

__all__ = ["ObjectStoreCache"]

LAYOUT = "hncache-v1"
_HIGH, _LOW, _WRITERS = 0.9, 0.75, 8  # see "Size limit" above


class ObjectStoreCache(SegmentCache):
    """Content-hashed store of node results on shared storage (see the module docstring)."""

    touch_seconds = 10.0  # one small ``used/`` log per reading process at most this often

    def __init__(self, url: str | os.PathLike, scope: str = "global", *,
                 filesystem: Any = None, refresh_seconds: float | None = None,
                 size_limit: int | str | None = None) -> None:
        self.url: str = os.fspath(url)
        self.filesystem = filesystem
        self._refresh_option = refresh_seconds
        self.refresh_seconds = 0.0 if refresh_seconds is None else float(refresh_seconds)
        super().__init__(scope, size_limit)

    def __repr__(self) -> str:
        limit = "" if self.size_limit is None else f", size_limit={self.size_limit}"
        return f"ObjectStoreCache({_display(self.url)!r}, scope={self.scope!r}{limit})"

    def _config(self) -> dict[str, Any]:
        return {"url": self.url, "scope": self.scope, "filesystem": self.filesystem,
                "refresh_seconds": self._refresh_option, "size_limit": self.size_limit}

    def _where(self) -> str:
        return f"ObjectStoreCache({_display(self.url)!r})"

    def _not_visible_hint(self) -> str:
        return ("the location holds no marker of the driver there; mount the same shared "
                "directory on every machine (at the same path), or use an object store URL "
                "such as 's3://bucket/prefix'")

    def _new_store(self, create: bool = True) -> _FsStore:
        fs, root = _resolve(self.url, self.filesystem)
        store = _FsStore(fs, f"{root.rstrip('/')}/{LAYOUT}", self.size_limit)
        if self._refresh_option is None:  # listing a local directory is cheap; a bucket is not
            self.refresh_seconds = 0.0 if store.local else 1.0
        return store


class _FsStore:
    """Segments as objects of a ``pyarrow.fs`` filesystem (see the module docstring); a
    ``SegmentStore``."""

    max_segment_bytes: int | None = None

    def __init__(self, fs: Any, root: str, size_limit: int | None = None) -> None:
        import pyarrow.fs as pafs

        self.fs = fs
        self.root = root
        self.size_limit = size_limit
        self.local = isinstance(fs, pafs.LocalFileSystem) or _fsspec_local(fs)
        self._dirs: set[str] = set()
        self._paths: dict[tuple[str, str], str] = {}
        self._writer = uuid.uuid4().hex[:16]
        self._budget = 0  # bytes this process writes before listing the store again
        self._inflight = 0  # bytes its threads are writing (not listed yet)
        self._limit_lock = threading.Lock()
        self._touches = 0

    def _dir(self, scope: str, node: str) -> str:
        found = self._paths.get((scope, node))
        if found is None:
            found = self._paths[(scope, node)] = f"{self.root}/{scope}/{quote(node, safe='')}"
        return found

    def _write(self, path: str, data: bytes) -> None:
        parent = path.rsplit("/", 1)[0]
        if self.local and parent not in self._dirs:
            self.fs.create_dir(parent, recursive=True)
            self._dirs.add(parent)
        target = f"{path}.{uuid.uuid4().hex[:8]}.tmp" if self.local else path
        with self.fs.open_output_stream(target) as out:
            out.write(data)
        if self.local:
            self.fs.move(target, path)  # rename: the object appears complete or not at all

    # -- segments --------------------------------------------------------------------------
    def put(self, scope: str, node: str, packed: Packed) -> Stored:
        if self.size_limit is not None:
            with self._limit_lock:  # threads of one process share the budget
                self._budget -= packed.nbytes
                if self._budget < 0:
                    self._enforce(packed.nbytes)
                self._inflight += packed.nbytes
        stem = f"{self._dir(scope, node)}/{time.time_ns():016x}-{self._writer}-{len(packed.keys)}"
        try:
            self._write(f"{stem}.seg", packed.data)
            self._write(f"{stem}.idx", packed.index)
        finally:
            if self.size_limit is not None:
                with self._limit_lock:
                    self._inflight -= packed.nbytes
        return Stored(stem, len(packed.data))

    # -- size limit and recency ------------------------------------------------------------
    def _listing(self) -> Listing:
        """Every object under the root, with the recency of each segment."""
        listing = Listing(self.root)
        for info in self._list(self.root):
            listing.add(info.path, info.size or 0, info.mtime_ns)
        return listing

    def _enforce(self, incoming: int) -> None:
        """List the store; over 90% of the limit, evict down to 75%; set the write budget."""
        limit = self.size_limit or 0
        listing = self._listing()
        incoming += self._inflight  # other threads' writes may not be listed yet
        if listing.total + incoming > limit * _HIGH:
            evict_to(self, listing, int(limit * _LOW) - incoming)
        self._budget = max(0, limit - listing.total - incoming) // _WRITERS

    def touch(self, refs: Collection[str]) -> None:
        """One ``used/`` log naming the segments read (see the module docstring)."""
        now = time.time_ns()
        start = len(self.root) + 1
        lines = "".join(f"{now:x} {ref[start:]}\n" for ref in refs)
        self.write_log(lines, now)
        self._touches += 1
        if self._touches % MERGE_AFTER == 0:  # a reader that never writes keeps logs few too
            logs = [i.path for i in self._list(f"{self.root}/{USED}") if i.path.endswith(".log")]
            if len(logs) > MERGE_AFTER:
                merge_logs(self, logs, read_logs(self, logs))

    def write_log(self, lines: str, now: int) -> None:
        name = f"{now:016x}-{self._writer}-{uuid.uuid4().hex[:8]}.log"
        self._write(f"{self.root}/{USED}/{name}", lines.encode())

    def read_text(self, path: str) -> str | None:
        try:
            with self.fs.open_input_stream(path) as f:
                return bytes(f.read()).decode("utf-8", "replace")
        except (FileNotFoundError, OSError):
            return None

    def prune(self, older_than: float | None, max_bytes: int | None) -> Pruned:
        """By age, then by recency down to ``max_bytes`` (plus writes killed an hour ago)."""
        listing = self._listing()
        removed = Pruned()
        if older_than is not None:
            cutoff = time.time_ns() - int(older_than * 1e9)
            removed += evict_to(self, listing, None, before=cutoff)
        if max_bytes is not None:
            removed += evict_to(self, listing, max_bytes)
        for path in listing.stale_temporaries(time.time_ns() - 3600 * 10**9):
            self.delete_quietly(path)
        return removed

    def _list(self, prefix: str) -> list[Any]:
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(prefix, recursive=True, allow_not_found=True)
        return [i for i in self.fs.get_file_info(selector) if i.type == pafs.FileType.File]

    def version(self, scope: str, node: str | None) -> int | None:
        """A node directory's mtime on files (new objects are renamed into it); ``None``
        on object stores (they have no cheap change signal: the caller throttles)."""
        if not self.local or node is None:
            return None
        info = self.fs.get_file_info(self._dir(scope, node))
        return info.mtime_ns if info.mtime_ns is not None else 0

    def scan(self, scope: str, node: str | None, known: SegmentIndex) -> list[FoundIndex]:
        """Indexes not loaded yet (of this node, or of every node of the scope)."""
        prefix = f"{self.root}/{scope}" if node is None else self._dir(scope, node)
        sizes: dict[str, int] = {}
        fresh: list[str] = []
        for info in self._list(prefix):
            path = info.path
            if path.endswith(".seg"):
                sizes[path[:-4]] = info.size
            elif path.endswith(".idx") and path[:-4] not in known.known:
                fresh.append(path[:-4])
        out = []
        for stem in sorted(fresh):
            if stem not in sizes:  # an index without its segment: never complete
                continue
            try:
                with self.fs.open_input_stream(f"{stem}.idx") as f:
                    blob = f.read()
            except FileNotFoundError:  # cleared meanwhile
                continue
            out.append(FoundIndex(stem, sizes[stem], blob))
        return out

    def read(self, ref: str, offset: int, length: int) -> bytes | None:
        try:
            with self.fs.open_input_file(f"{ref}.seg") as f:
                return f.read_at(length, offset)
        except FileNotFoundError:
            return None

    def delete(self, ref: str) -> None:
        for suffix in (".idx", ".seg"):  # the index first: readers stop trusting the segment
            try:
                self.fs.delete_file(f"{ref}{suffix}")
            except FileNotFoundError:
                pass

    def _groups(self, scope: str | None, node: str | None) -> list[Any]:
        prefix = self.root if scope is None else f"{self.root}/{scope}"
        infos = []
        for info in self._list(prefix):
            parts = info.path[len(self.root) + 1:].split("/")
            if len(parts) != 3 or parts[0] in ("marks", USED):
                continue
            if node is not None and unquote(parts[1]) != node:
                continue
            infos.append((parts[0], unquote(parts[1]), info))
        return infos

    def drop(self, scope: str | None, node: str | None) -> int:
        found = self._groups(scope, node)
        count = 0
        for _scope, _node, info in found:  # indexes first, then segments
            if info.path.endswith(".idx"):
                count += entries_of(info.path[:-4])
                self.delete_quietly(info.path)
        for _scope, _node, info in found:
            if not info.path.endswith(".idx"):
                self.delete_quietly(info.path)
        return count

    def delete_quietly(self, path: str) -> None:
        try:
            self.fs.delete_file(path)
        except FileNotFoundError:
            pass

    def usage(self) -> dict[Group, Usage]:
        out: dict[Group, list[int]] = {}
        for scope, node, info in self._groups(None, None):
            row = out.setdefault(Group(scope, node), [0, 0])
            if info.path.endswith(".idx"):
                row[0] += entries_of(info.path[:-4])
            row[1] += info.size or 0
        return {group: Usage(*row) for group, row in out.items()}

    def size_bytes(self) -> int:
        return sum(info.size or 0 for info in self._list(self.root))

    # -- visibility marker ----------------------------------------------------------------
    def put_marker(self, token: str) -> str:
        self._write(f"{self.root}/marks/{token}", token.encode())
        return token

    def has_marker(self, token: str) -> bool:
        import pyarrow.fs as pafs

        return self.fs.get_file_info(f"{self.root}/marks/{token}").type == pafs.FileType.File

    def close(self) -> None:
        self._dirs.clear()


def _display(url: str) -> str:
    """The URL without its query string (it may hold credentials)."""
    return url.split("?", 1)[0]


def _resolve(url: str, filesystem: Any) -> tuple[Any, str]:
    """``(pyarrow filesystem, root path)`` of a URL, a plain path or a given filesystem."""
    import pyarrow.fs as pafs

    if filesystem is not None:
        fs = filesystem if isinstance(filesystem, pafs.FileSystem) else _wrap_fsspec(filesystem)
        path = url.split("://", 1)[1] if "://" in url else url
        return fs, path.split("?", 1)[0]
    if "://" not in url:
        return pafs.LocalFileSystem(), os.path.abspath(url)
    try:
        return pafs.FileSystem.from_uri(url)
    except ValueError:  # pyarrow.ArrowInvalid: a scheme pyarrow does not know
        pass
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    return _wrap_fsspec(fs), path


def _wrap_fsspec(fs: Any) -> Any:
    import pyarrow.fs as pafs

    return pafs.PyFileSystem(pafs.FSSpecHandler(fs))


def _fsspec_local(fs: Any) -> bool:
    import pyarrow.fs as pafs

    if not isinstance(fs, pafs.PyFileSystem):
        return False
    inner = getattr(fs.handler, "fs", None)
    return "local" in type(inner).__name__.lower() if inner is not None else False
