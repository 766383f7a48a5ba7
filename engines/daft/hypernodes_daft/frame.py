"""Map items as a Daft DataFrame: a row-id column plus one column per mapped input.

A column is stored Arrow-native only when the round trip is lossless (every value has the
same exact type among ``int``/``float``/``str``/``bytes``/``bool``, ``None`` allowed);
anything else (tuples, dicts, user objects, mixed types) is a ``DataType.python()``
column, so a node receives exactly the object it would receive on the local engine and the
cache keys (which are type-tagged) stay identical.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import daft
import pyarrow as pa
from daft import DataType, Series

__all__ = ["ROW", "item_frame", "column_name"]

ROW = "__hn_row"

_ARROW = {
    int: pa.int64(),
    float: pa.float64(),
    str: pa.large_string(),
    bytes: pa.large_binary(),
    bool: pa.bool_(),
}


def column_name(i: int) -> str:
    """Frame column of the ``i``-th mapped input (input names may clash with Daft's own)."""
    return f"__hn_in{i}"


def item_frame(columns: Mapping[str, Sequence[Any]], n: int) -> daft.DataFrame:
    """The DataFrame of one map: ``ROW`` (0..n-1) then the mapped inputs, in ``columns`` order."""
    data: dict[str, Any] = {ROW: Series.from_arrow(_row_ids(n), ROW)}
    for i, values in enumerate(columns.values()):
        name = column_name(i)
        data[name] = _series(name, list(values))
    return daft.from_pydict(data)


def _row_ids(n: int) -> pa.Array:
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - pyarrow without numpy
        return pa.array(range(n), pa.int64())
    return pa.array(np.arange(n, dtype=np.int64))


def _series(name: str, values: list[Any]) -> Series:
    kinds = set(map(type, values))
    kinds.discard(type(None))
    if len(kinds) == 1:
        arrow_type = _ARROW.get(kinds.pop())
        if arrow_type is not None:
            try:
                return Series.from_arrow(pa.array(values, arrow_type), name)
            except (OverflowError, pa.ArrowException):
                pass  # e.g. an int beyond int64: keep the Python object
    return Series.from_pylist(values, name, dtype=DataType.python())
