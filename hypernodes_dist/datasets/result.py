"""``DatasetResult``: what ``map(..., into=...)`` returns -- a handle on the written dataset.

Nothing here holds the rows: ``rows`` and ``failed`` come from the Parquet footers,
``errors`` reads only the failed rows' ``_hn_row`` and ``_hn_error``, and ``to_arrow`` /
``to_pandas`` / ``dataset`` read the directory when asked. The counts are ``MapResult``'s:
``rows``, ``failed``, ``unfinished``, ``resumed``, ``pending``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from hypernodes_dist.datasets.manifest import schema_of
from hypernodes_dist.results import Failure
from hypernodes_dist.sinks.arrow_types import decode_table
from hypernodes_dist.sinks.parquet import ERROR_COLUMN, ROW_COLUMN, ParquetDataset

if TYPE_CHECKING:
    import pandas
    import pyarrow.dataset

__all__ = ["DatasetResult"]

_NODE = re.compile(r"^node '((?:[^']|'(?!: ))*)': (.*)$", re.DOTALL)


class DatasetResult:
    """The output of a dataset map: ``path``, the counts, ``errors`` and readers."""

    def __init__(self, out: ParquetDataset, session_id: str = "",
                 usage: dict[str, dict[str, float]] | None = None,
                 total: int | None = None, resumed: int = 0) -> None:
        self._out = out
        self.session_id = session_id
        self.usage: dict[str, dict[str, float]] = usage or {}
        """Per node, what this run's calls metered, plus ``calls`` (like ``MapResult.usage``;
        rows already in files from an earlier run count nothing)."""
        rows = failed = 0
        for n, bad in out.counts():
            rows += n
            failed += bad
        self.rows: int = rows
        self.unfinished: int = max(0, total - rows) if total is not None else 0
        """Source rows with no output row: the ones a ``budget`` stopped (rerun to finish)."""
        self.failed: int = failed
        """Rows in files whose ``_hn_error`` is set (a budget-refused row is ``unfinished``)."""
        self.resumed: int = resumed
        """Rows an earlier run had written here already (this run did not compute them)."""
        self.pending: int = 0
        """Rows still waiting for a provider batch (``batch_api``): 0 until then."""
        self._errors: pa.Table | None = None
        manifest = out.read_manifest()
        self._schema = schema_of(manifest) if manifest else None

    @property
    def path(self) -> str:
        """The ``into=`` directory, as given."""
        return self._out.location

    def dataset(self) -> pyarrow.dataset.Dataset:
        """The output files as a ``pyarrow.dataset.Dataset`` (in ``_hn_row`` order), read
        with the map's output schema (the same column types whichever engine wrote them)."""
        import pyarrow.dataset as ds

        return ds.dataset(self._out.part_files(), filesystem=self._out.filesystem,
                          format="parquet", schema=self._schema)

    def to_arrow(self) -> pa.Table:
        """Every output row (pickled columns stay binary; see ``to_pandas``)."""
        return self.dataset().to_table()

    def to_pandas(self) -> pandas.DataFrame:
        """Every output row; columns stored pickled come back as the Python objects."""
        return decode_table(self.to_arrow())

    @property
    def errors(self) -> pa.Table:
        """The failed rows: ``_hn_row`` (int64), ``node`` and ``error`` (strings)."""
        if self._errors is None:
            self._errors = self._read_errors()
        return self._errors

    @property
    def failures(self) -> list[Failure]:
        """The failed rows one by one, as ``MapResult.failures``: ``.row``, ``.node``,
        ``.error`` (the error's text, ``Type: message``)."""
        errors = self.errors
        return [Failure(*values) for values in zip(*(errors.column(i).to_pylist()
                                                       for i in range(3)))]

    def _read_errors(self) -> pa.Table:
        import pyarrow.dataset as ds

        rows: list[int] = []
        nodes: list[str | None] = []
        texts: list[str] = []
        if self.failed:
            table = self.dataset().to_table(columns=[ROW_COLUMN, ERROR_COLUMN],
                                            filter=ds.field(ERROR_COLUMN).is_valid())
            for row, text in zip(table.column(0).to_pylist(), table.column(1).to_pylist()):
                m = _NODE.match(text)
                rows.append(row)
                nodes.append(m.group(1) if m else None)
                texts.append(m.group(2) if m else text)
        return pa.table({ROW_COLUMN: pa.array(rows, pa.int64()),
                         "node": pa.array(nodes, pa.string()),
                         "error": pa.array(texts, pa.string())})

    def __len__(self) -> int:
        return self.rows

    def __repr__(self) -> str:
        return (f"DatasetResult(path={self.path!r}, rows={self.rows}, failed={self.failed}, "
                f"unfinished={self.unfinished}, resumed={self.resumed}, pending={self.pending})")

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, DatasetResult) and other.path == self.path

    __hash__ = None  # type: ignore[assignment]  # unhashable (compares by value); mypy wants a method
