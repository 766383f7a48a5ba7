"""Every ``source=`` a map accepts, normalized into row-range ``Part``s workers can read.

- Parquet file / directory / glob, local path or URI (``s3://``, ``gs://``, ``file://``),
  and a file-based ``pyarrow.dataset.Dataset`` of Parquet files: only file footers are
  read in the driver (row counts, row groups, schema); each part names its files, row
  groups and row range, and the worker reads them itself (``ParquetSource``).
- ``pyarrow.Table`` and ``pandas.DataFrame``: already in the driver; parts are slices
  (``TableSource``, ``PandasSource``).
- ``pyarrow.RecordBatchReader`` and other ``pyarrow.dataset.Dataset``s: read once, in
  order, re-cut into parts as they stream (``StreamSource``; the driver holds one part);
  their content is only known as they are read, so each part's rows get a digest that a
  rerun checks a finished part against (``part_digest``).
- ``dask.dataframe.DataFrame`` and ``daft.DataFrame``: kept as they are (``DaskSource``,
  ``DaftSource``); their engines run them natively, other engines stream them.

pandas, dask and daft are imported only when such a source is given.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from hypernodes_dist.cache.hashing import hash_value
from hypernodes_dist.datasets.parts import (
    FilePiece,
    ListReader,
    PandasReader,
    ParquetReader,
    Part,
    TableReader,
)
from hypernodes_dist.inputs import frame_kind

__all__ = ["Source", "ParquetSource", "TableSource", "PandasSource", "StreamSource",
           "ListSource", "DaskSource", "DaftSource", "open_source", "is_frame"]

_GLOB = set("*?[")


class Source:
    """A normalized source: column names, row count (``None``: unknown until read), parts."""

    kind = "source"
    columns: tuple[str, ...] = ()
    n: int | None = None

    def fields(self) -> dict[str, pa.Field]:
        """Arrow fields of the columns whose type is known without reading rows."""
        return {}

    def set_rows(self, n: int) -> None:
        """The row count, once an engine has counted a source that did not know it."""
        self.n = n

    def fingerprint(self) -> str:
        raise NotImplementedError

    def part_digest(self, part: Part) -> str | None:
        """A digest of ``part``'s rows, for sources whose ``fingerprint`` cannot see their
        content before they are read (streams): a rerun checks each finished part against
        the digest its run recorded. ``None``: the fingerprint already covers the content."""
        return None

    def parts(self, rows: int) -> Iterator[Part]:
        """Consecutive parts of ``rows`` rows (the last may be shorter)."""
        raise NotImplementedError

    def head(self, k: int, columns: Sequence[str]) -> dict[str, list[Any]]:
        """The first ``k`` rows of ``columns`` as Python lists (to type the outputs)."""
        for part in self.parts(k):  # a Dask partition may hold more than k rows
            return {c: _pylist(v)[:k] for c, v in part.read(columns).items()}
        return {c: [] for c in columns}


def _pylist(values: Any) -> list[Any]:
    return values if isinstance(values, list) else values.to_pylist()


def table_digest(table: pa.Table) -> str:
    """A digest of a table's rows (its Arrow IPC stream: a slice counts only its rows)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return hashlib.blake2b(memoryview(sink.getvalue()), digest_size=16).hexdigest()


def _digest(*parts: Any) -> str:
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(repr(p).encode())
    return h.hexdigest()


# ------------------------------------------------------------------ Parquet files


class ParquetSource(Source):
    kind = "parquet"

    def __init__(self, paths: list[str], filesystem: Any, where: str) -> None:
        import pyarrow.parquet as pq

        if not paths:
            raise ValueError(f"source {where!r} holds no Parquet files")
        self.paths, self.filesystem, self.where = paths, filesystem, where
        scheme = where.split("://", 1)[0] if "://" in where else ""
        self.uri_prefix = f"{scheme}://" if scheme and scheme != "file" else ""
        self.row_groups: list[list[int]] = []
        footers = []  # a file's size and footer (statistics, byte sizes): its content changed
        schema = None
        for path in paths:
            with filesystem.open_input_file(path) as f:
                size = f.size()
                meta = pq.ParquetFile(f).metadata
                if schema is None:
                    schema = meta.schema.to_arrow_schema()
            self.row_groups.append([meta.row_group(i).num_rows for i in range(meta.num_row_groups)])
            footers.append(_digest(size, meta.to_dict()))
        assert schema is not None
        self.schema = schema
        self.columns = tuple(schema.names)
        self.n = sum(sum(rg) for rg in self.row_groups)
        self._fp = _digest(self.n, [(p, rg) for p, rg in zip(paths, self.row_groups)], footers,
                           schema.to_string())

    def fields(self) -> dict[str, pa.Field]:
        return {f.name: f for f in self.schema}

    def fingerprint(self) -> str:
        return self._fp

    def parts(self, rows: int) -> Iterator[Part]:
        rows = max(1, rows)
        assert self.n is not None
        spans = _file_spans(self.row_groups)  # (file, row group, start, n) in row order
        for index, start in enumerate(range(0, self.n, rows)):
            stop = min(start + rows, self.n)
            yield Part(index, start, stop - start,
                       ParquetReader(_pieces(self.paths, spans, start, stop), self.filesystem))


def _file_spans(row_groups: list[list[int]]) -> list[tuple[int, int, int, int]]:
    spans, start = [], 0
    for f, sizes in enumerate(row_groups):
        for g, size in enumerate(sizes):
            if size:
                spans.append((f, g, start, size))
                start += size
    return spans


def _pieces(paths: list[str], spans: list[tuple[int, int, int, int]], start: int,
            stop: int) -> tuple[FilePiece, ...]:
    """The file pieces covering rows ``start .. stop``: per file, its overlapping row groups."""
    by_file: dict[int, list[tuple[int, int, int]]] = {}
    for f, g, a, size in spans:
        if a < stop and a + size > start:
            by_file.setdefault(f, []).append((g, a, size))
    pieces = []
    for f, groups in by_file.items():
        first = groups[0][1]
        lo = max(start, first)
        hi = min(stop, groups[-1][1] + groups[-1][2])
        pieces.append(FilePiece(paths[f], tuple(g for g, _, _ in groups), lo - first, hi - lo))
    return tuple(pieces)


def parquet_source(location: str | os.PathLike[str]) -> ParquetSource:
    """A Parquet file, directory (recursive; ``_``/``.`` names skipped) or glob."""
    import pyarrow.fs as pafs

    where = os.fspath(location)
    if "://" in where:
        filesystem, path = pafs.FileSystem.from_uri(where)
    else:
        filesystem, path = pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(where))
    if _GLOB & set(path):
        cut = min(i for i, ch in enumerate(path) if ch in _GLOB)
        base = path[:cut].rsplit("/", 1)[0] or "/"
        found = _listing(filesystem, base)
        paths = [p for p in found if fnmatch.fnmatchcase(p, path)]
    else:
        info = filesystem.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(f"source {where!r} does not exist")
        if info.type == pafs.FileType.Directory:
            paths = _listing(filesystem, path)
        else:
            paths = [path]
    return ParquetSource(sorted(paths), filesystem, where)


def _listing(filesystem: Any, base: str) -> list[str]:
    import pyarrow.fs as pafs

    selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
    out = []
    for info in filesystem.get_file_info(selector):
        if info.type != pafs.FileType.File:
            continue
        rel = info.path[len(base):].lstrip("/")
        if any(part[:1] in ("_", ".") for part in rel.split("/")):
            continue  # pyarrow's convention: _metadata, _hn_manifest.json, .tmp files
        out.append(info.path)
    return out


# ------------------------------------------------------------------ in-memory sources


class TableSource(Source):
    kind = "table"

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self.columns = tuple(table.column_names)
        self.n = table.num_rows

    def fields(self) -> dict[str, pa.Field]:
        return {f.name: f for f in self.table.schema}

    def fingerprint(self) -> str:
        h = hashlib.blake2b(digest_size=16)
        h.update(self.table.schema.to_string().encode())
        for batch in self.table.to_batches():
            for array in batch.columns:
                for buf in array.buffers():
                    if buf is not None:
                        h.update(memoryview(buf))
        return h.hexdigest()

    def parts(self, rows: int) -> Iterator[Part]:
        rows = max(1, rows)
        for index, start in enumerate(range(0, self.table.num_rows, rows)):
            piece = self.table.slice(start, rows)
            yield Part(index, start, piece.num_rows, TableReader(piece))


class PandasSource(Source):
    kind = "pandas"

    def __init__(self, frame: Any) -> None:
        self.frame = frame
        self.columns = tuple(str(c) for c in frame.columns)
        self.n = len(frame)

    def fingerprint(self) -> str:
        import pandas as pd

        try:
            rows = pd.util.hash_pandas_object(self.frame, index=False).to_numpy().tobytes()
        except TypeError:  # unhashable cells (lists, dicts): their text
            rows = repr(self.frame.to_dict("list")).encode()
        return _digest(self.columns, list(map(str, self.frame.dtypes)),
                       hashlib.blake2b(rows, digest_size=16).hexdigest())

    def parts(self, rows: int) -> Iterator[Part]:
        rows = max(1, rows)
        for index, start in enumerate(range(0, self.n or 0, rows)):
            piece = self.frame.iloc[start:start + rows]
            yield Part(index, start, len(piece), PandasReader(piece))


class ListSource(Source):
    """Dict inputs of a map (already expanded into equally long columns)."""

    kind = "lists"

    def __init__(self, columns: dict[str, list[Any]], n: int) -> None:
        self.data = columns
        self.columns = tuple(columns)
        self.n = n

    def fingerprint(self) -> str:
        try:
            return _digest(self.n, [(k, hash_value(v)) for k, v in self.data.items()])
        except Exception:  # values without a content hash (locks, clients): their count
            return _digest(self.n, list(self.data), "unhashable")

    def parts(self, rows: int) -> Iterator[Part]:
        rows = max(1, rows)
        for index, start in enumerate(range(0, self.n or 0, rows)):
            cols = {k: v[start:start + rows] for k, v in self.data.items()}
            yield Part(index, start, min(rows, (self.n or 0) - start), ListReader(cols))


class StreamSource(Source):
    """Record batches read once, in order (a ``RecordBatchReader`` or a non-file dataset)."""

    kind = "stream"

    def __init__(self, schema: pa.Schema, batches: Iterator[pa.RecordBatch], n: int | None,
                 fingerprint: str) -> None:
        self.schema = schema
        self.columns = tuple(schema.names)
        self.n = n
        self._batches = batches
        self._buffer: list[pa.RecordBatch] = []  # rows read ahead by head()
        self._fp = fingerprint

    def fields(self) -> dict[str, pa.Field]:
        return {f.name: f for f in self.schema}

    def fingerprint(self) -> str:
        return self._fp

    def head(self, k: int, columns: Sequence[str]) -> dict[str, list[Any]]:
        have = sum(len(b) for b in self._buffer)
        for batch in self._batches:
            self._buffer.append(batch)
            have += len(batch)
            if have >= k:
                break
        table = pa.Table.from_batches(self._buffer, self.schema).slice(0, k)
        return {c: _pylist(v) for c, v in TableReader(table).read(columns).items()}

    def part_digest(self, part: Part) -> str | None:
        assert isinstance(part.reader, TableReader)
        return table_digest(part.reader.table)

    def parts(self, rows: int) -> Iterator[Part]:
        rows = max(1, rows)
        pending: list[pa.RecordBatch] = []
        have, index, offset = 0, 0, 0
        for batch in _chain(self._buffer, self._batches):
            pending.append(batch)
            have += len(batch)
            while have >= rows:
                table = pa.Table.from_batches(pending, self.schema)
                yield Part(index, offset, rows, TableReader(table.slice(0, rows)))
                rest = table.slice(rows)
                pending, have = rest.to_batches(), rest.num_rows
                index, offset = index + 1, offset + rows
        if have:
            table = pa.Table.from_batches(pending, self.schema)
            yield Part(index, offset, have, TableReader(table))


def _chain(first: list[pa.RecordBatch], rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    while first:
        yield first.pop(0)
    yield from rest


# ------------------------------------------------------------------ frames of other engines


class DaskSource(Source):
    kind = "dask"

    def __init__(self, frame: Any) -> None:
        self.frame = frame
        self.columns = tuple(str(c) for c in frame.columns)

    def fingerprint(self) -> str:
        return _digest(self.frame._name, self.columns)

    def parts(self, rows: int) -> Iterator[Part]:
        """One part per Dask partition (``rows`` is ignored), computed in the driver."""
        offset = 0
        for index, delayed in enumerate(self.frame.to_delayed()):
            piece = delayed.compute()
            yield Part(index, offset, len(piece), PandasReader(piece))
            offset += len(piece)


class DaftSource(Source):
    kind = "daft"

    def __init__(self, frame: Any) -> None:
        self.frame = frame
        self.columns = tuple(frame.column_names)
        self._n: int | None = None

    def fingerprint(self) -> str:
        """The query plan (files, options, operations); a frame that is only an in-memory
        scan is in the driver already: its content is hashed too."""
        plan = self.frame._builder.pretty_print(simple=False)
        if plan.count("* ") == 1 and plan.startswith("* Source:"):
            digests = [table_digest(pa.Table.from_batches([b]))
                       for b in self.frame.to_arrow_iter()]
            return _digest(self.frame.schema(), plan, digests)
        return _digest(self.frame.schema(), plan)

    def parts(self, rows: int) -> Iterator[Part]:
        """Streamed through the driver (other engines than Daft)."""
        stream = StreamSource(_daft_schema(self.frame), self.frame.to_arrow_iter(), None, "")
        yield from stream.parts(rows)

    def head(self, k: int, columns: Sequence[str]) -> dict[str, list[Any]]:
        return self.frame.select(*columns).limit(k).to_pydict()


def _daft_schema(frame: Any) -> pa.Schema:
    return frame.schema().to_pyarrow_schema()


# ------------------------------------------------------------------ dispatch


def is_frame(value: Any) -> str | None:
    """The kind of table ``value`` is (a source, not a list of values), else ``None``."""
    return frame_kind(value)


def open_source(source: Any) -> Source:
    """The ``Source`` for any accepted ``source=`` value; ``TypeError`` for anything else."""
    if isinstance(source, (str, os.PathLike)):
        return parquet_source(source)
    if isinstance(source, pa.Table):
        return TableSource(source)
    if isinstance(source, pa.RecordBatch):
        return TableSource(pa.Table.from_batches([source]))
    if isinstance(source, pa.RecordBatchReader):
        return StreamSource(source.schema, iter(source), None,
                            _digest("stream", source.schema.to_string()))
    kind = frame_kind(source)
    if kind is not None and kind.endswith("Dataset"):
        return _dataset_source(source)
    if kind == "pandas.DataFrame":
        return PandasSource(source)
    if kind == "dask.DataFrame":
        return DaskSource(source)
    if kind == "daft.DataFrame":
        return DaftSource(source)
    raise TypeError(
        f"source= takes a Parquet path/glob/URI, a pyarrow Table, RecordBatchReader or "
        f"Dataset, or a pandas, Dask or Daft DataFrame; got {type(source).__name__}"
    )


def _dataset_source(dataset: Any) -> Source:
    import pyarrow.dataset as ds

    if isinstance(dataset, ds.FileSystemDataset) and isinstance(dataset.format,
                                                                 ds.ParquetFileFormat):
        return ParquetSource(list(dataset.files), dataset.filesystem, "pyarrow dataset")
    if isinstance(dataset, ds.InMemoryDataset):
        return TableSource(dataset.to_table())
    n = dataset.count_rows()
    files = list(getattr(dataset, "files", []))  # other file formats: their sizes and times
    infos = [(i.path, i.size, i.mtime_ns)
             for i in (dataset.filesystem.get_file_info(files) if files else [])]
    return StreamSource(dataset.schema, iter(dataset.to_batches()), n,
                        _digest("dataset", dataset.schema.to_string(), n, infos))
