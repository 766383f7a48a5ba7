"""Recency and eviction for ``ObjectStoreCache``: objects cannot be updated in place, so the
last use of a segment is the later of its write (the time in its name) and the latest line
naming it in the ``used/`` logs readers write. ``evict_to`` deletes the least recently used
segments and merges the logs it read into one; ``merge_logs`` keeps their number small when
nothing is evicted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from hypernodes_dist.cache.store import Pruned

__all__ = ["USED", "Listing", "LogStore", "entries_of", "evict_to", "merge_logs", "read_logs"]

USED = "used"
MERGE_AFTER = 64  # logs: more than this many are merged into one


class LogStore(Protocol):
    """What eviction needs from the object store (``objectstore._FsStore``)."""

    root: str

    def read_text(self, path: str) -> str | None: ...

    def write_log(self, lines: str, now: int) -> None: ...

    def delete(self, ref: str) -> None: ...

    def delete_quietly(self, path: str) -> None: ...


@dataclass
class _Segment:
    nbytes: int
    entries: int
    used: int  # ns since the epoch


@dataclass
class Listing:
    """Every object under a cache's root: segments (by stem), ``used/`` logs, leftovers."""

    root: str
    segments: dict[str, _Segment] = field(default_factory=dict)
    logs: dict[str, int] = field(default_factory=dict)  # path -> bytes
    temporaries: list[tuple[str, int]] = field(default_factory=list)  # path, mtime ns
    total: int = 0

    def add(self, path: str, size: int, mtime_ns: int | None) -> None:
        self.total += size
        if path.endswith(".tmp"):  # a write in progress, or one a killed writer left
            self.temporaries.append((path, mtime_ns or 0))
        elif path.startswith(f"{self.root}/{USED}/"):
            self.logs[path] = size
        elif path.endswith((".seg", ".idx")):
            stem = path[:-4]
            seg = self.segments.get(stem)
            if seg is None:
                seg = self.segments[stem] = _Segment(0, entries_of(stem), _written(stem))
            seg.nbytes += size

    def stale_temporaries(self, before_ns: int) -> list[str]:
        return [path for path, mtime in self.temporaries if mtime < before_ns]

    def rel(self, stem: str) -> str:
        return stem[len(self.root) + 1:]


def read_logs(store: LogStore, paths: list[str]) -> dict[str, int]:
    """The latest use of each segment (relative stem -> ns) the logs ``paths`` name."""
    latest: dict[str, int] = {}
    for path in paths:
        text = store.read_text(path)
        for line in (text or "").splitlines():
            stamp, _, rel = line.partition(" ")
            try:
                when = int(stamp, 16)
            except ValueError:
                continue
            if rel and when > latest.get(rel, 0):
                latest[rel] = when
    return latest


def merge_logs(store: LogStore, paths: list[str], latest: dict[str, int]) -> None:
    """Replace the logs ``paths`` by one holding ``latest`` (written before they go: two
    processes merging at once leave two equal logs, never lose a use)."""
    if latest:
        store.write_log("".join(f"{when:x} {rel}\n" for rel, when in latest.items()),
                        time.time_ns())
    for path in paths:
        store.delete_quietly(path)


def apply_logs(store: LogStore, listing: Listing) -> dict[str, int]:
    """Read every log of ``listing`` into its segments' recency; return what they said."""
    latest = read_logs(store, list(listing.logs))
    for rel, when in latest.items():
        seg = listing.segments.get(f"{listing.root}/{rel}")
        if seg is not None and when > seg.used:
            seg.used = when
    return latest


def evict_to(store: LogStore, listing: Listing, target: int | None,
             before: int | None = None) -> Pruned:
    """Delete the least recently used segments until ``listing.total <= target``, or (with
    ``before``) those last used before that time; merge the logs. Updates ``listing``."""
    latest = apply_logs(store, listing)
    order = sorted(listing.segments.items(), key=lambda item: (item[1].used, item[0]))
    removed = Pruned()
    for stem, seg in order:
        if before is not None and seg.used >= before:
            break
        if before is None and (target is None or listing.total <= target):
            break
        store.delete(stem)
        del listing.segments[stem]
        latest.pop(listing.rel(stem), None)
        listing.total -= seg.nbytes
        removed += Pruned(1, seg.entries, seg.nbytes)
    if listing.logs:
        merge_logs(store, list(listing.logs), latest)
        listing.total -= sum(listing.logs.values())
        listing.logs = {}
    return removed


def _written(stem: str) -> int:
    try:
        return int(stem.rsplit("/", 1)[-1].split("-", 1)[0], 16)
    except ValueError:
        return 0


def entries_of(stem: str) -> int:
    """Entries of a segment, from its name (``<time>-<writer>-<entries>``)."""
    try:
        return int(stem.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return 0

