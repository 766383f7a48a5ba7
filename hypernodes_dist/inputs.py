"""Checking and expanding the inputs of ``run`` and ``map``; every error names the parameters."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any

from hypernodes_dist.errors import GraphInputError
from hypernodes_dist.plan import Plan

__all__ = ["check_inputs", "expand", "frame_kind", "check_select", "check_on_error", "new_session_id", "new_run_id"]


def new_session_id() -> str:
    import uuid

    return f"sess_{uuid.uuid4().hex[:12]}"


def new_run_id() -> str:
    import uuid

    return f"run_{uuid.uuid4().hex[:12]}"


def check_inputs(plan: Plan, inputs: Mapping[str, Any], allowed: Iterable[str] = ()) -> None:
    """Reject unknown inputs, produced names given as inputs, and missing required inputs."""
    if not isinstance(inputs, Mapping):
        raise TypeError(f"inputs must be a dict of parameter name -> value, got {type(inputs).__name__}")
    allowed = set(allowed)
    resources = sorted(k for k in inputs if k in plan.resources)
    if resources:
        raise GraphInputError(
            f"{', '.join(map(repr, resources))}: a resource (@resource) is built in each "
            "worker process, never given in inputs; remove it from inputs", resources)
    produced = sorted(k for k in inputs if k in plan.producers and k not in allowed)
    if produced:
        detail = "; ".join(f"{k!r} is produced by {', '.join(plan.producers[k])}" for k in produced)
        raise GraphInputError(
            f"produced values cannot be given as inputs: {detail}", produced
        )
    unknown = sorted(k for k in inputs if k not in plan.inputs and k not in plan.producers)
    if unknown:
        raise GraphInputError(
            f"unknown input(s) {', '.join(map(repr, unknown))}; the graph's inputs are "
            f"{', '.join(plan.inputs) or 'none'}",
            unknown,
        )
    missing = [p for p in plan.required if p not in inputs]
    if missing:
        raise GraphInputError(
            f"missing required input(s): {', '.join(map(repr, missing))}", missing
        )


def check_select(plan: Plan, select: Iterable[str] | None) -> tuple[str, ...] | None:
    if select is None:
        return None
    names = (select,) if isinstance(select, str) else tuple(select)
    unknown = [s for s in names if s not in plan.outputs]
    if unknown:
        raise GraphInputError(
            f"select names {', '.join(map(repr, unknown))}, which no node produces; outputs are "
            f"{', '.join(plan.outputs) or 'none'}",
            unknown,
        )
    return names


def check_on_error(on_error: str) -> str:
    if on_error not in ("raise", "collect"):
        raise ValueError(f"on_error must be 'raise' or 'collect', got {on_error!r}")
    return on_error


def expand(
    plan: Plan, inputs: Mapping[str, Any], map_over: str | Iterable[str], map_mode: str
) -> tuple[dict[str, list[Any]], dict[str, Any], int]:
    """Mapped columns, broadcast inputs and the item count of a ``map`` call."""
    if not isinstance(inputs, Mapping):
        raise TypeError(f"inputs must be a dict of parameter name -> value, got {type(inputs).__name__}")
    names = [map_over] if isinstance(map_over, str) else list(map_over)
    if not names:
        raise GraphInputError("map_over names no parameter", [])
    if len(set(names)) != len(names):
        raise GraphInputError(f"map_over repeats a name: {names}", names)
    if map_mode not in ("zip", "product"):
        raise ValueError(f"map_mode must be 'zip' or 'product', got {map_mode!r}")
    not_given = [p for p in names if p not in inputs]
    if not_given:
        raise GraphInputError(
            f"map_over names {', '.join(map(repr, not_given))}, which are not in inputs", not_given
        )
    check_inputs(plan, inputs)
    lists = {p: _as_list(p, inputs[p]) for p in names}
    broadcast = {k: v for k, v in inputs.items() if k not in lists}
    if map_mode == "zip":
        lengths = {p: len(v) for p, v in lists.items()}
        if len(set(lengths.values())) > 1:
            detail = ", ".join(f"{p!r} has {n}" for p, n in lengths.items())
            raise GraphInputError(
                f"map_mode='zip' needs equally long lists: {detail}", list(lengths)
            )
        return lists, broadcast, next(iter(lengths.values()))
    rows = list(itertools.product(*lists.values()))
    columns = {p: [r[j] for r in rows] for j, p in enumerate(lists)}
    return columns, broadcast, len(rows)


_FRAMES = {
    "pyarrow": ("Table", "RecordBatch", "RecordBatchReader", "Dataset", "FileSystemDataset",
                "InMemoryDataset", "UnionDataset"),
    "pandas": ("DataFrame",),
    "dask": ("DataFrame",),
    "daft": ("DataFrame",),
}


def frame_kind(value: Any) -> str | None:
    """``"pandas.DataFrame"`` etc. when ``value`` is a table (a source, not a list of
    values); ``None`` otherwise. Checks names only: imports none of these libraries."""
    cls = type(value)
    top = (cls.__module__ or "").split(".")[0]
    if cls.__name__ in _FRAMES.get(top, ()):
        return f"{top}.{cls.__name__}"
    return None


def _as_list(name: str, value: Any) -> list[Any]:
    if isinstance(value, list):
        return value
    kind = frame_kind(value)
    if kind is not None:
        raise TypeError(
            f"map_over input {name!r} is a {kind}: a table is not a list of values (it would "
            f"map over its column names). Map over its rows with graph.map(source=<the "
            f"table>, columns={{{name!r}: '<column>'}}, ...), or pass one column as a list"
        )
    if isinstance(value, (str, bytes, bytearray, Mapping)) or value is None:
        raise GraphInputError(
            f"map_over parameter {name!r} must be a list-like sequence of values, got "
            f"{type(value).__name__}",
            [name],
        )
    to_pylist = getattr(value, "to_pylist", None)  # pyarrow arrays
    if callable(to_pylist):
        return to_pylist()
    tolist = getattr(value, "tolist", None)  # numpy arrays, pandas Series
    if callable(tolist) and hasattr(value, "dtype"):
        return tolist()
    if hasattr(value, "__len__") and hasattr(value, "__getitem__") or hasattr(value, "__iter__"):
        return list(value)
    raise GraphInputError(
        f"map_over parameter {name!r} must be a list-like sequence of values, got "
        f"{type(value).__name__}",
        [name],
    )
