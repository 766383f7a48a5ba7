"""A dataset map, ready to run: ``DatasetJob`` (driver) and ``PartTask`` (what workers run).

``PartTask.run(part)`` is the whole life of one part on whichever machine runs it: read its
rows from the source, run them through the shared plan executor (``execute_batch``), turn
the results into Arrow columns of the output schema, write the part's Parquet file, and
return a ``PartReport`` -- counts, not rows -- to the driver.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ..batch import BatchResult, BatchSettings, Chunk, execute_batch
from ..context import worker_id
from ..events import Event
from ..plan import MISSING, Plan
from ..sinks.arrow_types import ValueTypeError, misfits, to_array
from ..sinks.parquet import ERROR_COLUMN, ROW_COLUMN, ParquetDataset
from .parts import Part
from .source import Source

__all__ = ["DatasetJob", "PartTask", "PartReport", "error_text", "run_parts"]


@dataclass
class PartReport:
    """What a finished part sends back to the driver."""

    index: int
    offset: int
    n: int
    failed: int = 0
    executed: int = 0
    hits: int = 0
    events: list[Event] = field(default_factory=list)
    worker: str = ""


def error_text(exc: BaseException) -> str:
    """The ``_hn_error`` cell of a failed item: ``node 'x': ValueError: message``."""
    node = getattr(exc, "hn_node", None)
    text = f"{type(exc).__name__}: {exc}"
    return f"node {node!r}: {text}" if node else text


@dataclass
class PartTask:
    """Everything every part of one dataset map shares (pickled once per map)."""

    plan: Plan
    mapping: dict[str, str]  # graph input -> source column
    keep: tuple[str, ...]
    broadcast: dict[str, Any]
    settings: BatchSettings
    schema: pa.Schema
    out: ParquetDataset

    @property
    def read_columns(self) -> list[str]:
        return list(dict.fromkeys([*self.mapping.values(), *self.keep]))

    def run(self, part: Part, step: int | None = None, writes: Any = None,
            data: dict[str, Any] | None = None) -> PartReport:
        """Compute and write one part (``step``: items per executor call; ``data``: rows
        already read, e.g. a Dask partition)."""
        data = part.read(self.read_columns) if data is None else data
        values = {name: _pylist(data[col]) for name, col in self.mapping.items()}
        report = PartReport(part.index, part.offset, part.n, worker=worker_id())
        wanted = [f.name for f in self.schema if f.name not in self.keep
                  and f.name not in (ROW_COLUMN, ERROR_COLUMN)]
        outputs: dict[str, list[Any]] = {name: [] for name in wanted}
        errors: dict[int, BaseException] = {}
        step = max(1, step or part.n)
        for a in range(0, part.n, step):
            b = min(a + step, part.n)
            chunk = Chunk(part.offset + a, b - a, {k: v[a:b] for k, v in values.items()},
                          self.broadcast)
            batch = execute_batch(self.plan, chunk, self.settings, writes)
            self._collect(batch, a, outputs, errors, report)
        table = self._table(part, data, outputs, errors)
        report.failed = len(errors)
        self.out.write_part(part.index, table)
        return report

    def _collect(self, batch: BatchResult, a: int, outputs: dict[str, list[Any]],
                 errors: dict[int, BaseException], report: PartReport) -> None:
        for name, col in outputs.items():
            got = batch.outputs.get(name)
            if got is None:
                col.extend([None] * batch.n)
            else:
                col.extend([None if v is MISSING else v for v in got])
        for i, exc in batch.errors.items():
            errors[a + i] = exc
        report.executed += batch.executed
        report.hits += batch.hits
        report.events.extend(batch.events)

    def _table(self, part: Part, data: dict[str, Any], outputs: dict[str, list[Any]],
               errors: dict[int, BaseException]) -> pa.Table:
        arrays: list[Any] = []
        for f in self.schema:
            if f.name in self.keep:
                arrays.append(_keep_array(f, data[f.name]))
            elif f.name == ROW_COLUMN:
                arrays.append(pa.array(range(part.offset, part.offset + part.n), pa.int64()))
            elif f.name == ERROR_COLUMN:
                arrays.append(None)  # filled last: converting outputs may fail items
            else:
                arrays.append(self._output_array(f, outputs[f.name], part, errors))
        texts = [None] * part.n
        for i, exc in errors.items():
            texts[i] = error_text(exc)
        arrays[self.schema.get_field_index(ERROR_COLUMN)] = pa.array(texts, pa.string())
        return pa.Table.from_arrays(arrays, schema=self.schema)

    def _output_array(self, f: pa.Field, values: list[Any], part: Part,
                      errors: dict[int, BaseException]) -> pa.Array:
        try:
            return to_array(f, values)
        except ValueTypeError:
            bad = misfits(f, values)
        node = self._producer(f.name)
        first = bad[0]
        problem = OutputTypeError(
            f"node {node!r}: output {f.name!r} of item {part.offset + first} is "
            f"{type(values[first]).__name__} {values[first]!r:.80}, which does not fit the "
            f"output column's Arrow type {f.type} (taken from the node's return annotation "
            "or the map's first items); annotate the node's return type (-> object stores "
            "any value pickled)")
        problem.hn_node = node  # type: ignore[attr-defined]
        problem.hn_item = part.offset + first  # type: ignore[attr-defined]
        if self.settings.on_error == "raise":
            raise problem
        for i in bad:
            values[i] = None
            errors.setdefault(i, problem)
        return to_array(f, values)

    def _producer(self, output: str) -> str:
        return ", ".join(self.plan.producers.get(output, (output,)))


class OutputTypeError(TypeError):
    """An output value that does not fit its column's Arrow type."""


def _pylist(values: Any) -> list[Any]:
    return values if isinstance(values, list) else values.to_pylist()


def _keep_array(f: pa.Field, values: Any) -> Any:
    if isinstance(values, list):
        return to_array(f, values)
    return values if values.type == f.type else values.cast(f.type)


@dataclass
class DatasetJob:
    """One dataset map in the driver: the source, the shared task, the parts to compute."""

    task: PartTask
    source: Source
    rows_per_part: int
    skip: frozenset[int] = frozenset()

    @property
    def plan(self) -> Plan:
        return self.task.plan

    @property
    def settings(self) -> BatchSettings:
        return self.task.settings

    @property
    def n(self) -> int | None:
        return self.source.n

    def pending(self) -> Iterator[Part]:
        """The parts without an output file, in order (streamed: a stream source is read
        as the parts are consumed)."""
        for part in self.source.parts(self.rows_per_part):
            if part.index not in self.skip:
                yield part


def run_parts(job: DatasetJob, report: Any, step: int | None = None,
              parts: Sequence[Part] | None = None) -> None:
    """Run parts one after another in this process (the local engine and the fallback of
    engines without a dataset pipeline of their own)."""
    from ..keys import batch_writes

    with batch_writes(job.settings.cache, None) as writes:
        for part in parts if parts is not None else job.pending():
            report(job.task.run(part, step, writes))
