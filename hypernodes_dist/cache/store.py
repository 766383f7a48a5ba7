"""``SegmentStore``: the protocol of where ``SegmentCache`` keeps its segments.

``SegmentCache`` (``segcache``) does everything the ``Cache`` protocol promises (packing,
indexes, checksums, degraded modes, pickling); a backend only supplies a *store*: where the
bytes of immutable segments live (SQLite rows in ``disk``, files or objects in ``objectstore``).
A segment is written once (``put``), found through its index (``scan``), read in ranges
(``read``) and deleted as a whole (``delete``, ``drop``, eviction); nothing is updated in place
except its *recency* (``touch``).

Rules every store keeps:

* **Refs.** ``put`` names the new segment with a ref (an ``int`` row id, a ``str`` object
  stem): hashable, picklable, never reused for another segment.
* **Atomic visibility.** ``scan`` returns only complete segments (the index is trusted only
  once the data is there); a segment deleted meanwhile reads as ``None``.
* **Recency.** A segment's recency is the later of its write and its last ``touch``
  (``time.time()`` seconds; readers batch their touches).
* **Size limit.** A store built with ``size_limit`` keeps the bytes of its segments under it by
  deleting the least recently used ones: ``put`` evicts (a store that can do it atomically,
  SQLite, never exceeds the limit; one shared by many machines checks after each writer wrote a
  slice of the free room). Evicted segments are misses, never wrong values.
* **Errors.** Storage errors are raised (``OSError``, ``sqlite3.Error``...): the cache absorbs
  them (``SegmentCache._errors``) and degrades.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable
from typing import TYPE_CHECKING, NamedTuple, Protocol, TypeVar

if TYPE_CHECKING:
    from hypernodes_dist.cache.segments import Packed, SegmentIndex

__all__ = ["FoundIndex", "Group", "Pruned", "SegmentStore", "Stored", "Usage"]

Ref = Hashable
RefT = TypeVar("RefT", bound=Hashable, contravariant=True)  # a store's own kind of ref (a row id, a path)


class Stored(NamedTuple):
    """What ``put`` returns: the new segment's ref and the size of its data."""

    ref: Ref
    size: int


class FoundIndex(NamedTuple):
    """One segment ``scan`` found: its ref, the size of its data and its index bytes."""

    ref: Ref
    size: int
    index: bytes  # type: ignore[assignment]  # a field named like tuple.index, read by name


class Group(NamedTuple):
    """The entries of one scope and node."""

    scope: str
    node: str


class Usage(NamedTuple):
    """Entries and stored bytes (data and index) of one group."""

    entries: int
    nbytes: int


class Pruned(NamedTuple):
    """What a prune or an eviction removed."""

    segments: int = 0
    entries: int = 0
    nbytes: int = 0

    def __add__(self, other: object) -> Pruned:
        if not isinstance(other, Pruned):
            return NotImplemented
        return Pruned(self.segments + other.segments, self.entries + other.entries,
                      self.nbytes + other.nbytes)


class SegmentStore(Protocol[RefT]):
    """Where the segments of one cache live (see the module docstring for the rules)."""

    max_segment_bytes: int | None  # the largest segment the store takes in one piece

    def put(self, scope: str, node: str, packed: Packed) -> Stored:
        """Store one segment (its data, then its index); evict first if over ``size_limit``."""
        ...

    def version(self, scope: str, node: str | None) -> object | None:
        """A value that changes when another process writes (``None``: cannot tell cheaply)."""
        ...

    def scan(self, scope: str, node: str | None, known: SegmentIndex) -> list[FoundIndex]:
        """The indexes of the segments of ``scope`` (and ``node``) that ``known`` lacks."""
        ...

    def read(self, ref: RefT, offset: int, length: int) -> bytes | None:
        """``length`` bytes of a segment's data from ``offset``; ``None`` if it is gone."""
        ...

    def touch(self, refs: Collection[RefT]) -> None:
        """Mark segments as just used (recency for eviction); refs that are gone are ignored."""
        ...

    def delete(self, ref: RefT) -> None:
        """Delete one segment (a bad one); a missing one is not an error."""
        ...

    def drop(self, scope: str | None, node: str | None) -> int:
        """Delete every segment of ``scope`` and/or ``node`` (all: ``None``); return entries."""
        ...

    def prune(self, older_than: float | None, max_bytes: int | None) -> Pruned:
        """Delete the segments unused for ``older_than`` seconds, then the least recently used
        until at most ``max_bytes`` remain; release the space."""
        ...

    def usage(self) -> dict[Group, Usage]:
        """Entries and bytes per group."""
        ...

    def size_bytes(self) -> int:
        """Bytes the store takes where it lives (files, objects), bookkeeping included."""
        ...

    def put_marker(self, token: str) -> str:
        """Leave the visibility marker (if there is none); return the marker's token."""
        ...

    def has_marker(self, token: str) -> bool:
        """Whether this process sees the marker ``token``."""
        ...

    def close(self) -> None:
        """Release connections (the store object is not used again)."""
        ...
