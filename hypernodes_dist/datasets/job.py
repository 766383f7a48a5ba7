"""A dataset map, ready to run: ``DatasetJob`` (driver) and ``PartTask`` (what workers run).

``PartTask.run(part)`` is the whole life of one part on whichever machine runs it: read its
rows from the source, run them through the shared plan executor (``execute_batch``), turn
the results into Arrow columns of the output schema, write the part's Parquet file, and
return a ``PartReport`` -- counts, not rows -- to the driver.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from hypernodes_dist.cache.keys import batch_writes
from hypernodes_dist.datasets.parts import Part
from hypernodes_dist.datasets.source import Source
from hypernodes_dist.events import Event
from hypernodes_dist.execution.batch import execute_batch
from hypernodes_dist.execution.context import worker_id
from hypernodes_dist.execution.job import BatchResult, BatchSettings, Chunk
from hypernodes_dist.plan import MISSING, Plan
from hypernodes_dist.sinks.arrow_types import ValueTypeError, misfits, to_array
from hypernodes_dist.sinks.parquet import ERROR_COLUMN, ROW_COLUMN, ParquetDataset

__all__ = ["DatasetJob", "PartTask", "PartReport", "OutputTypeError", "error_text"]


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

    @property
    def computed_fields(self) -> list[pa.Field]:
        """The fields ``compute`` returns: the outputs, ``_hn_row``, ``_hn_error``."""
        return [f for f in self.schema if f.name not in self.keep]

    def run(self, part: Part, step: int | None = None, writes: Any = None,
            data: dict[str, Any] | None = None) -> PartReport:
        """Compute and write one part (``step``: items per executor call; ``data``: rows
        already read, e.g. a Dask partition)."""
        table, report = self.build(part, step, writes, data)
        self.out.write_part(part.index, table)
        return report

    def build(self, part: Part, step: int | None = None, writes: Any = None,
              data: dict[str, Any] | None = None) -> tuple[pa.Table, PartReport]:
        """One part's output table (read and computed, not written yet) and its report."""
        data = part.read(self.read_columns) if data is None else data
        values = {name: _pylist(data[col]) for name, col in self.mapping.items()}
        report = PartReport(part.index, part.offset, part.n, worker=worker_id())
        computed = self.compute(part.offset, part.n, values, report, step, writes)
        arrays = [_keep_array(f, data[f.name]) if f.name in self.keep else computed[f.name]
                  for f in self.schema]
        return pa.Table.from_arrays(arrays, schema=self.schema), report

    def compute(self, offset: int, n: int, values: dict[str, list[Any]], report: PartReport,
                step: int | None = None, writes: Any = None) -> dict[str, pa.Array]:
        """Items ``offset .. offset + n`` (mapped ``values``) through the plan: their output,
        ``_hn_row`` and ``_hn_error`` arrays; counts and events go to ``report``."""
        outputs: dict[str, list[Any]] = {
            f.name: [] for f in self.computed_fields if f.name not in (ROW_COLUMN, ERROR_COLUMN)}
        errors: dict[int, BaseException] = {}
        step = max(1, step or n)
        for a in range(0, n, step):
            b = min(a + step, n)
            chunk = Chunk(offset + a, b - a, {k: v[a:b] for k, v in values.items()},
                          self.broadcast)
            batch = execute_batch(self.plan, chunk, self.settings, writes)
            self._collect(batch, a, outputs, errors, report)
        arrays = {f.name: self._output_array(f, outputs[f.name], offset, errors)
                  for f in self.computed_fields if f.name in outputs}
        arrays[ROW_COLUMN] = pa.array(range(offset, offset + n), pa.int64())
        texts = [None] * n
        for i, exc in errors.items():
            texts[i] = error_text(exc)
        arrays[ERROR_COLUMN] = pa.array(texts, pa.string())
        report.failed += len(errors)
        return arrays

    def _collect(self, batch: BatchResult, a: int, outputs: dict[str, list[Any]],
                 errors: dict[int, BaseException], report: PartReport) -> None:
        for name, col in outputs.items():
            got = batch.outputs.get(name)
            if got is None:
                col.extend([None] * batch.n)
            elif got.count(MISSING):
                col.extend([None if v is MISSING else v for v in got])
            else:
                col.extend(got)
        for i, exc in batch.errors.items():
            errors[a + i] = exc
        report.executed += batch.executed
        report.hits += batch.hits
        report.events.extend(batch.events)

    def _output_array(self, f: pa.Field, values: list[Any], offset: int,
                      errors: dict[int, BaseException]) -> pa.Array:
        try:
            return to_array(f, values)
        except ValueTypeError:
            bad = misfits(f, values)
        node = self._producer(f.name)
        first = bad[0]
        problem = OutputTypeError(
            f"node {node!r}: output {f.name!r} of item {offset + first} is "
            f"{type(values[first]).__name__} {values[first]!r:.80}, which does not fit the "
            f"output column's Arrow type {f.type} (taken from the node's return annotation "
            "or the map's first items); annotate the node's return type (-> object stores "
            "any value pickled)")
        problem.hn_node = node  # type: ignore[attr-defined]
        problem.hn_item = offset + first  # type: ignore[attr-defined]
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


def _write(out: ParquetDataset, index: int, table: pa.Table, report: PartReport) -> PartReport:
    out.write_part(index, table)
    return report


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

    def run_here(self, report: Callable[[PartReport], None], step: int | None = None,
                 concurrency: int | None = None) -> None:
        """Run the pending parts one after another in this process, sharing one cache write
        buffer (the local engine, and engines without a dataset pipeline of their own);
        ``step`` items per executor call, at most ``concurrency`` async calls in flight.
        A helper thread writes each part's file while the next part is computed (pyarrow's
        writer releases the GIL), so at most two parts are held at once."""
        task = self.task
        if concurrency is not None and task.settings.concurrency is None:
            task = replace(task, settings=replace(task.settings, concurrency=concurrency))
        with batch_writes(self.settings.cache, None) as writes, \
                ThreadPoolExecutor(1, thread_name_prefix="hn-write") as writer:
            writing: Future[PartReport] | None = None
            for part in self.pending():
                table, done = task.build(part, step, writes)
                if writing is not None:
                    report(writing.result())
                writing = writer.submit(_write, task.out, part.index, table, done)
            if writing is not None:
                report(writing.result())

    def pending(self) -> Iterator[Part]:
        """The parts without an output file, in order (streamed: a stream source is read
        as the parts are consumed). For a source whose content is known only as it is read,
        each part's rows are checked against the digest recorded when its file was written
        (``ValueError`` if they changed) or recorded before it is computed."""
        out = self.task.out
        for part in self.source.parts(self.rows_per_part):
            digest = self.source.part_digest(part)
            if part.index in self.skip:
                if digest is not None:
                    _check_unchanged(out, part, digest)
                continue
            if digest is not None:
                out.write_input_digest(part.index, digest)
            yield part


def _check_unchanged(out: ParquetDataset, part: Part, digest: str) -> None:
    recorded = out.input_digest(part.index)
    if recorded is not None and recorded != digest:
        raise ValueError(
            f"the source changed since {out.location} was written: rows {part.offset}.."
            f"{part.offset + part.n - 1} (part {part.index}) differ from the rows its output "
            "file was computed from; pass overwrite=True to compute everything again, or "
            "write into a new directory")

