"""The output schema of a dataset map, fixed before any part runs.

Columns, in order: the ``keep`` columns (their source types), the selected outputs, then
``_hn_row`` (int64) and ``_hn_error`` (string). An output's type comes from its node's
return annotation when that decides it, else from running the map's first ``PROBE_ROWS``
items in the driver (through the shared executor and cache): those rows' results come back
as a ``Head``, written as the first rows of part 0, so no row is computed twice; see
``sinks.arrow_types`` for the rules.
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from hypernodes_dist.datasets.source import Source
from hypernodes_dist.execution.batch import execute_batch
from hypernodes_dist.execution.job import BatchResult, BatchSettings, Chunk
from hypernodes_dist.missing import MISSING
from hypernodes_dist.plan import Plan
from hypernodes_dist.sinks.arrow_types import annotation_type, field_for, infer_type
from hypernodes_dist.sinks.parquet import ERROR_COLUMN, ROW_COLUMN, USAGE_COLUMN, USAGE_TYPE

__all__ = ["output_schema", "Head", "PROBE_ROWS"]

PROBE_ROWS = 50


@dataclass
class Head:
    """The source's first ``n`` rows (``data``: mapped and kept columns as lists) and
    their results (``batch``, the map's settings), computed to fix the output types."""

    data: dict[str, list[Any]]
    batch: BatchResult
    n: int


def output_schema(plan: Plan, source: Source, mapping: dict[str, str], keep: Sequence[str],
                  outputs: Sequence[str], broadcast: dict[str, Any], settings: BatchSettings,
                  max_rows: int = PROBE_ROWS) -> tuple[pa.Schema, Head | None]:
    """The schema, and the rows run to decide it (at most ``max_rows``; ``None`` when
    the annotations decided every output)."""
    known = source.fields()
    decided: dict[str, pa.DataType | None] = {}
    for name in outputs:
        typ = _annotated(plan, name)
        if typ is not None:
            decided[name] = typ or None  # False: pickled
    probe_keep = [k for k in keep if k not in known]
    undecided = [o for o in outputs if o not in decided]
    head = None
    if undecided or probe_keep:
        cols = list(dict.fromkeys([*mapping.values(), *keep]))
        rows = source.head(min(PROBE_ROWS, max_rows), cols)
        for k in probe_keep:
            decided[k] = infer_type(rows[k])
        if undecided:
            head = _probe(plan, rows, mapping, broadcast, settings)
            if head is not None:
                decided.update({o: _infer(head.batch, o) for o in undecided})
            else:
                decided.update(dict.fromkeys(undecided))
    fields = [known[k] if k in known else field_for(k, decided[k]) for k in keep]
    fields += [field_for(o, decided[o]) for o in outputs]
    fields += [pa.field(ROW_COLUMN, pa.int64(), nullable=False),
               pa.field(ERROR_COLUMN, pa.string())]
    if any(node.meters for node in plan.nodes):  # what each row cost, beside its outputs
        fields.append(pa.field(USAGE_COLUMN, USAGE_TYPE))
    return pa.schema(fields), head


def _annotated(plan: Plan, output: str) -> pa.DataType | bool | None:
    """The Arrow type the producers' return annotations give ``output`` (all must agree)."""
    found: list[Any] = []
    for name in plan.producers.get(output, ()):
        node = plan.by_name[name]
        ann = _return_annotation(node.func)
        if ann is None:
            return None
        if len(node.outputs) > 1:
            args = typing.get_args(ann)
            if typing.get_origin(ann) is not tuple or len(args) != len(node.outputs):
                return None
            ann = args[node.outputs.index(output)]
        if node.batch_size is not None:  # list[T]: one T per item
            ann = _item_annotation(ann)
            if ann is None:
                return None
        found.append(annotation_type(ann))
    if not found or any(f is None for f in found) or any(f != found[0] for f in found):
        return None
    return found[0]


def _item_annotation(ann: Any) -> Any:
    """A batch node's return annotation ``list[T]`` (or ``Sequence[T]``) -> ``T``; ``None``
    when it does not say (the probe decides)."""
    args = typing.get_args(ann)
    if typing.get_origin(ann) in (list, Sequence) and len(args) == 1:
        return args[0]
    return None


def _return_annotation(func: Any) -> Any:
    if func is None:
        return None
    try:
        hints = typing.get_type_hints(func)
    except Exception:  # unresolvable forward references: the probe decides
        return None
    return hints.get("return")


def _probe(plan: Plan, rows: dict[str, list[Any]], mapping: dict[str, str],
           broadcast: dict[str, Any], settings: BatchSettings) -> Head | None:
    """The first rows through the plan, with the map's own settings (every selected
    output, its ``on_error``, events): these results are the rows' results."""
    n = min((len(v) for v in rows.values()), default=0)
    if n == 0:
        return None
    chunk = Chunk(0, n, {k: rows[c][:n] for k, c in mapping.items()}, broadcast)
    return Head(rows, execute_batch(plan, chunk, settings), n)


def _infer(batch: BatchResult, output: str) -> pa.DataType | None:
    return infer_type([None if v is MISSING else v for v in batch.outputs.get(output, [])])
