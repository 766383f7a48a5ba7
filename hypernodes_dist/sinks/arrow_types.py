"""Output typing for dataset maps: Python values -> Arrow columns, losslessly.

A column gets a real Arrow type when Arrow represents its values exactly (``str``,
``int``, ``float``, ``bool``, ``bytes``, lists of those, dicts with consistent ``str`` keys
as structs, dates and times): the type comes from the producing node's return annotation
when it names one (``-> str``, ``-> list[float]``, ``-> int | None``), else from the first
items of the map (a strict round trip: ``1`` and ``1.0`` differ, a tuple is not a list).
Anything else (``-> object``/``Any``, user classes, mixed types, no non-null value seen) is
stored as pickled binary, marked in the field metadata, and ``decode_table`` /
``DatasetResult.to_pandas()`` give the Python objects back.
"""

from __future__ import annotations

import pickle
import types
import typing
from collections.abc import Sequence
from typing import Any

import cloudpickle
import pyarrow as pa

__all__ = ["PICKLE", "ENCODING", "annotation_type", "infer_type", "field_for", "to_array",
           "is_pickled", "decode_column", "decode_table", "ValueTypeError", "stored_schema"]

ENCODING = b"hypernodes.encoding"
PICKLE = b"pickle"

_SCALARS: dict[Any, pa.DataType] = {
    str: pa.string(),
    int: pa.int64(),
    float: pa.float64(),
    bool: pa.bool_(),
    bytes: pa.binary(),
}


class ValueTypeError(TypeError):
    """A value that does not fit its output column's Arrow type."""


def annotation_type(annotation: Any) -> pa.DataType | None | bool:
    """Arrow type named by a return annotation; ``False`` for "store pickled"
    (``object``/``Any``); ``None`` when the annotation does not decide."""
    if annotation is object or annotation is Any:
        return False
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return annotation_type(rest[0]) if len(rest) == 1 else None
    if origin is list and len(args) == 1:
        inner = annotation_type(args[0])
        return pa.list_(inner) if isinstance(inner, pa.DataType) else None
    return None


def infer_type(values: Sequence[Any]) -> pa.DataType | None:
    """The Arrow type that holds ``values`` exactly, or ``None`` (store pickled)."""
    sample = [v for v in values if v is not None]
    if not sample:
        return None
    kinds = {type(v) for v in sample}
    if len(kinds) == 1 and next(iter(kinds)) in _SCALARS:
        typ = _SCALARS[next(iter(kinds))]
        try:
            pa.array(sample, typ)
        except (pa.ArrowException, OverflowError):
            return None
        return typ
    try:
        arr = pa.array(sample)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        return None
    if _has_null_type(arr.type) or not _same(arr.to_pylist(), sample):
        return None
    return arr.type


def _has_null_type(t: pa.DataType) -> bool:
    if pa.types.is_null(t):
        return True
    return any(_has_null_type(t.field(i).type) for i in range(t.num_fields))


def _same(a: Any, b: Any) -> bool:
    """Strict equality: the same types all the way down (``1 != 1.0``, tuple != list)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    return a == b or (a != a and b != b)  # NaN equals NaN here


def field_for(name: str, typ: pa.DataType | None) -> pa.Field:
    """The output field: ``typ``, or pickled binary marked in the metadata."""
    if typ is None:
        return pa.field(name, pa.binary(), metadata={ENCODING: PICKLE})
    return pa.field(name, typ)


def is_pickled(field: pa.Field) -> bool:
    return bool(field.metadata) and field.metadata.get(ENCODING) == PICKLE


def to_array(field: pa.Field, values: Sequence[Any]) -> pa.Array:
    """``values`` as an array of ``field``'s type; ``ValueTypeError`` when some do not fit."""
    if is_pickled(field):
        dumps = cloudpickle.dumps
        return pa.array([None if v is None else dumps(v) for v in values], pa.binary())
    try:
        return pa.array(values, field.type)
    except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
        raise ValueTypeError(str(exc)) from exc


def misfits(field: pa.Field, values: Sequence[Any]) -> list[int]:
    """Positions of the values that do not fit ``field`` (the slow path after a failure)."""
    bad = []
    for i, v in enumerate(values):
        try:
            pa.array([v], field.type)
        except (pa.ArrowException, OverflowError, TypeError, ValueError):
            bad.append(i)
    return bad


def decode_column(field: pa.Field, column: pa.ChunkedArray | pa.Array) -> list[Any]:
    """A column's Python values (pickled columns unpickled)."""
    if is_pickled(field):
        return [None if v is None else pickle.loads(v) for v in column.to_pylist()]
    return column.to_pylist()


def decode_table(table: pa.Table) -> Any:
    """``table.to_pandas()`` with pickled columns turned back into Python objects."""
    import pandas as pd

    frame = table.to_pandas()
    for field in table.schema:
        if is_pickled(field):
            frame[field.name] = pd.Series(
                decode_column(field, table.column(field.name)), index=frame.index, dtype=object)
    return frame


def stored_schema(schema: pa.Schema) -> pa.Schema:
    """The schema a part file is written with, the same on every engine: Daft's writer stores
    strings, binaries and lists as their large variants (``_hn_usage`` as
    ``map<large_string, double>``) and every field as nullable, so every other writer casts
    to that too. Readers (``DatasetResult.dataset()``) read back the map's output schema."""
    return pa.schema([pa.field(f.name, _stored(f.type), True, f.metadata) for f in schema],
                     metadata=schema.metadata)


def _stored(t: pa.DataType) -> pa.DataType:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pa.large_string()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return pa.large_binary()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.large_list(pa.field("item", _stored(t.value_type), True))
    if pa.types.is_map(t):
        return pa.map_(_stored(t.key_type), _stored(t.item_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _stored(f.type), True, f.metadata) for f in t])
    return t
