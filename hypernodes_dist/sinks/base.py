"""The sink protocols: where the results of a map go.

Two sides, because a dataset map writes where it computes:

- ``ResultSink`` lives in the driver: the engine hands it every report of a finished batch
  or part (``accept``), in any order; ``result()`` builds what ``map`` returns. The
  in-memory ``MapResult`` assembly and the dataset (``into=``) progress/error counting are
  the two implementations.
- ``PartWriter`` lives wherever a part is computed (the driver, a Dask worker, a Daft
  thread): it makes one part's output appear complete or not at all.
"""

from __future__ import annotations

from typing import Any, Protocol

import pyarrow as pa

__all__ = ["ResultSink", "PartWriter"]


class ResultSink(Protocol):
    """Driver side: receives reports as parts finish, builds the map's return value."""

    def accept(self, report: Any) -> None: ...
    def close(self) -> None: ...
    def result(self) -> Any: ...


class PartWriter(Protocol):
    """Worker side: writes one part's rows so that readers see all of them or none."""

    def finished(self) -> set[int]: ...
    def write_part(self, index: int, table: pa.Table) -> str: ...
