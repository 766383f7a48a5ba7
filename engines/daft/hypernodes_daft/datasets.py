"""Dataset maps on Daft: Daft reads the source, a batch UDF runs the plan and returns Arrow
columns, Daft writes the part's Parquet file.

One Daft query per part (a part is a row range; see ``hypernodes_dist.datasets``)::

    daft.read_parquet(the part's files, row_groups=...)      # or the Daft frame / rows
      -> row id (monotonically_increasing_id) -> keep the part's row range
      -> batch UDF: PartTask.compute -> struct of outputs, _hn_row, _hn_error (unnested)
      -> collect (in scan order: the rows stay in _hn_row order)
      -> write_parquet(temporary name, single_file=True) -> rename   (a helper thread,
         while the next part computes)

so a killed map keeps every finished part file and a rerun skips it. The UDF returns the
results as Arrow columns (never pickled payloads); counts, events and a raised error reach
the driver through a mailbox (the native runner runs UDFs in threads of this process).
Other sources (a ``daft.DataFrame`` too: Daft streams it in order) are cut into parts as
they are read, and each part enters Daft with ``daft.from_pydict``. On the Ray runner,
dataset maps run their parts in the driver (``Engine.execute_dataset``).
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import daft
import pyarrow as pa
from daft import DataType, Series, col
from daft.functions import monotonically_increasing_id

from hypernodes_dist.datasets import DatasetJob, Part, PartReport, PartTask
from hypernodes_dist.engines.kit import partition_size
from hypernodes_dist.execution.batching import fit_size
from hypernodes_dist.execution.context import worker_id

from .udf import apply_udf, consecutive_runs
from .uris import io_config

__all__ = ["run_dataset_native", "part_rows"]

ID = "__hn_id"
_MAIL: dict[str, list[Any]] = {}
_lock = threading.Lock()
_serial = itertools.count()


def part_rows(n: int | None, batch_size: int | None) -> int:
    """Rows per part (one Daft query each): a quarter of the rows, 10 000 .. 250 000 (a
    part's columns are held by Daft while it runs)."""
    if batch_size is not None:
        return batch_size
    if not n:
        return 250_000
    return max(10_000, min(250_000, math.ceil(n / 4)))


def run_dataset_native(job: DatasetJob, report: Callable[[PartReport], None],
                       batch_size: int | None) -> None:
    """Parts one after another; a part's file is written by a helper thread while the next
    part computes (the write is Daft's Rust code; the plan's Python calls hold the GIL)."""
    with ThreadPoolExecutor(1, thread_name_prefix="hn-daft-write") as writer:
        writing: Future[PartReport] | None = None
        for part, frame, first in _frames(job):
            computed, done = _compute_part(job.task, part, frame, first, batch_size)
            if writing is not None:
                report(writing.result())
            writing = writer.submit(_write_part, job.task, part, computed, done)
        if writing is not None:
            report(writing.result())


def _frames(job: DatasetJob) -> Iterator[tuple[Part, daft.DataFrame, int]]:
    """``(part, frame with the row id column, id of the part's first row)``."""
    src = job.source
    for part in job.pending():
        if src.kind == "parquet":
            pieces = part.reader.pieces
            paths = [src.uri_prefix + p.path for p in pieces]
            frame = daft.read_parquet(paths, row_groups=[list(p.row_groups) for p in pieces],
                                      io_config=io_config(src.where))
            frame = _with_id(frame.select(*job.task.read_columns))
            first = pieces[0].skip
            yield part, frame.where((col(ID) >= first) & (col(ID) < first + part.n)), first
        else:
            yield part, _with_id(_from_columns(part.read(job.task.read_columns))), 0


def _with_id(frame: daft.DataFrame) -> daft.DataFrame:
    return frame.with_column(ID, monotonically_increasing_id())


def _from_columns(data: dict[str, Any]) -> daft.DataFrame:
    series = {}
    for name, values in data.items():
        if isinstance(values, list):
            series[name] = Series.from_pylist(values, name, dtype=DataType.python())
        else:
            series[name] = Series.from_arrow(values, name)
    return daft.from_pydict(series)


def _compute_part(task: PartTask, part: Part, frame: daft.DataFrame, first: int,
                  batch_size: int | None) -> tuple[daft.DataFrame, PartReport]:
    """The part's output rows, collected (in scan order, so the row ids are the rows'
    positions: a write alone would not keep it, Daft's writers drop the order of what comes
    before them), and its counts; a failed row under ``on_error="raise"`` raises here."""
    token = f"{uuid.uuid4().hex}"
    with _lock:
        _MAIL[token] = []
    names = list(task.mapping)
    size = fit_size(task.plan, batch_size or partition_size(part.n, _cpus(), 2))
    udf = daft.func.batch(
        return_dtype=DataType.from_arrow_type(pa.struct(task.computed_fields)), unnest=True,
        batch_size=size, use_process=False)(_make_udf(task, part.offset - first, names, token))
    columns = [col(task.mapping[name]) for name in names]
    computed_columns = apply_udf(udf, [col(ID), *columns], task.plan, task.broadcast)
    out = frame.select(*(col(k) for k in task.keep), computed_columns)
    try:
        computed = out.collect()
    finally:
        reports = _take(token)
    failure = [m for m in reports if isinstance(m, BaseException)]
    if failure:
        raise failure[0]
    total = PartReport(part.index, part.offset, sum(r.n for r in reports), worker=worker_id())
    for r in reports:
        total.failed += r.failed
        total.executed += r.executed
        total.hits += r.hits
        total.events.extend(r.events)
    return computed, total


def _write_part(task: PartTask, part: Part, computed: daft.DataFrame,
                done: PartReport) -> PartReport:
    """Daft writes the part to a temporary name; the rename makes it appear complete."""
    tmp = task.out.temp_path(part.index)
    try:
        computed.write_parquet(task.out.uri_prefix + tmp, single_file=True,
                               io_config=io_config(task.out.location))
    except BaseException:
        task.out.remove(tmp)
        raise
    task.out.adopt(part.index, tmp)
    return done


def _take(token: str) -> list[Any]:
    with _lock:
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
    with _lock:
        return any(isinstance(m, BaseException) for m in _MAIL.get(token, ()))


def _nulls(n: int, struct: list[pa.Field]) -> pa.Array:
    return pa.StructArray.from_arrays([pa.nulls(n, f.type) for f in struct], fields=struct)


def _post(token: str, message: Any) -> None:
    with _lock:
        box = _MAIL.get(token)
        if box is not None:
            box.append(message)


def _cpus() -> int:
    return os.cpu_count() or 1
