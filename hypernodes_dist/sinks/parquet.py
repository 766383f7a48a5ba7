"""The ``into=`` directory: a plain Parquet dataset written part by part, by the workers.

- a part (a row range one worker computes) is one file, ``part-000042.parquet``, or -- when
  its rows were committed as they finished (``commit_seconds``) -- consecutive files
  ``part-000042-000000000-000001234.parquet`` of its rows ``0 .. 1234`` (positions in the
  part), ``part-000042-000001234-...``; every file is written to a temporary ``.hn-tmp-*``
  name in the same directory and renamed into place, so an output file appears complete or
  not at all (on object stores a finished upload is atomic too);
- every other file the map keeps there starts with ``_`` or ``.`` (``_hn_manifest.json``,
  ``_hn_input-000042`` digests of streamed parts' rows, temporary files), so pyarrow,
  Daft and Dask read the directory as a dataset as it is;
- ``committed()`` says, per part, which of its rows are in files (its first rows, and
  ranges past a gap: a map stopped by an error or a budget writes every row that
  finished, around the ones that did not): a rerun computes only the rest.

Local paths and URIs (``s3://``, ``gs://``, ``file://``) go through ``pyarrow.fs``.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from hypernodes_dist.sinks.arrow_types import stored_schema

__all__ = ["ParquetDataset", "Committed", "MANIFEST", "ERROR_COLUMN", "ROW_COLUMN",
           "USAGE_COLUMN", "USAGE_TYPE"]

MANIFEST = "_hn_manifest.json"
INPUT_DIGEST = "_hn_input-"  # + part index: the digest of a streamed part's rows
ROW_COLUMN = "_hn_row"
ERROR_COLUMN = "_hn_error"
USAGE_COLUMN = "_hn_usage"  # what the row's calls metered (graphs with nodes that meter)
USAGE_TYPE = pa.map_(pa.string(), pa.float64())
_PART = re.compile(r"^part-(\d+)(?:-(\d+)-(\d+))?\.parquet$")


@dataclass(frozen=True)
class Committed:
    """What the files of one part hold: its first ``rows`` rows, or all of them
    (``whole``: one file written at once), and the row ranges ``past`` a gap after them;
    ``stale`` names range files overlapping rows already held (to be removed)."""

    rows: int = 0
    whole: bool = False
    past: tuple[tuple[int, int], ...] = ()
    stale: tuple[str, ...] = ()

    def done(self, n: int) -> bool:
        return self.whole or self.rows >= n


class ParquetDataset:
    """The output directory of a dataset map (picklable: a path and a pyarrow filesystem)."""

    def __init__(self, location: str | os.PathLike[str]) -> None:
        import pyarrow.fs as pafs

        where = os.fspath(location)
        self.location = where
        self.remote = "://" in where and not where.startswith("file://")
        if "://" in where:
            self.filesystem, self.root = pafs.FileSystem.from_uri(where)
        else:
            self.filesystem = pafs.LocalFileSystem()
            self.root = os.path.abspath(os.path.expanduser(where))
        self.root = self.root.rstrip("/") or "/"
        self.uri_prefix = where.split("://", 1)[0] + "://" if self.remote else ""

    def __repr__(self) -> str:
        return f"ParquetDataset({self.location!r})"

    # -- paths -------------------------------------------------------------------------
    def path(self, name: str) -> str:
        return f"{self.root}/{name}"

    @staticmethod
    def part_name(index: int, span: tuple[int, int] | None = None) -> str:
        """``part-000042.parquet`` (the whole part) or ``part-000042-<start>-<stop>.parquet``
        (its rows ``start .. stop``)."""
        if span is None:
            return f"part-{index:06d}.parquet"
        return f"part-{index:06d}-{span[0]:09d}-{span[1]:09d}.parquet"

    def create(self) -> None:
        self.filesystem.create_dir(self.root, recursive=True)

    def listing(self) -> list[str]:
        """Names of the files directly in the directory (empty if it does not exist)."""
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self.root, recursive=False, allow_not_found=True)
        return sorted(i.base_name for i in self.filesystem.get_file_info(selector)
                      if i.type == pafs.FileType.File)

    def finished(self) -> set[int]:
        """Parts with at least one output file (files appear complete, by rename)."""
        return {int(m.group(1)) for name in self.listing() if (m := _PART.match(name))}

    def committed(self) -> dict[int, Committed]:
        """Per part with files: how many of its first rows they hold (consecutive files
        from row 0 on) and the ranges of the files past a gap."""
        spans: dict[int, list[tuple[int, int, str]]] = {}
        whole: set[int] = set()
        for name in self.listing():
            m = _PART.match(name)
            if not m:
                continue
            index = int(m.group(1))
            if m.group(2) is None:
                whole.add(index)
            else:
                spans.setdefault(index, []).append((int(m.group(2)), int(m.group(3)), name))
        out = {i: Committed(whole=True) for i in whole}
        for index, found in spans.items():
            if index not in whole:
                out[index] = _spans(found, self.path)
        return out

    def part_files(self) -> list[str]:
        return [self.path(n) for n in self.listing() if _PART.match(n)]

    # -- writing -----------------------------------------------------------------------
    def write_part(self, index: int, table: pa.Table,
                   span: tuple[int, int] | None = None) -> str:
        """Write one part's rows (``span``: only its rows ``start .. stop``, else all of
        them): temporary name, then rename into place."""
        import pyarrow.parquet as pq

        tmp = self.temp_path(index)
        table = table.cast(stored_schema(table.schema))  # one file schema on every engine
        try:
            pq.write_table(table, tmp, filesystem=self.filesystem,
                           row_group_size=min(max(table.num_rows, 1), 1 << 17),
                           use_compliant_nested_type=False)  # list items named as Daft does
        except BaseException:
            self.remove(tmp)
            raise
        return self.place(tmp, index, span)

    def place(self, written: str, index: int, span: tuple[int, int] | None = None) -> str:
        """Rename a complete file written here under a temporary name (``temp_path``) into
        place as part ``index``'s (``span``: its rows ``start .. stop``)."""
        final = self.path(self.part_name(index, span))
        try:
            self.filesystem.move(written, final)
        except BaseException:
            self.remove(written)
            raise
        return final

    def temp_path(self, index: int) -> str:
        """A temporary name in the directory for a file of part ``index`` (hidden from
        readers: a leading ``.``; removed by the next run if this one dies)."""
        return self.path(f".hn-tmp-{index:06d}-{uuid.uuid4().hex[:12]}.parquet")

    def remove(self, path: str) -> None:
        """Delete ``path`` if it exists."""
        try:
            self.filesystem.delete_file(path)
        except (OSError, FileNotFoundError):
            pass

    def clear(self) -> None:
        """Delete every file of a previous map here (``overwrite=True``)."""
        for name in self.listing():
            if (_PART.match(name) or name.startswith((".hn-", INPUT_DIGEST))
                    or name == MANIFEST):
                self.remove(self.path(name))

    # -- input digests (sources read as they stream) -------------------------------------
    def write_input_digest(self, index: int, digest: str) -> None:
        """Record the digest of the rows part ``index`` is computed from (written before
        the part's file, so a part file always has the digest of its own input)."""
        with self.filesystem.open_output_stream(self.path(f"{INPUT_DIGEST}{index:06d}")) as f:
            f.write(digest.encode())

    def input_digest(self, index: int) -> str | None:
        """The digest recorded for part ``index`` (``None``: none was recorded)."""
        try:
            with self.filesystem.open_input_stream(self.path(f"{INPUT_DIGEST}{index:06d}")) as f:
                return f.read().decode()
        except (FileNotFoundError, OSError):
            return None

    def clean_temporary(self) -> None:
        """Temporary files a crashed run left behind."""
        for name in self.listing():
            if name.startswith(".hn-tmp-"):
                self.remove(self.path(name))

    def unknown_files(self) -> list[str]:
        """Files here that a map did not write (``into=`` must not mix with other data)."""
        return [n for n in self.listing()
                if not (_PART.match(n) or n.startswith((".", "_")))]

    # -- manifest ----------------------------------------------------------------------
    def read_manifest(self) -> dict[str, Any] | None:
        try:
            with self.filesystem.open_input_stream(self.path(MANIFEST)) as f:
                return json.loads(f.read().decode())
        except (FileNotFoundError, OSError):
            return None

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        tmp = self.path(f".hn-manifest-{uuid.uuid4().hex[:12]}.json")
        with self.filesystem.open_output_stream(tmp) as f:
            f.write(json.dumps(manifest, indent=1, sort_keys=True).encode())
        self.filesystem.move(tmp, self.path(MANIFEST))

    # -- reading back ------------------------------------------------------------------
    def counts(self) -> Iterator[tuple[int, int]]:
        """``(rows, failed rows)`` of every part file, from the Parquet footers (a file
        written without statistics: from its error column)."""
        for path in self.part_files():
            yield self._count(path)

    def _count(self, path: str) -> tuple[int, int]:
        import pyarrow.parquet as pq

        with self.filesystem.open_input_file(path) as f:
            meta = pq.ParquetFile(f).metadata
        col, ok = meta.schema.names.index(ERROR_COLUMN), 0
        for g in range(meta.num_row_groups):
            stats = meta.row_group(g).column(col).statistics
            if stats is None or not stats.has_null_count:  # no statistics: read the column
                table = pq.read_table(path, columns=[ERROR_COLUMN], filesystem=self.filesystem)
                return table.num_rows, table.num_rows - table.column(0).null_count
            ok += stats.null_count
        return meta.num_rows, meta.num_rows - ok

    # -- visibility from other machines ------------------------------------------------
    def marker(self) -> str:
        """Create a marker file here; a worker that cannot see it cannot see the directory."""
        name = self.path(f".hn-visible-{uuid.uuid4().hex[:12]}")
        with self.filesystem.open_output_stream(name) as f:
            f.write(b"hypernodes")
        return name

    def sees(self, marker: str) -> bool:
        import pyarrow.fs as pafs

        return self.filesystem.get_file_info(marker).type == pafs.FileType.File

    def drop(self, marker: str) -> None:
        self.remove(marker)


def _spans(found: list[tuple[int, int, str]], path: Any) -> Committed:
    """``Committed`` from one part's range files ``(start, stop, name)``."""
    rows, covered, past, stale = 0, 0, [], []
    for start, stop, name in sorted(found):
        if start < covered:  # overlaps rows another file holds (not written by a map)
            stale.append(path(name))
            continue
        if start == rows:
            rows = stop
        else:
            past.append((start, stop))
        covered = stop
    return Committed(rows, False, tuple(past), tuple(stale))
