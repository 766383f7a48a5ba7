"""Packing lines into batch files within a provider's limits.

Lines go to one open file per endpoint (and per model where the provider wants one model a
file); a file is closed when the next line would take it past a limit (lines, bytes,
embedding inputs). A custom_id seen before is dropped: identical requests share one line.
A ``Packer`` takes lines one by one (``add``) or a block at a time (``add_block``: the
request log's lines made at once, cut where a file fills).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Iterator

from hypernodes_dist.batchapi.identity import file_tag
from hypernodes_dist.batchapi.transport import BatchFile, FileLimits, Line, LineBlock

__all__ = ["pack", "Packer"]


class _Open:
    """A file being filled."""

    def __init__(self) -> None:
        self.lines: list[Line] = []
        self.blocks: list[LineBlock] = []
        self.count = 0
        self.size = 0
        self.inputs = 0

    def fits(self, line: Line, limits: FileLimits) -> bool:
        if not self.count:
            return True
        return (self.count < limits.max_lines
                and self.size + len(line.data) <= limits.max_bytes
                and (limits.max_inputs is None or self.inputs + line.inputs <= limits.max_inputs))

    def room(self, block: LineBlock, limits: FileLimits) -> int:
        """How many of the block's first lines fit in."""
        room = min(len(block.lines), limits.max_lines - self.count)
        sizes = list(itertools.accumulate(map(len, block.lines[:room])))
        room = bisect.bisect_right(sizes, limits.max_bytes - self.size)
        if limits.max_inputs is not None:
            inputs = list(itertools.accumulate(block.inputs[:room]))
            room = bisect.bisect_right(inputs, limits.max_inputs - self.inputs)
        return room

    def add(self, line: Line) -> None:
        self.lines.append(line)
        self.count += 1
        self.size += len(line.data)
        self.inputs += line.inputs

    def add_block(self, block: LineBlock) -> None:
        self.blocks.append(block)
        self.count += len(block.lines)
        self.size += sum(map(len, block.lines))
        self.inputs += sum(block.inputs)

    def close(self, one_model: bool) -> BatchFile:
        first = self.lines[0] if self.lines else self.blocks[0]
        ids = itertools.chain((line.custom_id for line in self.lines),
                              *(block.custom_ids for block in self.blocks))
        return BatchFile(tuple(self.lines), first.endpoint, first.model if one_model else None,
                         self.size, file_tag(ids), tuple(self.blocks))


class Packer:
    """Files within ``limits`` filled line by line or a block at a time, each custom_id
    once; ``add``/``add_block`` return the files they filled, ``close`` the rest."""

    def __init__(self, limits: FileLimits) -> None:
        self.limits = limits
        self.open: dict[tuple[str, str | None], _Open] = {}
        self.seen: set[str] = set()

    def _file(self, endpoint: str, model: str | None) -> tuple[tuple[str, str | None], _Open]:
        where = (endpoint, model if self.limits.one_model else None)
        current = self.open.get(where)
        if current is None:
            current = self.open[where] = _Open()
        return where, current

    def add(self, line: Line) -> tuple[BatchFile, ...]:
        """A line (dropped if its custom_id came before); a line alone past a limit raises
        ``ValueError`` naming it."""
        if line.custom_id in self.seen:
            return ()
        self.seen.add(line.custom_id)
        limits = self.limits
        if len(line.data) > limits.max_bytes or (limits.max_inputs is not None
                                                 and line.inputs > limits.max_inputs):
            _check_alone(line, limits)
        where, current = self._file(line.endpoint, line.model)
        if current.fits(line, limits):
            current.add(line)
            return ()
        full = current.close(limits.one_model)
        current = self.open[where] = _Open()
        current.add(line)
        return (full,)

    def add_block(self, block: LineBlock) -> list[BatchFile]:
        """A block of lines of one endpoint and model, cut where a file fills (a custom_id
        that came before, or one line alone past a limit: the block line by line)."""
        if not self.seen.isdisjoint(block.custom_ids) or len(set(block.custom_ids)) != len(
                block.custom_ids):
            return [f for i in range(len(block.lines)) for f in self.add(_line(block, i))]
        self.seen.update(block.custom_ids)
        full: list[BatchFile] = []
        while block.lines:
            where, current = self._file(block.endpoint, block.model)
            room = current.room(block, self.limits)
            if room == 0 and not current.count:  # its first line alone is past a limit
                _check_alone(_line(block, 0), self.limits)
            if room == 0:
                full.append(current.close(self.limits.one_model))
                self.open[where] = _Open()
                continue
            current.add_block(block.cut(0, room))
            block = block.cut(room, len(block.lines))
        return full

    def close(self) -> list[BatchFile]:
        """The files still open (each holding a line at least)."""
        files = [f.close(self.limits.one_model) for f in self.open.values() if f.count]
        self.open = {}
        return files


def _line(block: LineBlock, i: int) -> Line:
    return Line(block.custom_ids[i], block.endpoint, block.model, block.lines[i],
                block.inputs[i])


def pack(lines: Iterable[Line], limits: FileLimits) -> Iterator[BatchFile]:
    """Batch files holding ``lines`` (each custom_id once), every one within ``limits``;
    full files as they fill, the rest at the end. A line alone past a limit raises
    ``ValueError`` naming it."""
    packer = Packer(limits)
    for line in lines:
        yield from packer.add(line)
    yield from packer.close()


def _check_alone(line: Line, limits: FileLimits) -> None:
    if len(line.data) > limits.max_bytes:
        raise ValueError(f"request {line.custom_id} ({line.endpoint}) is {len(line.data)} "
                         f"bytes, more than a batch file may hold ({limits.max_bytes}); "
                         "send it online (batch_api=False) or make it smaller")
    if limits.max_inputs is not None and line.inputs > limits.max_inputs:
        raise ValueError(f"request {line.custom_id} ({line.endpoint}) has {line.inputs} "
                         f"inputs, more than a batch may hold ({limits.max_inputs})")
