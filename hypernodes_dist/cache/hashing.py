"""Canonical content hashing of values (code identity of functions: ``codeid``).

Every id is 32 lowercase hex chars of xxh3_128 and is identical in every process and on every
machine running the same Python minor version: builtin ``hash()`` is never used.

Value encoding (Merkle style): a scalar's digest is ``xxh3_128(tag + payload)``; a container's
digest is ``xxh3_128(tag + child digests)``, with set/frozenset children sorted by digest and
dict items sorted by the digest of their key (independent of insertion order and of
``PYTHONHASHSEED``). Tags make ``1``, ``"1"``, ``1.0``, ``True``, ``(1,)``, ``[1]``, ``b"1"``,
``set`` and ``frozenset`` distinct. Floats hash their IEEE bytes (so ``-0.0 != 0.0``); every NaN
hashes the same. numpy, pandas and pyarrow values hash by content and are detected lazily: this
module never imports them. Other objects are resolved per type, in this order:

1. ``__hypernodes_hash__(self) -> str | bytes`` if the type defines it;
2. enums, dataclasses, namedtuples, subclasses of builtins, datetime/date/time/timedelta,
   Decimal, UUID, paths, ranges, types, functions (by ``codeid.hash_code``);
3. plain objects (default pickling, with a ``__dict__``): type + canonical hash of ``vars()``;
4. fallback: ``cloudpickle.dumps(obj, protocol=5)`` (deterministic for plain objects within one
   Python version); if that fails, :class:`UnhashableValueError` naming the type.

Cycles through containers, dataclasses and plain objects hash as back-references.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import decimal
import enum
import functools
import pathlib
import struct
import sys
import types
import uuid
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from operator import add
from typing import Any

from xxhash import xxh3_128, xxh3_128_digest, xxh3_128_hexdigest

__all__ = ["UnhashableValueError", "combine", "hash_value", "node_key", "set_code_identity"]

_Enc = Callable[[Any, list], bytes]
_pack_d = struct.Struct("<d").pack
_pack_q = struct.Struct("<q").pack
_MAX_RESOLVED = 4096
# how a function value is identified: ``codeid.hash_code``, installed when ``codeid`` loads
# (the ``hypernodes_dist.cache`` package imports it first, so it is always there)
_CODE_IDENTITY: list[Callable[[Any], str]] = []


def set_code_identity(fn: Callable[[Any], str]) -> None:
    """Install the code identity used for function values (``codeid.hash_code``)."""
    _CODE_IDENTITY[:] = [fn]


class UnhashableValueError(TypeError):
    """No canonical hash exists for a value and the cloudpickle fallback failed."""


# --------------------------------------------------------------------------- scalars


def _int_payload(v: int) -> bytes:
    return b"i%x" % v  # hex formatting has no digit limit and is injective


def _float_payload(v: float) -> bytes:
    return b"f" + (_pack_d(v) if v == v else b"nan")


def _complex_payload(v: complex) -> bytes:
    return b"c" + _float_payload(v.real) + _float_payload(v.imag)


def _str_payload(v: str) -> bytes:
    try:
        return b"s" + v.encode()
    except UnicodeEncodeError:  # lone surrogates
        return b"s" + v.encode("utf-8", "surrogatepass")


# exact type -> payload bytes; digest = xxh3_128(payload)
_SCALARS: dict[type, Callable[[Any], bytes]] = {
    str: _str_payload,
    int: _int_payload,
    float: _float_payload,
    bool: lambda v: b"T" if v else b"F",
    type(None): lambda v: b"N",
    bytes: lambda v: b"b" + v,
    bytearray: lambda v: b"B" + bytes(v),
    complex: _complex_payload,
    type(...): lambda v: b"E",
    _dt.datetime: lambda v: b"Dt" + v.isoformat().encode(),
    _dt.date: lambda v: b"Dd" + v.isoformat().encode(),
    _dt.time: lambda v: b"Dh" + v.isoformat().encode(),
    _dt.timedelta: lambda v: b"Dl" + _pack_q(v.days) + _pack_q(v.seconds) + _pack_q(v.microseconds),
    decimal.Decimal: lambda v: b"M" + str(v).encode(),
    uuid.UUID: lambda v: b"U" + v.bytes,
    range: lambda v: b"R" + _int_payload(v.start) + _int_payload(v.stop) + _int_payload(v.step),
}


def hash_value(value: object) -> str:
    """Canonical content hash (32 hex chars of xxh3_128) of ``value``.

    Raises :class:`UnhashableValueError` when no canonical hash exists and pickling fails.
    """
    t = type(value)
    if t is str:
        try:
            return xxh3_128_hexdigest(b"s" + value.encode())  # type: ignore[attr-defined]  # type(value) is str, which mypy does not narrow on
        except UnicodeEncodeError:
            return xxh3_128_hexdigest(_str_payload(value))  # type: ignore[arg-type]  # type(value) is str, which mypy does not narrow on
    if t is int:
        return xxh3_128_hexdigest(b"i%x" % value)  # type: ignore[str-format]  # an int
    enc = _SCALARS.get(t)
    if enc is not None:
        return xxh3_128_hexdigest(enc(value))
    try:
        return _digest(value, []).hex()
    except RecursionError:
        raise UnhashableValueError(f"{_qualname(t)} is nested too deeply to hash") from None


def hash_column(values: Sequence[Any]) -> list[str]:
    """``hash_value`` of every value: a column of exact ``int`` or ``str`` values hashes at C
    speed (no Python call per value), anything else value by value."""
    kinds = set(map(type, values))
    if kinds == {int}:
        return list(map(xxh3_128_hexdigest, map(b"i%x".__mod__, values)))
    if kinds == {str}:
        try:
            return list(map(xxh3_128_hexdigest, map(b"s".__add__, map(str.encode, values))))
        except UnicodeEncodeError:  # lone surrogates: the per-value path handles them
            pass
    return list(map(hash_value, values))


def combine(*parts: str) -> str:
    """Order-sensitive hash of several ids (length-prefixed, so no two part lists collide)."""
    h = xxh3_128(b"C")
    for p in parts:
        b = p.encode("utf-8", "surrogatepass")
        h.update(b"%x:" % len(b))
        h.update(b)
    return h.hexdigest()


def node_key(
    code_id: str, arg_ids: Sequence[tuple[str, str]], scope_token: str | None = None
) -> str:
    """Cache key of one node execution.

    ``arg_ids`` are ``(parameter name, value id)`` pairs; their order does not matter (they are
    sorted by name). ``scope_token`` is the session id (scope ``"session"``), the run id (scope
    ``"run"``) or ``None`` (scope ``"global"``).
    """
    pairs = sorted(arg_ids)
    return key_from(key_prefix(code_id, [n for n, _ in pairs], scope_token), [v for _, v in pairs])


def chain_id(key: str, output: str) -> str:
    """Identity of output ``output`` of the node execution whose key is ``key``."""
    return xxh3_128_hexdigest(f"hn-out-v1|{key}|{output}".encode("utf-8", "surrogatepass"))


def chain_ids(keys: Iterable[str], output: str) -> list[str]:
    """``chain_id`` of many keys at once (C-level maps: no Python frame per key)."""
    texts = map(add, map(add, repeat("hn-out-v1|"), keys), repeat("|" + output))
    return list(map(xxh3_128_hexdigest, map(str.encode, texts, repeat("utf-8"),
                                            repeat("surrogatepass"))))


def keys_from(prefixes: str | Iterable[str], rows: Iterable[str]) -> list[str]:
    """``key_from`` of many items at once: ``rows`` are their value ids already joined with
    ``|``; ``prefixes`` is one ``key_prefix`` for all or one per item."""
    if isinstance(prefixes, str):
        texts = map(prefixes.__add__, rows)
    else:
        texts = map(add, prefixes, rows)
    return list(map(xxh3_128_hexdigest, map(str.encode, texts)))


def key_prefix(code_id: str, names: Sequence[str], scope_token: str | None = None) -> str:
    """The part of a node key fixed for one node and scope; ``names`` sorted by the caller."""
    token = f"S{len(scope_token)}:{scope_token}" if scope_token is not None else "G"
    return f"hn-node-v2|{code_id}|{token}|{len(names)}|{'|'.join(names)}|"


def key_from(prefix: str, value_ids: Sequence[str]) -> str:
    """A node key from its ``key_prefix`` and the value ids in the prefix's name order.

    Value ids are fixed-length hex digests, so joining them with ``|`` is unambiguous."""
    return xxh3_128_hexdigest("|".join(value_ids).join((prefix, "")).encode())


# --------------------------------------------------------------------------- containers


def _qualname(t: type) -> str:
    return f"{getattr(t, '__module__', '?')}.{getattr(t, '__qualname__', t.__name__)}"


def _digest(value: Any, stack: list) -> bytes:
    t = type(value)
    if t is str:
        try:
            return xxh3_128_digest(b"s" + value.encode())
        except UnicodeEncodeError:
            return xxh3_128_digest(_str_payload(value))
    if t is int:
        return xxh3_128_digest(b"i%x" % value)
    enc = _SCALARS.get(t)
    if enc is not None:
        return xxh3_128_digest(enc(value))
    fn = _RESOLVED.get(t)
    if fn is None:
        fn = _resolve(t)
        if len(_RESOLVED) < _MAX_RESOLVED:
            _RESOLVED[t] = fn
    return fn(value, stack)


def _cyclic(tag: bytes, children: Callable[[Any, list], bytes]) -> _Enc:
    """Wrap an encoder of a possibly self-referencing value with a back-reference guard."""

    def enc(value: Any, stack: list) -> bytes:
        vid = id(value)
        if vid in stack:
            return xxh3_128_digest(b"^" + b"%d" % (len(stack) - stack.index(vid)))
        stack.append(vid)
        try:
            return xxh3_128_digest(tag + children(value, stack))
        finally:
            stack.pop()

    return enc


def _seq(value: Any, stack: list) -> bytes:
    return b"".join([_digest(v, stack) for v in value])


def _unordered(value: Any, stack: list) -> bytes:
    return b"".join(sorted([_digest(v, stack) for v in value]))


def _mapping(value: Any, stack: list) -> bytes:
    return b"".join(sorted([_digest(k, stack) + _digest(v, stack) for k, v in value.items()]))


_RESOLVED: dict[type, _Enc] = {
    list: _cyclic(b"l", _seq),
    tuple: _cyclic(b"t", _seq),
    set: _cyclic(b"S", _unordered),
    frozenset: _cyclic(b"z", _unordered),
    dict: _cyclic(b"d", _mapping),
}


def _scalar_enc(payload: Callable[[Any], bytes]) -> _Enc:
    return lambda v, stack: xxh3_128_digest(payload(v))


def _with_type(t: type, base: _Enc) -> _Enc:
    name = _qualname(t).encode()
    return lambda v, stack: xxh3_128_digest(b"@" + name + b"\0" + base(v, stack))


def _custom(v: Any, stack: list) -> bytes:
    h = v.__hypernodes_hash__()
    if isinstance(h, str):
        h = h.encode("utf-8", "surrogatepass")
    if not isinstance(h, bytes):
        raise UnhashableValueError(
            f"{_qualname(type(v))}.__hypernodes_hash__ returned {type(h).__name__}, "
            "expected str or bytes"
        )
    return xxh3_128_digest(b"X" + _qualname(type(v)).encode() + b"\0" + h)


def _resolve(t: type) -> _Enc:
    """Find the encoder of a type that has no exact-type entry."""
    if hasattr(t, "__hypernodes_hash__"):
        return _custom
    for resolver in (_resolve_numpy, _resolve_pandas, _resolve_arrow):
        fn = resolver(t)
        if fn is not None:
            return fn
    name = _qualname(t).encode()
    if issubclass(t, enum.Enum):
        return lambda v, stack: xxh3_128_digest(b"e" + name + b"\0" + v.name.encode())
    if dataclasses.is_dataclass(t):
        return _cyclic(b"k" + name + b"\0", _dataclass_fields)
    if issubclass(t, tuple) and hasattr(t, "_fields"):
        return _cyclic(b"n" + name + b"\0", _seq)
    for base in _SCALARS:
        if issubclass(t, base):
            return _with_type(t, _scalar_enc(_SCALARS[base]))
    for base in (list, tuple, set, frozenset, dict):
        if issubclass(t, base):
            return _with_type(t, _RESOLVED[base])
    if issubclass(t, pathlib.PurePath):
        return lambda v, stack: xxh3_128_digest(b"p" + name + b"\0" + v.as_posix().encode())
    if issubclass(t, memoryview):
        return lambda v, stack: xxh3_128_digest(b"m" + v.tobytes())
    if issubclass(t, type):
        return lambda v, stack: xxh3_128_digest(b"y" + _qualname(v).encode())
    if _callable_type(t):
        return lambda v, stack: xxh3_128_digest(b"F" + bytes.fromhex(_CODE_IDENTITY[0](v)))
    if _plain_object_type(t):
        return _cyclic(b"o" + name + b"\0", lambda v, stack: _RESOLVED[dict](vars(v), stack))
    return _pickled


def _callable_type(t: type) -> bool:
    """True for function-like types, which hash by :func:`hash_code`."""
    return issubclass(t, (types.FunctionType, types.MethodType, functools.partial))


def _plain_object_type(t: type) -> bool:
    if t.__reduce_ex__ is not object.__reduce_ex__ or t.__reduce__ is not object.__reduce__:
        return False
    if getattr(t, "__getstate__", None) is not getattr(object, "__getstate__", None):
        return False
    if any("__slots__" in vars(c) for c in t.__mro__[:-1]):
        return False
    return "__dict__" in dir(t) and t.__flags__ & (1 << 9) != 0  # Py_TPFLAGS_HEAPTYPE


def _dataclass_fields(v: Any, stack: list) -> bytes:
    return b"".join(
        [_digest(f.name, stack) + _digest(getattr(v, f.name), stack) for f in dataclasses.fields(v)]
    )


def _pickled(v: Any, stack: list) -> bytes:
    import cloudpickle

    try:
        data = cloudpickle.dumps(v, protocol=5)
    except Exception as exc:  # noqa: BLE001 - any pickling failure means "unhashable"
        raise UnhashableValueError(
            f"cannot hash value of type {_qualname(type(v))}: it has no canonical hash, no "
            f"__hypernodes_hash__ and cannot be pickled ({type(exc).__name__}: {exc})"
        ) from exc
    return xxh3_128_digest(b"P" + data)


# --------------------------------------------------------------------------- numpy / pandas / arrow


def _resolve_numpy(t: type) -> _Enc | None:
    np = sys.modules.get("numpy")
    if np is None:
        return None
    if issubclass(t, np.ndarray):
        return _np_array
    if issubclass(t, np.generic):
        return lambda v, stack: _np_array(np.asarray(v), stack, b"ng")
    return None


def _np_array(a: Any, stack: list, tag: bytes = b"na") -> bytes:
    import numpy as np

    dtype = a.dtype
    dt = str(dtype.descr) if dtype.fields is not None else dtype.str
    h = xxh3_128(tag + dt.encode() + b"|" + repr(a.shape).encode() + b"|")
    if dtype.hasobject:
        h.update(_digest(a.tolist(), stack))
    else:
        flat = np.ascontiguousarray(a).reshape(-1)
        h.update(flat.view(np.uint8).data)
    return h.digest()


def _resolve_pandas(t: type) -> _Enc | None:
    pd = sys.modules.get("pandas")
    if pd is None:
        return None
    if issubclass(t, pd.DataFrame):
        return _pd_frame
    if issubclass(t, pd.Series):
        return lambda v, stack: _pd_content(b"pS", v, stack, [v.name, str(v.dtype)])
    if issubclass(t, pd.Index):
        return lambda v, stack: _pd_content(b"pI", v, stack, [list(v.names), str(v.dtype)])
    return None


def _pd_frame(df: Any, stack: list) -> bytes:
    meta = [
        list(df.columns),
        list(df.columns.names),
        [str(d) for d in df.dtypes],
        list(df.index.names),
        str(df.index.dtype),
    ]
    return _pd_content(b"pF", df, stack, meta)


def _pd_content(tag: bytes, obj: Any, stack: list, meta: list) -> bytes:
    import pandas as pd

    h = xxh3_128(tag + _digest(meta, stack) + repr(obj.shape).encode())
    try:
        kwargs = {} if isinstance(obj, pd.Index) else {"index": True}
        rows = pd.util.hash_pandas_object(obj, **kwargs).to_numpy()
        h.update(rows.tobytes())
    except TypeError:  # unhashable cells (lists, dicts): hash them one by one
        if isinstance(obj, pd.DataFrame):
            cells: Any = [obj.index.tolist(), [obj[c].tolist() for c in obj.columns]]
        elif isinstance(obj, pd.Series):
            cells = [obj.index.tolist(), obj.tolist()]
        else:
            cells = obj.tolist()
        h.update(_digest(cells, stack))
    return h.digest()


def _resolve_arrow(t: type) -> _Enc | None:
    pa = sys.modules.get("pyarrow")
    if pa is None:
        return None
    kinds = (
        (pa.Table, b"aT"),
        (pa.RecordBatch, b"aB"),
        (pa.ChunkedArray, b"aC"),
        (pa.Array, b"aA"),
    )
    for cls, tag in kinds:
        if issubclass(t, cls):
            return _arrow_enc(tag)
    return None


def _arrow_enc(tag: bytes) -> _Enc:
    return lambda v, stack: _arrow(v, tag)


def _arrow(obj: Any, tag: bytes) -> bytes:
    """Hash the IPC stream bytes of ``obj`` as one contiguous batch (chunking does not matter)."""
    import pyarrow as pa

    if tag == b"aA":
        table = pa.table({"v": obj})
    elif tag == b"aC":
        table = pa.table({"v": obj})
    elif tag == b"aB":
        table = pa.Table.from_batches([obj])
    else:
        table = obj
    table = table.combine_chunks()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        if table.num_rows:
            writer.write_table(table)
    h = xxh3_128(tag)
    h.update(memoryview(sink.getvalue()))
    return h.digest()
