"""A dataset map, ready to run: ``DatasetJob`` (driver) and ``PartTask`` (what workers run).

``PartTask.run(part)`` is the whole life of one part on whichever machine runs it: read its
rows from the source, run them in steps through the shared plan executor
(``execute_batch``), turn the results into Arrow columns of the output schema, and hand
them to the part pipeline (``commit.py``), which writes them into Parquet files by time;
it returns a ``PartReport`` -- counts, not rows -- to the driver.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from hypernodes_dist.cache.keys import batch_writes
from hypernodes_dist.datasets.commit import COMMIT_SECONDS, Compute, run_parts
from hypernodes_dist.datasets.parts import Part
from hypernodes_dist.datasets.report import PartReport
from hypernodes_dist.datasets.source import Source
from hypernodes_dist.datasets.stop import MapStop
from hypernodes_dist.errors import BudgetExceededError, WaitingForBatch
from hypernodes_dist.execution.batch import execute_batch
from hypernodes_dist.execution.context import worker_id
from hypernodes_dist.execution.job import BatchResult, BatchSettings, Chunk
from hypernodes_dist.missing import MISSING
from hypernodes_dist.plan import Plan
from hypernodes_dist.policies.usage import add_usage
from hypernodes_dist.sinks.arrow_types import ValueTypeError, misfits, to_array
from hypernodes_dist.sinks.base import PartWriter
from hypernodes_dist.sinks.parquet import ERROR_COLUMN, ROW_COLUMN, USAGE_COLUMN, Committed

if TYPE_CHECKING:
    from hypernodes_dist.datasets.schema import Head

__all__ = ["DatasetJob", "PartTask", "PartReport", "OutputTypeError", "error_text", "collecting"]

CALL_ROWS = 10_000  # items per executor call within a step (larger calls run slower)
WAITING = WaitingForBatch()  # a row waiting for a provider batch, among a step's errors


def collecting(settings: BatchSettings) -> BatchSettings:
    """The settings a step runs with: under ``"raise"`` too, every row of the step runs
    to its end (the calls paid for are kept), and ``PartTask._arrays`` stops the map at the
    step's failed rows (they are not written; the first is raised once all is written)."""
    if settings.on_error != "raise":
        return settings
    return replace(settings, on_error="collect")


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
    out: PartWriter
    commit_seconds: float = COMMIT_SECONDS
    stop: MapStop | None = None  # set when a row stops the map, or on Ctrl-C

    @property
    def collecting(self) -> BatchSettings:
        return collecting(self.settings)

    @property
    def read_columns(self) -> list[str]:
        return list(dict.fromkeys([*self.mapping.values(), *self.keep]))

    @property
    def computed_fields(self) -> list[pa.Field]:
        """The fields ``compute`` returns: the outputs, ``_hn_row``, ``_hn_error``."""
        return [f for f in self.schema if f.name not in self.keep]

    def run(self, part: Part, data: dict[str, Any] | None = None) -> PartReport:
        """Compute and write the rows ``part.start ..`` of one part (``data``: its rows
        already read, e.g. a Dask partition); the report of all its files."""
        total = PartReport(part.index, part.offset + part.start, 0, worker=worker_id())
        with batch_writes(self.settings.cache, None) as writes:
            run_parts(self.out, self.commit_seconds, [part],
                      lambda p: self.stepper(p, writes, data), total.add, stop=self.stop)
        return total

    def stepper(self, part: Part, writes: Any = None,
                data: dict[str, Any] | None = None) -> Compute:
        """``compute(a, b)``: rows ``a .. b`` of ``part`` as an output table and their
        report (the part's rows are read once, here)."""
        data = part.read(self.read_columns) if data is None else data
        return lambda a, b: self.build(part, data, a, b, writes)

    def build(self, part: Part, data: dict[str, Any], a: int, b: int,
              writes: Any = None) -> tuple[pa.Table, PartReport]:
        """Rows ``a .. b`` of ``part`` (``data``: all its rows) computed, as a table."""
        values = {name: _pylist(_slice(data[col], a, b)) for name, col in self.mapping.items()}
        report = PartReport(part.index, part.offset + a, b - a, worker=worker_id())
        computed = self.compute(part.offset + a, b - a, values, report, CALL_ROWS, writes)
        return self.table(computed, {k: _slice(data[k], a, b) for k in self.keep}), report

    def table(self, computed: dict[str, pa.Array], kept: dict[str, Any]) -> pa.Table:
        """The output table: ``kept`` source columns and ``computed`` columns."""
        arrays = [_keep_array(f, kept[f.name]) if f.name in self.keep else computed[f.name]
                  for f in self.schema]
        return pa.Table.from_arrays(arrays, schema=self.schema)

    def head_table(self, head: Head) -> tuple[pa.Table, PartReport]:
        """The rows computed in the driver to fix the output types (``schema.Head``, the
        source's first rows), as the first rows of part 0: never computed again."""
        report = PartReport(0, 0, head.n, worker=worker_id())
        outputs = self._output_lists()
        errors: dict[int, BaseException] = {}
        self._collect(head.batch, 0, outputs, errors, report)
        computed = self._arrays(outputs, errors, 0, head.n, report)
        return self.table(computed, {k: head.data[k][:head.n] for k in self.keep}), report

    def compute(self, offset: int, n: int, values: dict[str, list[Any]], report: PartReport,
                step: int | None = None, writes: Any = None) -> dict[str, pa.Array]:
        """Items ``offset .. offset + n`` (mapped ``values``) through the plan: their output,
        ``_hn_row`` and ``_hn_error`` arrays; counts and events go to ``report``."""
        outputs = self._output_lists()
        errors: dict[int, BaseException] = {}
        step = max(1, step or n)
        for a in range(0, n, step):
            b = min(a + step, n)
            chunk = Chunk(offset + a, b - a, {k: v[a:b] for k, v in values.items()},
                          self.broadcast)
            batch = execute_batch(self.plan, chunk, self.collecting, writes)
            self._collect(batch, a, outputs, errors, report)
        return self._arrays(outputs, errors, offset, n, report)

    def _output_lists(self) -> dict[str, list[Any]]:
        return {f.name: [] for f in self.computed_fields
                if f.name not in (ROW_COLUMN, ERROR_COLUMN)}

    def _arrays(self, outputs: dict[str, list[Any]], errors: dict[int, BaseException],
                offset: int, n: int, report: PartReport) -> dict[str, pa.Array]:
        arrays = {f.name: self._output_array(f, outputs[f.name], offset, errors)
                  for f in self.computed_fields if f.name in outputs}
        arrays[ROW_COLUMN] = pa.array(range(offset, offset + n), pa.int64())
        texts: list[str | None] = [None] * n
        waiting = [i for i, exc in errors.items() if exc is WAITING]
        for i in waiting:
            del errors[i]
        for i, exc in errors.items():
            texts[i] = error_text(exc)
        arrays[ERROR_COLUMN] = pa.array(texts, pa.string())
        # rows the budget refused, and under "raise" every failed row, are not done: they
        # are not written (``commit.run_part``) and the first of them stops the map
        raising = self.settings.on_error == "raise"
        skipped = sorted(i for i, exc in errors.items()
                         if raising or isinstance(exc, BudgetExceededError))
        if skipped:
            report.stopped_at, report.stop = offset + skipped[0], errors[skipped[0]]
        report.failed += len(errors) - len(skipped)
        if waiting:
            report.waiting += len(waiting)
            skipped = sorted(skipped + waiting)
        if skipped:
            report.skipped = [offset + i for i in skipped]
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
        for i in batch.waiting:  # not done, not failed: left out of the files, no stop
            errors[a + i] = WAITING
        metered = outputs.get(USAGE_COLUMN)
        if metered is not None:  # the row's usage: what its nodes' calls metered, summed
            for per_item in batch.usage.values():
                for i, used in per_item.items():
                    if i >= 0:
                        metered[a + i] = add_usage(dict(metered[a + i] or {}), used)
        report.executed += batch.executed
        report.hits += batch.hits
        report.events.extend(batch.events)
        for name, used in batch.usage_totals().items():
            add_usage(report.usage.setdefault(name, {}), used)

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
        problem.hn_node = node  # type: ignore[attr-defined]  # hn_* annotations go on any exception instance
        problem.hn_item = offset + first  # type: ignore[attr-defined]  # hn_* annotations go on any exception instance
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


def _slice(values: Any, a: int, b: int) -> Any:
    if a == 0 and b >= len(values):
        return values
    return values[a:b] if isinstance(values, list) else values.slice(a, b - a)


def _keep_array(f: pa.Field, values: Any) -> Any:
    if isinstance(values, list):
        return to_array(f, values)
    return values if values.type == f.type else values.cast(f.type)


@dataclass
class DatasetJob:
    """One dataset map in the driver: the source, the shared task, the parts to compute
    (``committed``: what the files in ``into=`` already hold, per part)."""

    task: PartTask
    source: Source
    rows_per_part: int
    committed: dict[int, Committed] = field(default_factory=dict)

    @property
    def plan(self) -> Plan:
        return self.task.plan

    @property
    def settings(self) -> BatchSettings:
        return self.task.settings

    @property
    def n(self) -> int | None:
        return self.source.n

    def run_here(self, report: Callable[[PartReport], None],
                 concurrency: int | None = None) -> None:
        """Run the pending parts one after another in this process through the part
        pipeline (``commit.py``), sharing one cache write buffer (the local engine, and
        engines without a dataset pipeline of their own); at most ``concurrency`` async
        calls in flight."""
        task = self.task
        if concurrency is not None and task.settings.concurrency is None:
            task = replace(task, settings=replace(task.settings, concurrency=concurrency))
        with batch_writes(self.settings.cache, None) as writes:
            run_parts(task.out, task.commit_seconds, self.pending(),
                      lambda p: task.stepper(p, writes), report, stop=task.stop)

    def resume(self, part: Part) -> Part | None:
        """``part`` without the rows already in files (its first rows, and ranges past a
        gap); ``None`` when all are."""
        found = self.committed.get(part.index)
        if found is None:
            return part
        if found.done(part.n):
            return None
        for path in found.stale:
            self.task.out.remove(path)
        return part.resumed(found.rows, found.past) if found.rows or found.past else part

    def pending(self) -> Iterator[Part]:
        """The parts with rows not in a file, in order, each from its first such row
        (streamed: a stream source is read as the parts are consumed). For a source whose
        content is known only as it is read, each part's rows are checked against the
        digest recorded when its first file was written (``ValueError`` if they changed)
        or recorded before it is computed."""
        out = self.task.out
        for part in self.source.parts(self.rows_per_part):
            digest = self.source.part_digest(part)
            if digest is not None:
                if part.index in self.committed:
                    _check_unchanged(out, part, digest)
                else:
                    out.write_input_digest(part.index, digest)
            todo = self.resume(part)
            if todo is not None:
                yield todo


def _check_unchanged(out: PartWriter, part: Part, digest: str) -> None:
    recorded = out.input_digest(part.index)
    if recorded is None:  # written before its digest (the rows fixing the types)
        out.write_input_digest(part.index, digest)
    elif recorded != digest:
        raise ValueError(
            f"the source changed since {out.location} was written: rows {part.offset}.."
            f"{part.offset + part.n - 1} (part {part.index}) differ from the rows its output "
            "files were computed from; pass overwrite=True to compute everything again, or "
            "write into a new directory")
