"""Dataset maps on Daft: Daft reads the source and runs the plan in a batch UDF that returns
Arrow columns; the core's part pipeline (``hypernodes_dist.datasets.commit``) sizes the
steps and writes the files, as on every engine.

A part (a row range; see ``hypernodes_dist.datasets``) is computed in steps, one Daft
query each::

    daft.read_parquet(the part's files, row_groups=...)      # or the part's rows
      -> row id (monotonically_increasing_id) -> the part's rows (collected once when
         the part takes several steps) -> keep the step's row range
      -> batch UDF: PartTask.compute -> struct of outputs, _hn_row, _hn_error (unnested)
      -> collect (in scan order: the rows stay in _hn_row order) -> Arrow table

and the pipeline writes a part's finished steps as one Parquet file every
``commit_seconds`` or at the part's end (a helper thread, while the next step computes),
so a killed map keeps every committed row and a rerun skips it. Steps grow with the rows
per second measured (one query per part for fast maps). Counts, events and a raised error
reach the driver through a mailbox (the native runner runs UDFs in threads of this
process). Other sources (a ``daft.DataFrame`` too: Daft streams it in order) are cut into
parts as they are read, and each step enters Daft with ``daft.from_pydict``. On the Ray
runner, each part is one Ray task running ``PartTask.run`` (``on_ray.py``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from typing import Any

import daft
import pyarrow as pa
from daft import DataType, Series, col, lit
from daft.functions import monotonically_increasing_id

from hypernodes_dist.datasets import DatasetJob, Part, PartReport, PartTask, run_parts
from hypernodes_dist.datasets.commit import Compute
from hypernodes_dist.datasets.source import ParquetSource
from hypernodes_dist.engines.kit import partition_size
from hypernodes_dist.execution.batching import fit_size
from hypernodes_dist.execution.context import worker_id
from hypernodes_dist.perprocess import Table
from hypernodes_dist.sinks.parquet import Committed, ParquetDataset

from .udf import apply_udf, consecutive_runs
from .uris import io_config

__all__ = ["run_dataset_native"]

ID = "__hn_id"
_MAIL: Table[str, list[Any]] = Table("daft.datasets.mail")  # a part's reports, by token


def run_dataset_native(job: DatasetJob, report: Callable[[PartReport], None],
                       batch_size: int | None) -> None:
    """Every pending part through the core's part pipeline, each step one Daft query,
    each file written by Daft (into a ``ParquetDataset``; another ``PartWriter`` writes
    its own)."""
    out = job.task.out
    writer = DaftWriter(out) if isinstance(out, ParquetDataset) else out
    run_parts(writer, job.task.commit_seconds, job.pending(),
              lambda part: _stepper(job, part, batch_size), report, stop=job.task.stop)


class DaftWriter:
    """The ``PartWriter`` of Daft's native runner: Daft writes each file (``write_parquet``
    to a temporary name in ``into=``); the ``ParquetDataset`` renames it into place and
    answers the rest."""

    def __init__(self, out: ParquetDataset) -> None:
        self.out = out
        self.location = out.location

    def committed(self) -> dict[int, Committed]:
        return self.out.committed()

    def write_part(self, index: int, table: pa.Table,
                   span: tuple[int, int] | None = None) -> str:
        tmp = self.out.temp_path(index)
        try:
            daft.from_arrow(table).write_parquet(self.out.uri_prefix + tmp, single_file=True,
                                                 io_config=io_config(self.out.location))
        except BaseException:
            self.out.remove(tmp)
            raise
        return self.out.place(tmp, index, span)

    def remove(self, path: str) -> None:
        self.out.remove(path)

    def write_input_digest(self, index: int, digest: str) -> None:
        self.out.write_input_digest(index, digest)

    def input_digest(self, index: int) -> str | None:
        return self.out.input_digest(index)


def _stepper(job: DatasetJob, part: Part, batch_size: int | None) -> Compute:
    """``compute(a, b)``: rows ``a .. b`` of ``part`` through one Daft query."""
    task, src = job.task, job.source
    files = part.files()
    if files is not None:  # Daft reads the part's rows once; the row id picks a step's
        assert isinstance(src, ParquetSource)  # only Parquet parts name files
        frame = daft.read_parquet([src.uri_prefix + p.path for p in files],
                                  row_groups=[list(p.row_groups) for p in files],
                                  io_config=io_config(src.where))
        first = files[0].skip
        whole = _with_id(frame.select(*task.read_columns))
        whole = whole.where((col(ID) >= lit(first)) & (col(ID) < lit(first + part.n)))
        held: list[daft.DataFrame] = []

        def rows(a: int, b: int) -> tuple[daft.DataFrame, int]:
            if a == 0 and b == part.n:  # one step: one streaming query
                return whole, -first
            if not held:  # several steps: read the part once
                held.append(whole.collect())
            return held[0].where((col(ID) >= lit(first + a)) & (col(ID) < lit(first + b))), -first
    else:
        data = part.read(task.read_columns)

        def rows(a: int, b: int) -> tuple[daft.DataFrame, int]:
            return _with_id(_from_columns({k: _slice(v, a, b) for k, v in data.items()})), a

    def compute(a: int, b: int) -> tuple[pa.Table, PartReport]:
        if a == b:
            return task.schema.empty_table(), PartReport(part.index, part.offset + a, 0)
        frame, shift = rows(a, b)
        return _compute(task, part, frame, part.offset + shift, b - a, batch_size)

    return compute


def _slice(values: Any, a: int, b: int) -> Any:
    return values[a:b] if isinstance(values, list) else values.slice(a, b - a)


def _with_id(frame: daft.DataFrame) -> daft.DataFrame:
    return frame.with_column(ID, monotonically_increasing_id())


def _from_columns(data: dict[str, Any]) -> daft.DataFrame:
    series: dict[str, Any] = {}
    for name, values in data.items():
        if isinstance(values, list):
            series[name] = Series.from_pylist(values, name, dtype=DataType.python())
        else:
            series[name] = Series.from_arrow(values, name)
    return daft.from_pydict(series)


def _compute(task: PartTask, part: Part, frame: daft.DataFrame, shift: int, n: int,
             batch_size: int | None) -> tuple[pa.Table, PartReport]:
    """``frame``'s rows (row id + ``shift``: their position in the source) computed, as a
    table of the output schema, collected in scan order (the rows stay in ``_hn_row``
    order), and their counts; a failed row under ``on_error="raise"`` raises here."""
    token = uuid.uuid4().hex
    with _MAIL.lock:
        _MAIL[token] = []
    names = list(task.mapping)
    size = fit_size(task.plan, batch_size or partition_size(n, _cpus(), 2))
    udf = daft.func.batch(
        return_dtype=DataType.from_arrow_type(pa.struct(task.computed_fields)), unnest=True,
        batch_size=size, use_process=False)(_make_udf(task, shift, names, token))
    columns = [col(task.mapping[name]) for name in names]
    computed_columns = apply_udf(udf, [col(ID), *columns], task.plan, task.broadcast)
    out = frame.select(*(col(k) for k in task.keep), computed_columns)
    try:
        table = out.to_arrow()
    finally:
        reports = _take(token)
    failure = [m for m in reports if isinstance(m, BaseException)]
    if failure:
        raise failure[0]
    total = PartReport(part.index, part.offset, 0, worker=worker_id())
    for r in reports:
        total.add(r)
    total.offset = min((r.offset for r in reports), default=part.offset)
    schema = task.schema
    return pa.Table.from_arrays([table.column(f.name).cast(f.type) for f in schema],
                                schema=schema), total


def _take(token: str) -> list[Any]:
    with _MAIL.lock:
        return _MAIL.pop(token, [])


def _make_udf(task: PartTask, shift: int, names: list[str], token: str) -> Callable[..., Any]:
    """The batch function: row ids + mapped columns -> struct of the computed columns."""
    fields = task.computed_fields

    def run_rows(ids: Series, *columns: Series) -> pa.Array:
        positions = ids.to_pylist()
        values = [c.to_pylist() for c in columns]
        struct = [pa.field(f.name, f.type) for f in fields]
        if not positions or _stopped(token):
            return _nulls(len(positions), struct)
        parts: list[dict[str, pa.Array]] = []
        try:
            for a, b in consecutive_runs(positions):
                offset = positions[a] + shift
                report = PartReport(-1, offset, b - a)
                parts.append(task.compute(offset, b - a,
                                          {k: v[a:b] for k, v in zip(names, values)}, report))
                _post(token, report)
        except Exception as exc:  # on_error="raise": the original error, for the driver;
            _post(token, exc)  # raising it inside Daft would log it and wrap it
            return _nulls(len(positions), struct)
        arrays = [pa.concat_arrays([p[f.name] for p in parts]) for f in fields]
        return pa.StructArray.from_arrays(arrays, fields=struct)

    return run_rows


def _stopped(token: str) -> bool:
    """A batch of this part failed: the others skip their work."""
    with _MAIL.lock:
        return any(isinstance(m, BaseException) for m in _MAIL.get(token, ()))


def _nulls(n: int, struct: list[pa.Field]) -> pa.Array:
    return pa.StructArray.from_arrays([pa.nulls(n, f.type) for f in struct], fields=struct)


def _post(token: str, message: Any) -> None:
    with _MAIL.lock:
        box = _MAIL.get(token)
        if box is not None:
            box.append(message)


def _cpus() -> int:
    return os.cpu_count() or 1
