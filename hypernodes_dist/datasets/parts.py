"""Partitions of a dataset source that a worker reads by itself.

A ``Part`` is a contiguous row range ``[offset, offset + n)`` of the source plus a small,
picklable reader: Parquet pieces (path, row groups, rows to skip and take, filesystem) that
the worker opens itself, or -- for sources that only exist in the driver (an Arrow table,
a pandas frame, dict inputs, a stream) -- the rows themselves, compactly serialized.
``read(columns)`` returns ``{column: pyarrow.Array | list}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from hypernodes_dist.sinks.arrow_types import decode_column, is_pickled

__all__ = ["Part", "FilePiece", "ParquetReader", "TableReader", "ListReader", "PandasReader",
           "table_columns"]

READ_BATCH = 65_536


@dataclass
class Part:
    """Rows ``offset .. offset + n`` of the source, and how to read them; its first
    ``start`` rows, and the row ranges ``written`` past them, are in output files already
    (a resumed part computes the rest: ``todo()``)."""

    index: int
    offset: int
    n: int
    reader: Any  # read(columns) -> dict[str, pa.Array | list]
    start: int = 0
    written: tuple[tuple[int, int], ...] = ()  # sorted ranges past ``start``, in files

    def read(self, columns: Sequence[str]) -> dict[str, Any]:
        """All ``n`` rows of ``columns`` (positions in the part; ``start`` not applied)."""
        return self.reader.read(columns)

    def resumed(self, start: int, written: tuple[tuple[int, int], ...] = ()) -> Part:
        """This part with its first ``start`` rows (and the ranges ``written``) in files."""
        return replace(self, start=start, written=written)

    def todo(self) -> list[tuple[int, int]]:
        """The row ranges (positions in the part) with no output file yet, in order."""
        out, a = [], self.start
        for lo, hi in self.written:
            if lo > a:
                out.append((a, min(lo, self.n)))
            a = max(a, hi)
        if a < self.n:
            out.append((a, self.n))
        return out

    def files(self) -> tuple[FilePiece, ...] | None:
        """The Parquet pieces the part's rows are in (``None``: rows held in the part)."""
        return self.reader.pieces if isinstance(self.reader, ParquetReader) else None


@dataclass(frozen=True)
class FilePiece:
    """Rows ``skip .. skip + take`` of row groups ``row_groups`` of one Parquet file."""

    path: str
    row_groups: tuple[int, ...]
    skip: int
    take: int


@dataclass
class ParquetReader:
    """Reads its pieces with pyarrow on whichever machine runs the part."""

    pieces: tuple[FilePiece, ...]
    filesystem: Any

    def read(self, columns: Sequence[str]) -> dict[str, Any]:
        tables = [self._piece(p, list(columns)) for p in self.pieces]
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        return table_columns(table, columns)

    def _piece(self, piece: FilePiece, columns: list[str]) -> pa.Table:
        import pyarrow.parquet as pq

        with self.filesystem.open_input_file(piece.path) as f:
            pf = pq.ParquetFile(f)
            batches, skip, need = [], piece.skip, piece.take
            for batch in pf.iter_batches(READ_BATCH, row_groups=list(piece.row_groups),
                                         columns=columns, use_threads=False):
                if skip >= len(batch):
                    skip -= len(batch)
                    continue
                batch = batch.slice(skip, need)
                skip = 0
                batches.append(batch)
                need -= len(batch)
                if need <= 0:
                    break
            schema = pf.schema_arrow
            fields = [schema.field(c) for c in columns]
        return pa.Table.from_batches(batches, pa.schema(fields))


class TableReader:
    """Rows of an in-memory Arrow table; pickles only its own rows (Arrow IPC)."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def read(self, columns: Sequence[str]) -> dict[str, Any]:
        return table_columns(self.table, columns)

    def __getstate__(self) -> bytes:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, self.table.schema) as writer:
            writer.write_table(self.table)
        return sink.getvalue().to_pybytes()

    def __setstate__(self, data: bytes) -> None:
        self.table = pa.ipc.open_stream(data).read_all()


@dataclass
class ListReader:
    """Rows given as Python lists (dict inputs of a map, or values Arrow cannot hold)."""

    columns: dict[str, list[Any]]

    def read(self, columns: Sequence[str]) -> dict[str, Any]:
        return {c: self.columns[c] for c in columns}


@dataclass
class PandasReader:
    """Rows of a pandas frame: Arrow columns where Arrow holds them, else Python lists."""

    frame: Any

    def read(self, columns: Sequence[str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for c in columns:
            series = self.frame[c]
            try:
                out[c] = pa.Array.from_pandas(series)
            except (pa.ArrowException, TypeError, ValueError):
                out[c] = series.tolist()
        return out


def table_columns(table: pa.Table, columns: Sequence[str]) -> dict[str, Any]:
    """Columns of ``table`` (chunks combined; pickled columns decoded to Python lists)."""
    out: dict[str, Any] = {}
    for c in columns:
        field = table.schema.field(c)
        col = table.column(c)
        out[c] = decode_column(field, col) if is_pickled(field) else col.combine_chunks()
    return out
