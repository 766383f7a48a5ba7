"""Packing lines into batch files within a provider's limits.

Lines go to one open file per endpoint (and per model where the provider wants one model a
file); a file is closed when the next line would take it past a limit (lines, bytes,
embedding inputs). A custom_id seen before is dropped: identical requests share one line.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from hypernodes_dist.batchapi.identity import file_tag
from hypernodes_dist.batchapi.transport import BatchFile, FileLimits, Line

__all__ = ["pack"]


class _Open:
    """A file being filled."""

    def __init__(self) -> None:
        self.lines: list[Line] = []
        self.size = 0
        self.inputs = 0

    def fits(self, line: Line, limits: FileLimits) -> bool:
        if not self.lines:
            return True
        return (len(self.lines) < limits.max_lines
                and self.size + len(line.data) <= limits.max_bytes
                and (limits.max_inputs is None or self.inputs + line.inputs <= limits.max_inputs))

    def add(self, line: Line) -> None:
        self.lines.append(line)
        self.size += len(line.data)
        self.inputs += line.inputs

    def close(self, one_model: bool) -> BatchFile:
        first = self.lines[0]
        return BatchFile(tuple(self.lines), first.endpoint, first.model if one_model else None,
                         self.size, file_tag(line.custom_id for line in self.lines))


def pack(lines: Iterable[Line], limits: FileLimits) -> Iterator[BatchFile]:
    """Batch files holding ``lines`` (each custom_id once), every one within ``limits``;
    full files as they fill, the rest at the end. A line alone past a limit raises
    ``ValueError`` naming it."""
    open_files: dict[tuple[str, str | None], _Open] = {}
    seen: set[str] = set()
    one_model, max_bytes, max_inputs = limits.one_model, limits.max_bytes, limits.max_inputs
    for line in lines:
        if line.custom_id in seen:
            continue
        seen.add(line.custom_id)
        if len(line.data) > max_bytes or (max_inputs is not None and line.inputs > max_inputs):
            _check_alone(line, limits)
        where = (line.endpoint, line.model if one_model else None)
        current = open_files.get(where)
        if current is None:
            current = open_files[where] = _Open()
        elif not current.fits(line, limits):
            yield current.close(one_model)
            current = open_files[where] = _Open()
        current.add(line)
    for current in open_files.values():
        if current.lines:
            yield current.close(limits.one_model)


def _check_alone(line: Line, limits: FileLimits) -> None:
    if len(line.data) > limits.max_bytes:
        raise ValueError(f"request {line.custom_id} ({line.endpoint}) is {len(line.data)} "
                         f"bytes, more than a batch file may hold ({limits.max_bytes}); "
                         "send it online (batch_api=False) or make it smaller")
    if limits.max_inputs is not None and line.inputs > limits.max_inputs:
        raise ValueError(f"request {line.custom_id} ({line.endpoint}) has {line.inputs} "
                         f"inputs, more than a batch may hold ({limits.max_inputs})")
