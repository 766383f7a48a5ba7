"""The sink protocols: where the results of a map go.

Two sides, because a dataset map writes where it computes:

- ``ResultSink`` lives in the driver: the engine hands it every report of a finished batch
  or part file (``accept``), in any order; ``result()`` builds what ``map`` returns. The
  dataset (``into=``) collector (``run.datasetrun.DatasetCollector``) implements it.
- ``PartWriter`` lives wherever a part is computed (the driver, a Dask worker, a Daft
  thread, a Ray task): it makes each file of a part's rows appear complete or not at all,
  and says which rows of each part are in files already. ``sinks.parquet.ParquetDataset``
  implements it; the part pipeline (``datasets.commit``) and ``PartTask`` take it as a
  ``PartWriter``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import pyarrow as pa

if TYPE_CHECKING:
    from hypernodes_dist.sinks.parquet import Committed

__all__ = ["ResultSink", "PartWriter"]


@runtime_checkable
class ResultSink(Protocol):
    """Driver side: receives reports as parts finish, builds the map's return value."""

    def accept(self, report: Any) -> None: ...
    def close(self) -> None: ...
    def result(self) -> Any: ...


@runtime_checkable
class PartWriter(Protocol):
    """Worker side: writes a part's rows so that readers see all of a file or none."""

    location: str

    def committed(self) -> dict[int, Committed]:
        """Per part with files: how many of its first rows they hold."""
        ...

    def write_part(self, index: int, table: pa.Table,
                   span: tuple[int, int] | None = None) -> str:
        """Write part ``index``'s rows (``span``: its rows ``start .. stop`` only)."""
        ...

    def remove(self, path: str) -> None: ...
    def write_input_digest(self, index: int, digest: str) -> None: ...
    def input_digest(self, index: int) -> str | None: ...
