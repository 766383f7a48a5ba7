"""One call of a batch node (``@node(batch_size=N)``): lists in, one value per item out.

The lowest layer of batch nodes (``batching.py`` fills calls for the executors): which
parameters a call receives as lists (``batched``; the others, ``scalars=`` and the inputs
its resources read, one value per call), which items may share a call (``split``,
``Scalars``: the same values of those), the call's arguments, the check of what
it returned (``unpack``: ``BatchLengthError``), one error per item of a failed call
(``each_item``) and the one-item call of ``run()``/``iter()`` (``call_single``, which
``invoke.call_node`` hands batch nodes to).
"""

from __future__ import annotations

import copy
import inspect
import weakref
from collections.abc import Sequence
from typing import Any

from hypernodes_dist.errors import BatchLengthError
from hypernodes_dist.nodes import HyperNode

__all__ = ["BatchLengthError", "batched", "split", "Scalars", "scalar_values", "call_kwargs",
           "invoke", "unpack", "each_item", "call_single"]


_BATCHED: weakref.WeakKeyDictionary[HyperNode, tuple[bool, ...]] = weakref.WeakKeyDictionary()


def batched(node: HyperNode) -> tuple[bool, ...]:
    """Per parameter of ``node``: whether a call receives it as a list of its items'
    values. Its ``scalars`` are passed once per call, not as lists; so are the inputs its
    resources read (parameters its own function does not take: resources are not
    parameters of a bound node)."""
    found = _BATCHED.get(node)
    if found is None:
        own = node.params
        if node.resources and node.code is not None:
            try:
                own = tuple(inspect.signature(node.code).parameters)
            except (TypeError, ValueError):
                pass
        found = _BATCHED[node] = tuple(p in own and p not in node.resources
                                       and p not in node.scalars for p in node.params)
    return found


# ----------------------------------------------------------------------------- scalars


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # an array's ``==`` is elementwise
        return False


class Scalars:
    """Groups keyed by a tuple of scalar values: by hash when hashable, else by ``==``."""

    def __init__(self) -> None:
        self.hashed: dict[tuple[Any, ...], Any] = {}
        self.other: list[tuple[tuple[Any, ...], Any]] = []

    def get(self, values: tuple[Any, ...]) -> Any:
        try:
            return self.hashed.get(values)
        except TypeError:
            return next((g for v, g in self.other
                         if all(map(_same, v, values))), None)

    def put(self, values: tuple[Any, ...], group: Any) -> None:
        try:
            self.hashed[values] = group
        except TypeError:
            self.other.append((values, group))

    def remove(self, group: Any) -> None:
        for values, found in list(self.hashed.items()):
            if found is group:
                del self.hashed[values]
        self.other = [(v, g) for v, g in self.other if g is not group]


def scalar_values(node: HyperNode, kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """One item's values of the parameters a call of ``node`` takes once."""
    return tuple(kwargs[p] for p, is_list in zip(node.params, batched(node)) if not is_list)


def split(node: HyperNode, columns: Sequence[Sequence[Any]], positions: Sequence[int]
          ) -> list[Sequence[int]]:
    """``positions`` (into ``columns``, one per parameter) cut into calls of at most
    ``batch_size`` items in item order; items whose values of a parameter passed once per
    call differ go to different calls (calls ordered by their first item)."""
    size = node.batch_size or 1
    fixed = [col for col, is_list in zip(columns, batched(node)) if not is_list]
    groups: list[Sequence[int]] = [positions]
    if fixed and positions and not all(
            all(_same(col[k], col[positions[0]]) for k in positions) for col in fixed):
        found = Scalars()
        groups = []
        for k in positions:
            values = tuple(col[k] for col in fixed)
            group = found.get(values)
            if group is None:
                group = []
                found.put(values, group)
                groups.append(group)
            group.append(k)
    return [g[k:k + size] for g in groups for k in range(0, len(g), size)]


# ----------------------------------------------------------------------------- one call


def call_kwargs(node: HyperNode, columns: Sequence[list[Any]]) -> dict[str, Any]:
    """The call's keyword arguments from one list per parameter (in ``node.params`` order)."""
    return {p: col if is_list else col[0]
            for p, col, is_list in zip(node.params, columns, batched(node))}


async def invoke(node: HyperNode, kwargs: dict[str, Any]) -> Any:
    """What one call of ``node`` returns (awaited when it is async)."""
    result = node.func(**kwargs)  # type: ignore[misc]  # a called node has a func (only interrupts have none)
    if inspect.isawaitable(result):
        result = await result
    return result


def _as_list(value: Any) -> list[Any] | None:
    if isinstance(value, list):
        return value
    if isinstance(value, tuple):
        return list(value)
    for convert in ("to_pylist", "tolist"):  # Arrow arrays, NumPy arrays
        method = getattr(value, convert, None)
        if callable(method):
            out = method()
            return out if isinstance(out, list) else None
    return None


def _length_error(node: HyperNode, n: int, got: Any, what: str = "") -> BatchLengthError:
    shape = (f"{len(got)} value{'s' if len(got) != 1 else ''}" if isinstance(got, list)
             else f"a value of type {type(got).__name__}")
    return BatchLengthError(
        f"batch node {node.name!r} was called with {n} item{'s' if n != 1 else ''} and "
        f"returned {shape}{what}; a batch node returns one value per item, in item order "
        "(a list, or a tuple of lists for several outputs)")


def unpack(node: HyperNode, value: Any, n: int) -> list[Any]:
    """A call's return as one value per item (a tuple per item for several outputs)."""
    outputs = node.outputs
    if not outputs and value is None:
        return [None] * n
    if len(outputs) <= 1:
        values = _as_list(value)
        if values is None or len(values) != n:
            raise _length_error(node, n, values if values is not None else value)
        return values
    if not isinstance(value, (tuple, list)) or len(value) != len(outputs):
        raise BatchLengthError(
            f"batch node {node.name!r} declares outputs {outputs}: return a tuple of "
            f"{len(outputs)} lists of one value per item, got {type(value).__name__}")
    columns = []
    for name, col in zip(outputs, value):
        values = _as_list(col)
        if values is None or len(values) != n:
            raise _length_error(node, n, values if values is not None else col,
                                f" for output {name!r}")
        columns.append(values)
    return [next((v for v in row if isinstance(v, Exception)), row) for row in zip(*columns)]


def each_item(exc: Exception, n: int) -> list[Exception]:
    """The error of a failed call, once per item: copies, so each item's notes name it."""
    out: list[Exception] = [exc]
    for _ in range(n - 1):
        try:
            twin = copy.copy(exc)
            twin.__notes__ = list(getattr(exc, "__notes__", []))
            twin.__cause__, twin.__traceback__ = exc.__cause__, exc.__traceback__
        except Exception:
            twin = exc
        out.append(twin)
    return out


async def call_single(node: HyperNode, kwargs: dict[str, Any]) -> Any:
    """One item's value: the call takes one-item lists (``run()``, the scheduler)."""
    columns = [[kwargs[p]] for p in node.params]
    (value,) = unpack(node, await invoke(node, call_kwargs(node, columns)), 1)
    if isinstance(value, Exception):
        raise value
    return value
