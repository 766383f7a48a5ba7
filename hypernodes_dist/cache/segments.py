"""Segments: how both cache backends pack a batch of entries, and find them again.

One ``set_many`` call (one node's results of one batch, see ``keys.WriteBuffer``) becomes one
immutable *segment* plus its *index*; nothing is ever updated in place:

* **Blocks.** Values are pickled a block at a time: one ``cloudpickle.dumps`` of a list of
  values (builtin containers and scalars pickle at C speed; classes and functions defined in
  ``__main__`` still load in worker processes) and one xxh3_128 digest per block. A block holds
  up to 4,096 values and is sized down to about 1 MiB when values are large, so a partial read
  never fetches or unpickles much more than it needs. A segment's data is its blocks, each
  ``header(magic, count, digest) + payload``; a segment holds at most ~64 MiB.
* **Index.** ``header(magic, blocks, entries, digest) + block table (offset, length, count)
  + pickle(list of keys)``: the keys of entry ``i`` of the segment, in block order.
* **Reading.** A process keeps one dict ``key -> (segment number << 32 | entry number)`` built
  from the indexes it has loaded (``dict.update(zip(keys, range(...)))``: no Python work per
  entry), plus a small LRU of decoded blocks. A miss reloads the indexes written since the last
  load (backends throttle how often). Digests are verified before unpickling; a bad block or
  index evicts its whole segment (the entries are recomputed and written again).

Memory: about 100 bytes per indexed entry and process (only the nodes a process asks for).
"""

from __future__ import annotations

import bisect
import logging
import pickle
import struct
import warnings
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress
from typing import Any, NamedTuple

import cloudpickle
from xxhash import xxh3_128_digest

__all__ = ["WHOLE", "BlockAt", "BlockRow", "Packed", "Refreshed", "SegmentIndex", "Written", "decode_block", "decode_index", "pack"]

log = logging.getLogger("hypernodes_dist.cache")

BLOCK_ENTRIES = 4096
BLOCK_BYTES = 1 << 20
SEGMENT_BYTES = 64 << 20
LRU_BYTES = 64 << 20
_BLOCK = struct.Struct("<4sI16s")  # magic, count, digest of the payload
_INDEX = struct.Struct("<4sII16s")  # magic, blocks, entries, digest of the body
_ROW = struct.Struct("<QQI")  # block offset, length, count
_BLOCK_MAGIC, _INDEX_MAGIC = b"HNB1", b"HNX1"
ENTRY_BITS = 32
ENTRY_MASK = (1 << ENTRY_BITS) - 1


class BlockRow(NamedTuple):
    """Where one block of a segment's data is, and how many values it holds."""

    offset: int
    length: int
    count: int  # type: ignore[assignment]  # a field named like tuple.count, read by name


@dataclass
class Packed:
    """One segment ready to store: its keys, index bytes, data bytes and block table."""

    keys: list[str]
    index: bytes
    data: bytes
    rows: list[BlockRow]

    @property
    def nbytes(self) -> int:
        """Bytes the segment takes in a store (data and index)."""
        return len(self.data) + len(self.index)


class BlockAt(NamedTuple):
    """A block of a known segment: its number in ``SegmentIndex.segments`` and the block's
    position (``WHOLE``: every block of the segment, decoded at once)."""

    segment: int
    block: int


WHOLE = -1


class Written(NamedTuple):
    """A segment this process wrote, indexed on its next miss."""

    ref: Any
    size: int
    keys: list[str]
    rows: list[BlockRow]


class Refreshed(NamedTuple):
    """When a process last loaded a node's indexes, and the store's version then."""

    at: float
    version: Any


def pack(items: Mapping[str, Any], segment_bytes: int = 0) -> list[Packed]:
    """Pickle ``items`` into segments (one pickle + digest pass per block) of at most
    ``segment_bytes`` (default ``SEGMENT_BYTES``; a single block may be larger).

    Unpicklable values are left out with one ``RuntimeWarning`` per type."""
    keys, values = list(items), list(items.values())
    limit = segment_bytes or SEGMENT_BYTES
    out: list[Packed] = []
    blocks: list[bytes] = []
    seg_keys: list[str] = []
    rows: list[BlockRow] = []
    size, step, start = 0, BLOCK_ENTRIES, 0
    block_bytes = min(BLOCK_BYTES, limit)
    while start < len(keys):
        stop = start + step
        chunk_keys, payload = _dumps(keys[start:stop], values[start:stop])
        if payload is not None and len(payload) > block_bytes and step > 1:
            step = max(1, step * block_bytes // len(payload))
            if len(payload) > limit and len(chunk_keys) > 1:
                continue  # would not fit in a segment: pickle it again in smaller blocks
        start = stop
        if payload is None:
            continue
        block = _BLOCK.pack(_BLOCK_MAGIC, len(chunk_keys), xxh3_128_digest(payload)) + payload
        if blocks and size + len(block) > limit:
            out.append(_segment(seg_keys, blocks, rows))
            blocks, seg_keys, rows, size = [], [], [], 0
        rows.append(BlockRow(size, len(block), len(chunk_keys)))
        blocks.append(block)
        seg_keys.extend(chunk_keys)
        size += len(block)
    if blocks:
        out.append(_segment(seg_keys, blocks, rows))
    return out


def _segment(keys: list[str], blocks: list[bytes], rows: list[BlockRow]) -> Packed:
    joined = "\n".join(keys)
    if joined.count("\n") == len(keys) - 1:  # keys as one newline-separated string
        key_bytes = b"j" + joined.encode("utf-8", "surrogatepass")
    else:
        key_bytes = b"p" + pickle.dumps(keys, protocol=5)
    body = b"".join([_ROW.pack(*r) for r in rows]) + key_bytes
    header = _INDEX.pack(_INDEX_MAGIC, len(rows), len(keys), xxh3_128_digest(body))
    return Packed(keys, header + body, b"".join(blocks), rows)


def _dumps(keys: list[str], values: list[Any]) -> tuple[list[str], bytes | None]:
    """One pickle of the whole chunk; on failure, find and drop the unpicklable values."""
    try:
        return keys, cloudpickle.dumps(values, protocol=5)
    except Exception:  # noqa: BLE001 - find the culprits below
        pass
    good_keys: list[str] = []
    good_values: list[Any] = []
    bad: dict[str, Exception] = {}
    for key, value in zip(keys, values):
        try:
            cloudpickle.dumps(value, protocol=5)
        except Exception as exc:  # noqa: BLE001 - an unpicklable result is just not cached
            bad.setdefault(type(value).__qualname__, exc)
            continue
        good_keys.append(key)
        good_values.append(value)
    for name, error in bad.items():
        warnings.warn(
            f"hypernodes-dist: result of type {name} cannot be pickled and is not cached "
            f"({type(error).__name__}: {error})", RuntimeWarning, stacklevel=4)
    if not good_keys:
        return [], None
    return good_keys, cloudpickle.dumps(good_values, protocol=5)


def decode_index(blob: Any) -> tuple[list[str], list[BlockRow]] | None:
    """``(keys, block rows)`` of a verified index; ``None`` if anything is wrong."""
    try:
        if type(blob) is not bytes or len(blob) < _INDEX.size:
            return None
        magic, nblocks, nentries, digest = _INDEX.unpack_from(blob)
        body = memoryview(blob)[_INDEX.size:]
        if magic != _INDEX_MAGIC or xxh3_128_digest(body) != digest:
            return None
        table = nblocks * _ROW.size
        rows = [BlockRow(*_ROW.unpack_from(body, i * _ROW.size)) for i in range(nblocks)]
        kind, key_bytes = body[table:table + 1], body[table + 1:]
        if kind == b"j":
            keys = bytes(key_bytes).decode("utf-8", "surrogatepass").split("\n") if nentries else []
        else:
            keys = pickle.loads(key_bytes)
        if type(keys) is not list or len(keys) != nentries or sum(r.count for r in rows) != nentries:
            return None
        return keys, rows
    except Exception:  # noqa: BLE001 - a bad index is a miss
        return None


def decode_block(blob: Any, count: int) -> list[Any] | None:
    """The values of a verified block; ``None`` if it is short, garbage or unpicklable."""
    if type(blob) is not bytes or len(blob) < _BLOCK.size:
        return None
    magic, n, digest = _BLOCK.unpack_from(blob)
    payload = memoryview(blob)[_BLOCK.size:]
    if magic != _BLOCK_MAGIC or n != count or xxh3_128_digest(payload) != digest:
        return None
    try:
        values = pickle.loads(payload)
    except Exception:  # noqa: BLE001 - any unpickling failure is a miss
        log.debug("hypernodes cache: unpicklable block", exc_info=True)
        return None
    return values if type(values) is list and len(values) == count else None


@dataclass
class _Segment:
    ref: Any
    size: int
    keys: list[str]
    offsets: list[int]
    lengths: list[int]
    counts: list[int]
    starts: list[int]  # entry number of each block's first value


@dataclass
class SegmentIndex:
    """What one process knows of a store: key -> location, the segments, decoded blocks."""

    index: dict[str, int] = field(default_factory=dict)
    segments: list[_Segment | None] = field(default_factory=lambda: [None])  # numbers from 1
    known: set[Any] = field(default_factory=set)
    blocks: OrderedDict[BlockAt, list[Any]] = field(default_factory=OrderedDict)
    block_bytes: int = 0
    refreshed: dict[str | None, Refreshed] = field(default_factory=dict)
    cursor: dict[str | None, Any] = field(default_factory=dict)  # backend-specific
    pending: list[Written] = field(default_factory=list)  # this process's writes, indexed lazily

    def add(self, ref: Any, size: int, keys: list[str], rows: Sequence[BlockRow]) -> None:
        """Register one segment (its keys now resolve to it)."""
        self.known.add(ref)
        starts, total = [], 0
        for row in rows:
            starts.append(total)
            total += row.count
        seg = _Segment(ref, size, keys, [r.offset for r in rows], [r.length for r in rows],
                       [r.count for r in rows], starts)
        number = len(self.segments)
        self.segments.append(seg)
        base = number << ENTRY_BITS
        self.index.update(zip(keys, range(base, base + len(keys))))

    def drop(self, number: int) -> Any:
        """Forget segment ``number`` (its keys miss from now on); returns its ref."""
        seg = self.segments[number]
        if seg is None:
            return None
        self.segments[number] = None
        index = self.index
        lo, hi = number << ENTRY_BITS, (number + 1) << ENTRY_BITS
        for key in seg.keys:
            loc = index.get(key)
            if loc is not None and lo <= loc < hi:
                del index[key]
        for b in range(WHOLE, len(seg.counts)):
            found = self.blocks.pop(BlockAt(number, b), None)
            if found is not None:
                self.block_bytes -= seg.size if b < 0 else seg.lengths[b]
        return seg.ref

    def locate(self, keys: Sequence[str]) -> dict[BlockAt, list[tuple[str, int]]]:
        """Group the known keys by ``(segment, block)`` (locations are never 0: segments
        count from 1, so hits are picked at C speed)."""
        locs = list(map(self.index.get, keys))
        groups: dict[BlockAt, list[tuple[str, int]]] = {}  # (key, position in the block)
        segments = self.segments
        for key, loc in zip(compress(keys, locs), filter(None, locs)):
            number, entry = loc >> ENTRY_BITS, loc & ENTRY_MASK
            starts = segments[number].starts  # type: ignore[union-attr]  # the index points only into loaded segments
            b = bisect.bisect_right(starts, entry) - 1 if len(starts) > 1 else 0
            where = BlockAt(number, b)
            group = groups.get(where)
            if group is None:
                group = groups[where] = []
            group.append((key, entry - starts[b]))
        return groups

    def cached_block(self, where: BlockAt) -> list[Any] | None:
        values = self.blocks.get(where)
        if values is not None:
            self.blocks.move_to_end(where)
        return values

    def keep_block(self, where: BlockAt, values: list[Any], nbytes: int) -> None:
        self.blocks[where] = values
        self.block_bytes += nbytes
        while self.block_bytes > LRU_BYTES and len(self.blocks) > 1:
            (number, b), _ = self.blocks.popitem(last=False)
            seg = self.segments[number]
            if seg is not None:
                self.block_bytes -= seg.size if b < 0 else seg.lengths[b]
